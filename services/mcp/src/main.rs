//! `mcp`: the services as MCP tools. With no command it serves MCP over
//! stdio (what an MCP client's configuration starts); `mcp http` serves
//! streamable HTTP; `mcp journal` prints every tool call.
//!
//! Logs go to stderr: stdout is the protocol's.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mcp::{Gateway, McpConfig, calls::Calls, schema::Documents};

/// Retrysafe's tickets, payments and deployments as MCP tools. The server
/// holds the API key: MCP_API_KEY, or the sandbox's demo agent key of
/// --account (MCP_ACCOUNT; acme unless RETRYSAFE_SANDBOX=false).
/// Configuration: MCP_TICKETS_URL, MCP_PAYMENTS_URL, MCP_DEPLOYMENTS_URL,
/// MCP_JOURNAL (see docs/configuration.md).
#[derive(Debug, Parser)]
#[command(name = "mcp")]
struct Cli {
    /// The sandbox account whose demo agent key the server uses (acme, globex).
    #[arg(long, global = true)]
    account: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve MCP over stdin/stdout (what it does with no command).
    Stdio,
    /// Serve streamable HTTP at http://<MCP_ADDR>/mcp (127.0.0.1:7004);
    /// outside the sandbox its clients must present MCP_HTTP_TOKEN.
    Http,
    /// Print every tool call the journal holds, one JSON object a line.
    Journal,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    platform::telemetry::init_to_stderr();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("mcp: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let command = cli.command.unwrap_or(Command::Stdio);
    if let Command::Journal = command {
        // the file is all it needs: no key, no service
        let path = mcp::config::journal_path(&|name: &str| std::env::var(name).ok().filter(|v| !v.is_empty()))?;
        for call in Calls::open(agent::journal::open_file(&path).await?)
            .await?
            .all()
            .await?
        {
            println!("{}", serde_json::to_string(&call)?);
        }
        return Ok(());
    }
    // beside the sandbox, as the sandbox's own MCP server does: acme's demo key unless told otherwise
    let config = McpConfig::from_env(cli.account.as_deref(), true)?;
    match command {
        Command::Http => {
            let addr = platform::config::listen_addr("mcp", mcp::DEFAULT_PORT)?;
            let limits = platform::config::ConnectionLimits::from_env()?;
            let listener = platform::server::listen("mcp", "the MCP endpoint", addr).await?;
            mcp::serve_http(config, listener, limits, platform::shutdown_signal()).await
        }
        _ => {
            let documents = Documents::new(&config.environments);
            mcp::serve_stdio(Gateway::open(config).await?, &documents).await
        }
    }
}

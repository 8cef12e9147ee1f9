//! `agent`: run one operation by name against any Retrysafe service, show an
//! operation's status, or list the journal. The key of each named operation
//! lives in the journal file (`--journal`, `AGENT_JOURNAL`, default
//! `./.agent/journal.db`), so running the same name again — after a timeout,
//! a crash, a reboot — sends the same key.
//!
//! The operations are an account's (`--account`, `AGENT_ACCOUNT`): one file
//! may serve several, and none sees another's names or keys. Unnamed, the
//! account is the key's (a mark of `--token`, never the token), so a new
//! token starts an empty list: name the account to keep it across a rotation.
//!
//! `agent run` prints its report as one JSON object and exits 0 when the
//! operation is done (`created`, `replayed`, `matched_existing`), 2 when it
//! must not be retried (`conflict`, `failed`, or a payload changed under the
//! same name), and 3 when it is not known yet (`in_progress`,
//! `awaiting_approval`, `unknown`): run it again later, with the same name.
//! A `failed` that claimed nothing (a 400 for a bad body, with no operation
//! id) may be run again under the same name with the body fixed.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use agent::{Account, Agent, AgentConfig, AgentError, Journal, Outcome, Request};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "agent",
    about = "Runs operations by name with keys that survive retries and restarts"
)]
struct Cli {
    /// The journal file that keeps each operation's key.
    #[arg(long, env = "AGENT_JOURNAL", default_value = ".agent/journal.db", global = true)]
    journal: PathBuf,
    /// The bearer key sent to the services.
    #[arg(long, env = "AGENT_TOKEN", default_value = "demo-acme-agent", global = true)]
    token: String,
    /// Whose operations: an account's id (kept across a new token); unnamed, the token's.
    #[arg(long, env = "AGENT_ACCOUNT", global = true)]
    account: Option<String>,
    /// Seconds one request may take before its answer counts as lost.
    #[arg(long, default_value = "10", value_parser = seconds, global = true)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the operation NAME: a POST of DATA to URL + PATH, by the retry rule.
    Run {
        name: String,
        /// The service, e.g. http://127.0.0.1:7001
        #[arg(long)]
        url: String,
        /// e.g. /v1/tickets
        #[arg(long)]
        path: String,
        /// The JSON body, or @FILE.
        #[arg(long)]
        data: String,
        /// Seconds to follow work that goes on after its answer (a capture, a deployment).
        #[arg(long, default_value = "0", value_parser = seconds)]
        follow: Duration,
    },
    /// Shows an operation's status at a service, by the name the journal knows it by, or by its id.
    Status {
        #[arg(long)]
        url: String,
        /// An operation name from the journal.
        #[arg(long, conflicts_with = "operation")]
        name: Option<String>,
        /// An operation id, op_…
        #[arg(long)]
        operation: Option<String>,
    },
    /// Lists the account's journal: every operation, its key and what is known of it.
    Journal {
        /// Every attempt too, in order.
        #[arg(long)]
        attempts: bool,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("agent: {error}");
            ExitCode::from(match error {
                AgentError::ChangedPayload { .. }
                | AgentError::KeyOfAnotherOperation { .. }
                | AgentError::KnownUnderAnotherAccount { .. }
                | AgentError::Usage(_) => 2,
                _ => 1,
            })
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, AgentError> {
    let config = AgentConfig {
        request_timeout: cli.timeout.max(Duration::from_millis(100)),
        ..AgentConfig::default()
    };
    let account = Account::of(cli.account.as_deref(), &cli.token);
    let open = |config: AgentConfig| async {
        Agent::new(Journal::open(&cli.journal, account.clone()).await?, &cli.token, config)
    };
    match cli.command {
        Command::Run {
            name,
            url,
            path,
            data,
            follow,
        } => {
            let body = read_body(&data)?;
            let agent = open(AgentConfig {
                follow_for: follow,
                ..config
            })
            .await?;
            let report = agent.execute(&name, &Request::post(url, path, body)).await?;
            println!("{}", serde_json::to_string(&report).unwrap_or_default());
            Ok(ExitCode::from(match report.outcome {
                Outcome::Created | Outcome::Replayed | Outcome::MatchedExisting => 0,
                Outcome::Conflict | Outcome::Failed => 2,
                Outcome::InProgress | Outcome::AwaitingApproval | Outcome::Unknown => 3,
            }))
        }
        Command::Status { url, name, operation } => {
            let agent = open(config).await?;
            let status = match (name, operation) {
                (_, Some(operation)) => agent.status(&url, &operation).await?,
                (Some(name), None) => {
                    let entry = agent.journal().entry(&name).await?.ok_or_else(|| {
                        AgentError::Usage(format!("no operation `{name}` in the journal for {account}"))
                    })?;
                    match agent.status_by_key(&url, &entry.idempotency_key).await? {
                        Some(operation) => agent.status(&url, &operation.operation_id).await?,
                        None => serde_json::json!({"state": null, "note": "the service never claimed this key"}),
                    }
                }
                (None, None) => return Err(AgentError::Usage("name an operation: --name or --operation".into())),
            };
            println!("{status:#}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Journal { attempts } => {
            let agent = open(config).await?;
            for entry in agent.journal().entries().await? {
                println!(
                    "{:<24} {:<18} key {}  {}  {}",
                    entry.name,
                    entry.state.map_or("pending", Outcome::as_str),
                    entry.idempotency_key,
                    entry.operation_id.as_deref().unwrap_or("-"),
                    entry.target
                );
            }
            if attempts {
                for attempt in agent.journal().attempts(None).await? {
                    println!(
                        "  {} {:<24} {:<4} {:>3} {}",
                        attempt.at,
                        attempt.name,
                        attempt.action,
                        attempt.status.map_or("-".into(), |s| s.to_string()),
                        attempt.note
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A number of seconds from 0 to a hundred years: `inf` or `1e300` is a usage error, not a panic.
fn seconds(text: &str) -> Result<Duration, String> {
    // any clock adds a hundred years to now without overflowing
    const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);
    match text.trim().parse().map(Duration::try_from_secs_f64) {
        Ok(Ok(time)) if time <= LONGEST => Ok(time),
        _ => Err(format!("`{text}` is not a number of seconds from 0 to a hundred years")),
    }
}

fn read_body(data: &str) -> Result<serde_json::Value, AgentError> {
    let text = match data.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file).map_err(|e| AgentError::Usage(format!("{file}: {e}")))?,
        None => data.to_owned(),
    };
    serde_json::from_str(&text).map_err(|e| AgentError::Usage(format!("--data is not JSON: {e}")))
}

//! `cargo run`: the Retrysafe sandbox. Every service in one process, on an
//! embedded SQLite database (one file per service under `./.sandbox/`), with
//! the demo keys of docs/contract.md §12, the two simulated external systems,
//! the approval console, and the MCP server (§13). `DATABASE_URL=postgres://…`
//! moves every service to its own database on that server instead.

use std::{net::SocketAddr, time::Duration};

use clap::Parser;
use idempotency::IdempotencyConfig;
use platform::{
    auth::DEMO_KEYS,
    cli::NewKey,
    config::{ConnectionLimits, ServiceConfig},
    server::listen,
};
use sandbox::console::{self, ConsoleConfig, ServiceLink};
use tokio::sync::watch;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The Retrysafe sandbox: tickets (:7001), payments (:7002), deployments
/// (:7003), the approval console (:7000), the MCP server (:7004, /mcp), the
/// simulated payment provider
/// (:7101) and deployment controller (:7102), in one process, with the demo
/// keys. Data lives under RETRYSAFE_DATA_DIR (./.sandbox): a SQLite file per
/// service, and the simulators' state files. DATABASE_URL=postgres://… puts
/// the services on PostgreSQL; RETRYSAFE_BASE_PORT=8000 moves every port at
/// once (:8000 to :8102), <SERVICE>_ADDR one of them (TICKETS_ADDR,
/// PAYMENT_PROVIDER_ADDR, CONSOLE_ADDR, …). More API keys:
/// `sandbox create-api-key --service <service> <account> <principal> <role>`.
#[derive(Debug, Parser)]
#[command(name = "sandbox")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run the sandbox (what it does with no command).
    Serve,
    /// Store a new API key's hash in one service's database (the one the
    /// sandbox would use; made and migrated if it is new) and print the key,
    /// once. The key works beside the demo keys.
    CreateApiKey {
        /// The service whose database keeps the key.
        #[arg(long, value_enum)]
        service: Service,
        #[command(flatten)]
        key: NewKey,
    },
}

/// The services that keep API keys.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Service {
    Tickets,
    Payments,
    Deployments,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    // before telemetry: the key is all `create-api-key` prints on stdout
    if let Some(Command::CreateApiKey { service, key }) = Cli::parse().command {
        return create_api_key(service, key).await;
    }
    platform::telemetry::init();

    let idempotency = IdempotencyConfig::from_env()?;
    let tickets_policy = tickets::domain::TicketsPolicy::from_env()?;
    let mut tickets = ServiceConfig::from_env("tickets", tickets::DEFAULT_PORT, true)?;
    let mut payments = ServiceConfig::from_env("payments", payments::DEFAULT_PORT, true)?;
    let mut deployments = ServiceConfig::from_env("deployments", deployments::DEFAULT_PORT, true)?;
    // one cap for the process: every server in it draws on the same connections
    let limits = ConnectionLimits::from_env()?;
    // but the simulators stand in for other machines: a flood on the services'
    // ports must not take the outbox's way to them
    let elsewhere = ConnectionLimits::from_env()?;
    for service in [&mut tickets, &mut payments, &mut deployments] {
        service.limits = limits.clone();
    }
    let mut payments_settings = payments::Settings::from_env()?;
    let mut deployments_settings = deployments::Settings::from_env()?;
    let provider_addr = platform::config::listen_addr("payment_provider", payment_provider::DEFAULT_PORT)?;
    let controller_addr = platform::config::listen_addr("deploy_controller", deploy_controller::DEFAULT_PORT)?;
    let console_addr = platform::config::listen_addr("console", console::DEFAULT_PORT)?;
    let mcp_addr = platform::config::listen_addr("mcp", mcp::DEFAULT_PORT)?;
    let mut mcp_config = mcp::McpConfig::from_env(None, true)?;
    // the services call the sandbox's simulators wherever they listen, unless told otherwise
    if std::env::var_os("PAYMENTS_PROVIDER_URL").is_none() {
        payments_settings.provider.url = format!("http://{provider_addr}");
    }
    if std::env::var_os("DEPLOYMENTS_CONTROLLER_URL").is_none() {
        deployments_settings.controller.url = format!("http://{controller_addr}");
    }
    // the MCP server calls the sandbox's services wherever they listen, unless told otherwise
    for (variable, service, target) in [
        ("MCP_TICKETS_URL", &tickets, &mut mcp_config.tickets),
        ("MCP_PAYMENTS_URL", &payments, &mut mcp_config.payments),
        ("MCP_DEPLOYMENTS_URL", &deployments, &mut mcp_config.deployments),
    ] {
        if std::env::var_os(variable).is_none() {
            target.url = format!("http://{}", service.listen);
        }
    }
    std::fs::create_dir_all(platform::config::data_dir())?;
    // the provider's charges outlive the sandbox, as a real provider's would
    let provider = payment_provider::Provider::open(Some(platform::config::data_dir().join("payment-provider.json")))?;
    let controller = deploy_controller::Controller::open(deploy_controller::ControllerConfig {
        step: controller_step()?,
        state_file: Some(platform::config::data_dir().join("deploy-controller.json")),
        // it shares this process with every service: it never takes them down
        may_exit: false,
    })?;
    let console_config = ConsoleConfig {
        services: [&tickets, &payments, &deployments]
            .into_iter()
            .map(|service| ServiceLink {
                name: service.service.into(),
                url: format!("http://{}", service.listen),
            })
            .collect(),
        suggested_key: tickets.sandbox.then(|| "demo-acme-approver".to_owned()),
        session: console::SessionLimits::default(),
    };

    // every port first: a port in use stops the sandbox before anything starts
    let tickets_listener = platform::service::bind(None, &tickets).await?;
    let payments_listener = platform::service::bind(None, &payments).await?;
    let deployments_listener = platform::service::bind(None, &deployments).await?;
    let provider_listener = listen("payment_provider", "the simulated payment provider", provider_addr).await?;
    let controller_listener = listen(
        "deploy_controller",
        "the simulated deployment controller",
        controller_addr,
    )
    .await?;
    let console_listener = listen("console", "the approval console", console_addr).await?;
    let mcp_listener = listen("mcp", "the MCP endpoint", mcp_addr).await?;
    print_banner(
        &tickets,
        &payments,
        &deployments,
        console_addr,
        mcp_addr,
        provider_addr,
        controller_addr,
    );

    // One Ctrl-C stops every service; each lets its requests under way finish.
    let (stop, stopped) = watch::channel(false);
    let until_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let mut services = tokio::task::JoinSet::new();
    services.spawn(payment_provider::serve(
        provider_listener,
        provider,
        elsewhere.clone(),
        until_stopped(),
    ));
    services.spawn(deploy_controller::serve(
        controller_listener,
        controller,
        elsewhere,
        until_stopped(),
    ));
    services.spawn(console::serve(
        console_listener,
        console_config,
        limits.clone(),
        until_stopped(),
    ));
    services.spawn(mcp::serve_http(mcp_config, mcp_listener, limits, until_stopped()));
    services.spawn(tickets::serve(
        tickets,
        idempotency.clone(),
        tickets_policy,
        Some(tickets_listener),
        until_stopped(),
    ));
    services.spawn(payments::serve(
        payments,
        idempotency.clone(),
        payments_settings,
        Some(payments_listener),
        until_stopped(),
    ));
    services.spawn(deployments::serve(
        deployments,
        idempotency,
        deployments_settings,
        Some(deployments_listener),
        until_stopped(),
    ));

    tokio::select! {
        () = platform::shutdown_signal() => tracing::info!("stopping the sandbox"),
        // a service that stops on its own (its database went away, say) stops the sandbox
        Some(ended) = services.join_next() => {
            let _ = stop.send(true);
            return match ended? {
                Ok(()) => Err("a service stopped unexpectedly".into()),
                Err(e) => Err(e),
            };
        }
    }
    let _ = stop.send(true);
    while let Some(ended) = services.join_next().await {
        ended??;
    }
    Ok(())
}

/// `sandbox create-api-key --service <service> …`: the service's own
/// `create-api-key`, on the database the sandbox gives that service.
async fn create_api_key(service: Service, key: NewKey) -> Result<(), Error> {
    match service {
        Service::Tickets => {
            let config = ServiceConfig::from_env("tickets", tickets::DEFAULT_PORT, true)?;
            platform::cli::create_api_key(&config, tickets::migrate, key).await
        }
        Service::Payments => {
            let config = ServiceConfig::from_env("payments", payments::DEFAULT_PORT, true)?;
            platform::cli::create_api_key(&config, payments::migrate, key).await
        }
        Service::Deployments => {
            let config = ServiceConfig::from_env("deployments", deployments::DEFAULT_PORT, true)?;
            platform::cli::create_api_key(&config, deployments::migrate, key).await
        }
    }
}

/// `DEPLOY_CONTROLLER_STEP_MS`: how long each phase of a simulated rollout takes (2000).
fn controller_step() -> Result<Duration, String> {
    match std::env::var("DEPLOY_CONTROLLER_STEP_MS") {
        Ok(ms) => ms
            .trim()
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| format!("DEPLOY_CONTROLLER_STEP_MS `{ms}` is not a number of milliseconds")),
        Err(_) => Ok(deploy_controller::ControllerConfig::default().step),
    }
}

fn print_banner(
    tickets: &ServiceConfig,
    payments: &ServiceConfig,
    deployments: &ServiceConfig,
    console: SocketAddr,
    mcp: SocketAddr,
    provider: SocketAddr,
    controller: SocketAddr,
) {
    let backend = if tickets.database_url.starts_with("postgres") {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    println!();
    println!("Retrysafe sandbox ({backend})");
    for service in [tickets, payments, deployments] {
        println!(
            "  {:<11} http://{}   docs http://{}/docs",
            service.service, service.listen, service.listen
        );
    }
    println!("  approvals   http://{console}   (the approval console)");
    println!("  mcp         http://{mcp}/mcp   (the services as MCP tools, streamable HTTP)");
    println!("  provider    http://{provider}   (the simulated payment provider; faults: PUT /admin/faults)");
    println!("  controller  http://{controller}   (the simulated deployment controller; faults: PUT /admin/faults)");
    println!();
    println!("Demo API keys (sandbox only):");
    for key in DEMO_KEYS {
        println!(
            "  {:<22} account {:<7} role {}",
            key.key,
            key.account_id,
            key.role.as_str()
        );
    }
    println!();
    println!("Try:");
    println!(
        "  curl -i -X POST http://{}/v1/tickets -H 'Authorization: Bearer demo-acme-agent' \\\n    -H 'Content-Type: application/json' -H 'Idempotency-Key: 81b59b1a-9e75-4de7-a53b-1bb50969c83c' \\\n    -d '{{\"project\":\"ops\",\"title\":\"Rotate staging certificate\",\"priority\":\"high\"}}'",
        tickets.listen
    );
    println!();
    println!("Ctrl-C stops the sandbox.");
}

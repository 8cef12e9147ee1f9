//! `cargo run`: the Retrysafe sandbox. Every service in one process, on an
//! embedded SQLite database (one file per service under `./.sandbox/`), with
//! the demo keys of CONTRACT §12. `DATABASE_URL=postgres://…` moves every
//! service to its own database on that server instead.

use idempotency::IdempotencyConfig;
use platform::{auth::DEMO_KEYS, config::ServiceConfig};
use sandbox::console::{self, ConsoleConfig, ServiceLink};
use tokio::sync::watch;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    platform::telemetry::init();

    let idempotency = IdempotencyConfig::from_env()?;
    let tickets_policy = tickets::domain::TicketsPolicy::from_env()?;
    let tickets = ServiceConfig::from_env("tickets", tickets::DEFAULT_PORT, true)?;
    let payments = ServiceConfig::from_env("payments", payments::DEFAULT_PORT, true)?;
    let mut payments_settings = payments::Settings::from_env()?;

    // One Ctrl-C stops every service; each lets its requests under way finish.
    let (stop, stopped) = watch::channel(false);
    let until_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };

    let tickets_listener = tokio::net::TcpListener::bind(tickets.listen).await?;
    let payments_listener = tokio::net::TcpListener::bind(payments.listen).await?;
    let console_addr = platform::config::listen_addr("console", console::DEFAULT_PORT)?;
    let console_listener = tokio::net::TcpListener::bind(console_addr).await?;
    let console_config = ConsoleConfig {
        services: vec![
            ServiceLink {
                name: "tickets".into(),
                url: format!("http://{}", tickets.listen),
            },
            ServiceLink {
                name: "payments".into(),
                url: format!("http://{}", payments.listen),
            },
        ],
        suggested_key: tickets.sandbox.then(|| "demo-acme-approver".to_owned()),
    };
    let provider_addr = platform::config::listen_addr("payment_provider", payment_provider::DEFAULT_PORT)?;
    // payments charges through the sandbox's provider wherever it listens, unless told otherwise
    if std::env::var_os("PAYMENTS_PROVIDER_URL").is_none() {
        payments_settings.provider.url = format!("http://{provider_addr}");
    }
    let provider_listener = tokio::net::TcpListener::bind(provider_addr).await?;
    print_banner(&tickets, &payments, console_addr, provider_addr);
    let mut services = tokio::task::JoinSet::new();
    services.spawn(payment_provider::serve(
        provider_listener,
        payment_provider::Provider::default(),
        until_stopped(),
    ));
    services.spawn(console::serve(console_listener, console_config, until_stopped()));
    services.spawn(payments::serve(
        payments,
        idempotency.clone(),
        payments_settings,
        Some(payments_listener),
        until_stopped(),
    ));
    services.spawn(tickets::serve(
        tickets,
        idempotency,
        tickets_policy,
        Some(tickets_listener),
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

fn print_banner(
    tickets: &ServiceConfig,
    payments: &ServiceConfig,
    console: std::net::SocketAddr,
    provider: std::net::SocketAddr,
) {
    let backend = if tickets.database_url.starts_with("postgres") {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    println!();
    println!("Retrysafe sandbox ({backend})");
    println!(
        "  tickets   http://{}   docs http://{}/docs",
        tickets.listen, tickets.listen
    );
    println!(
        "  payments  http://{}   docs http://{}/docs",
        payments.listen, payments.listen
    );
    println!("  approvals http://{console}   (the approval console)");
    println!("  provider  http://{provider}   (the simulated payment provider; faults: PUT /admin/faults)");
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

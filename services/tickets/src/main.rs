//! `cargo run -p tickets`: the tickets service alone.
//!
//! `tickets` serves (configuration from the environment: see `platform::config`);
//! `tickets create-api-key <account> <principal> <role>` stores a new key's
//! hash and prints the key once. The audit journal is exported and verified
//! by the `audit` tool of the journal crate (`cargo run -p journal
//! --bin audit -- verify --service tickets`).

use idempotency::IdempotencyConfig;
use platform::{
    cli::{ServiceCli, ServiceCommand},
    config::ServiceConfig,
};

const ABOUT: &str = "The Retrysafe tickets service. Configured from the environment: \
TICKETS_ADDR (127.0.0.1:7001), TICKETS_DATABASE_URL or DATABASE_URL (else SQLite under \
RETRYSAFE_DATA_DIR, ./.sandbox), RETRYSAFE_SANDBOX=true for the demo keys; docs/configuration.md lists the rest.";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let command = ServiceCli::parse_for("tickets", ABOUT);
    let config = ServiceConfig::from_env("tickets", tickets::DEFAULT_PORT, false)?;
    match command {
        ServiceCommand::Serve => {
            // only when serving: the key is all `create-api-key` prints on stdout
            platform::telemetry::init();
            let idempotency = IdempotencyConfig::from_env()?;
            let policy = tickets::domain::TicketsPolicy::from_env()?;
            tickets::serve(config, idempotency, policy, None, platform::shutdown_signal()).await
        }
        ServiceCommand::CreateApiKey(key) => platform::cli::create_api_key(&config, tickets::migrate, key).await,
    }
}

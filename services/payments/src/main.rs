//! `cargo run -p payments`: the payments service alone (configuration from
//! the environment: see `platform::config` and [`payments::Settings`]);
//! `payments create-api-key <account> <principal> <role>` stores a new key's
//! hash and prints the key once.

use idempotency::IdempotencyConfig;
use platform::{
    cli::{ServiceCli, ServiceCommand},
    config::ServiceConfig,
};

const ABOUT: &str = "The Retrysafe payments service. Configured from the environment: \
PAYMENTS_ADDR (127.0.0.1:7002), PAYMENTS_DATABASE_URL or DATABASE_URL (else SQLite under \
RETRYSAFE_DATA_DIR, ./.sandbox), PAYMENTS_PROVIDER_URL and PAYMENTS_PROVIDER_KEY, \
PAYMENTS_CAPTURE_THRESHOLDS, RETRYSAFE_SANDBOX=true for the demo keys; docs/configuration.md lists the rest.";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let command = ServiceCli::parse_for("payments", ABOUT);
    let config = ServiceConfig::from_env("payments", payments::DEFAULT_PORT, false)?;
    match command {
        ServiceCommand::Serve => {
            // only when serving: the key is all `create-api-key` prints on stdout
            platform::telemetry::init();
            let idempotency = IdempotencyConfig::from_env()?;
            let settings = payments::Settings::from_env()?;
            payments::serve(config, idempotency, settings, None, platform::shutdown_signal()).await
        }
        ServiceCommand::CreateApiKey(key) => platform::cli::create_api_key(&config, payments::migrate, key).await,
    }
}

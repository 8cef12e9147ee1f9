//! `cargo run -p deployments`: the deployments service alone (configuration
//! from the environment: see `platform::config` and [`deployments::Settings`]),
//! with `cargo run -p deploy-controller` beside it;
//! `deployments create-api-key <account> <principal> <role>` stores a new
//! key's hash and prints the key once.

use idempotency::IdempotencyConfig;
use platform::{
    cli::{ServiceCli, ServiceCommand},
    config::ServiceConfig,
};

const ABOUT: &str = "The Retrysafe deployments service. Configured from the environment: \
DEPLOYMENTS_ADDR (127.0.0.1:7003), DEPLOYMENTS_DATABASE_URL or DATABASE_URL (else SQLite under \
RETRYSAFE_DATA_DIR, ./.sandbox), DEPLOYMENTS_CONTROLLER_URL and DEPLOYMENTS_CONTROLLER_KEY, \
DEPLOYMENTS_ENVIRONMENTS (development,staging,production) and DEPLOYMENTS_APPROVAL_ENVIRONMENTS \
(production), RETRYSAFE_SANDBOX=true for the demo keys; docs/configuration.md lists the rest.";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let command = ServiceCli::parse_for("deployments", ABOUT);
    let config = ServiceConfig::from_env("deployments", deployments::DEFAULT_PORT, false)?;
    match command {
        ServiceCommand::Serve => {
            // only when serving: the key is all `create-api-key` prints on stdout
            platform::telemetry::init();
            let idempotency = IdempotencyConfig::from_env()?;
            let settings = deployments::Settings::from_env()?;
            deployments::serve(config, idempotency, settings, None, platform::shutdown_signal()).await
        }
        ServiceCommand::CreateApiKey(key) => platform::cli::create_api_key(&config, deployments::migrate, key).await,
    }
}

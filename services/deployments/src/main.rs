//! `cargo run -p deployments`: the deployments service alone (configuration
//! from the environment: see `platform::config` and [`deployments::Settings`]),
//! with `cargo run -p deploy-controller` beside it.

use idempotency::IdempotencyConfig;
use platform::config::ServiceConfig;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    platform::telemetry::init();
    let config = ServiceConfig::from_env("deployments", deployments::DEFAULT_PORT, false)?;
    let idempotency = IdempotencyConfig::from_env()?;
    let settings = deployments::Settings::from_env()?;
    deployments::serve(config, idempotency, settings, None, platform::shutdown_signal()).await
}

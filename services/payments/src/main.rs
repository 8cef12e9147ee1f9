//! `cargo run -p payments`: the payments service alone (configuration from
//! the environment: see `platform::config`).

use idempotency::IdempotencyConfig;
use platform::config::ServiceConfig;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    platform::telemetry::init();
    let config = ServiceConfig::from_env("payments", payments::DEFAULT_PORT, false)?;
    let idempotency = IdempotencyConfig::from_env()?;
    let settings = payments::Settings::from_env()?;
    payments::serve(config, idempotency, settings, None, platform::shutdown_signal()).await
}

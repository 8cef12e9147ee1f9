//! `cargo run -p deploy-controller`: the simulated deployment controller
//! alone, on `DEPLOY_CONTROLLER_ADDR` (default `127.0.0.1:7102`), each
//! rollout phase taking `DEPLOY_CONTROLLER_STEP_MS` (2000), its state kept in
//! `DEPLOY_CONTROLLER_STATE` if set. Alone, it may crash (the
//! `crash_next_rollout` fault).

use std::time::Duration;

use deploy_controller::{Controller, ControllerConfig, DEFAULT_PORT};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    platform::telemetry::init();
    let addr = platform::config::listen_addr("deploy_controller", DEFAULT_PORT)?;
    let config = ControllerConfig {
        step: step_from_env()?,
        state_file: std::env::var_os("DEPLOY_CONTROLLER_STATE").map(Into::into),
        may_exit: true,
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    deploy_controller::serve(listener, Controller::open(config)?, platform::shutdown_signal()).await
}

fn step_from_env() -> Result<Duration, String> {
    match std::env::var("DEPLOY_CONTROLLER_STEP_MS") {
        Ok(ms) => ms
            .trim()
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| format!("DEPLOY_CONTROLLER_STEP_MS `{ms}` is not a number of milliseconds")),
        Err(_) => Ok(ControllerConfig::default().step),
    }
}

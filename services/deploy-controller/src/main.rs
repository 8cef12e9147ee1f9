//! `cargo run -p deploy-controller`: the simulated deployment controller
//! alone, on `DEPLOY_CONTROLLER_ADDR` (default `127.0.0.1:7102`), each
//! rollout phase taking `DEPLOY_CONTROLLER_STEP_MS` (2000), its state kept in
//! `DEPLOY_CONTROLLER_STATE` if set. Alone, it may crash (the
//! `crash_next_rollout` fault).

use std::{path::PathBuf, time::Duration};

use clap::Parser;
use deploy_controller::{Controller, ControllerConfig, DEFAULT_PORT};

/// The simulated deployment controller: rollouts that take time, with
/// idempotency keys of its own and faults switchable with `PUT /admin/faults`
/// (alone, `crash_next_rollout` exits the process). Listens on
/// DEPLOY_CONTROLLER_ADDR (127.0.0.1:7102).
#[derive(Debug, Parser)]
#[command(name = "deploy-controller")]
struct Cli {
    /// How long each phase of a rollout (queued, then running) takes.
    #[arg(long, env = "DEPLOY_CONTROLLER_STEP_MS", value_name = "MS", default_value_t = 2000)]
    step_ms: u64,
    /// Keep rollouts, idempotency keys and counts in this JSON file, so that
    /// they survive a restart. Without it the controller forgets them when it stops.
    #[arg(long, env = "DEPLOY_CONTROLLER_STATE", value_name = "FILE")]
    state_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let cli = Cli::parse();
    platform::telemetry::init();
    let addr = platform::config::listen_addr("deploy_controller", DEFAULT_PORT)?;
    let config = ControllerConfig {
        step: Duration::from_millis(cli.step_ms),
        state_file: cli.state_file,
        may_exit: true,
    };
    let limits = platform::config::ConnectionLimits::from_env()?;
    let listener = platform::server::listen("deploy_controller", "the simulated deployment controller", addr).await?;
    deploy_controller::serve(listener, Controller::open(config)?, limits, platform::shutdown_signal()).await
}

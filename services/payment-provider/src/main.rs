//! `cargo run -p payment-provider`: the simulated payment provider alone, on
//! `PAYMENT_PROVIDER_ADDR` (default `127.0.0.1:7101`), its state kept in
//! `--state-file` (`PAYMENT_PROVIDER_STATE`) if given.

use std::path::PathBuf;

use clap::Parser;
use payment_provider::{DEFAULT_PORT, Provider};

/// The simulated payment provider: charges and refunds with idempotency keys
/// of its own, lookups by key and merchant reference, faults switchable with
/// `PUT /admin/faults`. Listens on PAYMENT_PROVIDER_ADDR (127.0.0.1:7101).
#[derive(Debug, Parser)]
#[command(name = "payment-provider")]
struct Cli {
    /// Keep charges, refunds, idempotency keys and counts in this JSON file,
    /// so that they survive a restart. Without it the provider keeps them in
    /// memory only and forgets them when it stops. Faults are never kept.
    #[arg(long, env = "PAYMENT_PROVIDER_STATE", value_name = "FILE")]
    state_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let cli = Cli::parse();
    platform::telemetry::init();
    let addr = platform::config::listen_addr("payment_provider", DEFAULT_PORT)?;
    let provider = Provider::open(cli.state_file)?;
    let limits = platform::config::ConnectionLimits::from_env()?;
    let listener = platform::server::listen("payment_provider", "the simulated payment provider", addr).await?;
    payment_provider::serve(listener, provider, limits, platform::shutdown_signal()).await
}

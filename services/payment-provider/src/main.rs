//! `cargo run -p payment-provider`: the simulated payment provider alone, on
//! `PAYMENT_PROVIDER_ADDR` (default `127.0.0.1:7101`).

use payment_provider::{DEFAULT_PORT, Provider};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    platform::telemetry::init();
    let addr = platform::config::listen_addr("payment_provider", DEFAULT_PORT)?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    payment_provider::serve(listener, Provider::default(), platform::shutdown_signal()).await
}

//! `cargo run -p adopt`: the notes app on `ADOPT_ADDR` (127.0.0.1:7010), its
//! data in `ADOPT_DATABASE_URL` (sqlite:adopt.db). The idempotency layer reads
//! its own settings (`RETRYSAFE_CLAIM`, `RETRYSAFE_LEASE_SECONDS`, …) from the
//! environment: docs/configuration.md.

use idempotency::{
    Idempotency, IdempotencyConfig,
    platform::{Authenticator, Db, shutdown_signal},
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let addr = std::env::var("ADOPT_ADDR").unwrap_or_else(|_| "127.0.0.1:7010".into());
    let url = std::env::var("ADOPT_DATABASE_URL").unwrap_or_else(|_| "sqlite:adopt.db".into());
    let db = Db::connect(&url, 4).await?;
    adopt::migrate(&db).await?;
    let idempotency = Idempotency::new(db.clone(), IdempotencyConfig::from_env()?);
    // the retention reaper, above all: finished operations are removed after 24 h
    let background = idempotency.spawn_background();
    // the sandbox's demo keys (`demo-acme-agent`); a real app brings its own auth
    let auth = Authenticator::new(db, true);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("adopt listening on http://{}", listener.local_addr()?);
    axum::serve(listener, adopt::router(adopt::App { idempotency, auth }))
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    background.stop().await;
    Ok(())
}

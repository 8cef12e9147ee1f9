//! What every Retrysafe service shares below the idempotency layer.
//!
//! - [`db`]: the seam between services and their two backends (`Db`, `Tx`).
//! - [`error`]: the one problem+json error type.
//! - [`auth`]: bearer API keys → account, principal, role.
//! - [`json`]: validated JSON bodies.
//! - [`openapi`]: what every operation's OpenAPI entry answers by construction.
//! - [`path`]: ids put into another system's URLs, as data.
//! - [`time`]: the timestamp type of responses and both databases.
//! - [`config`], [`telemetry`]: environment configuration and structured logs.
//! - [`cli`]: the command line every binary shares (`--help`, `create-api-key`).
//! - [`simulated`]: what the simulated external systems share.

pub mod auth;
pub mod cli;
pub mod config;
pub mod db;
pub mod error;
pub mod json;
pub mod metrics;
pub mod openapi;
pub mod page;
pub mod path;
pub mod service;
pub mod simulated;
pub mod telemetry;
pub mod time;

#[cfg(feature = "testing")]
pub mod testing;

pub use auth::{Authenticator, Principal, Role};
pub use db::{Backend, Db, Migrations, Pool, Tx};
pub use error::{ApiError, FieldError};
pub use json::{ApiJson, ApiPath, ApiQuery};
pub use time::Timestamp;

/// The platform's own tables (`api_keys`), applied by every service.
pub static MIGRATIONS: Migrations = Migrations {
    postgres: sqlx::migrate!("../../migrations/platform/postgres"),
    sqlite: sqlx::migrate!("../../migrations/platform/sqlite"),
};

/// Makes the directory a `sqlite://` URL points into, so a fresh checkout's
/// first `cargo run` can create `./.sandbox/tickets.db`.
pub fn prepare_sqlite_dir(url: &str) -> std::io::Result<()> {
    let Some(path) = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) else {
        return Ok(());
    };
    let path = path.split('?').next().unwrap_or(path);
    match std::path::Path::new(path).parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(dir),
        _ => Ok(()),
    }
}

/// Resolves when the process is asked to stop (Ctrl-C or SIGTERM).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// How long a stopping service waits for the requests under way.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` resolves, then lets the
/// requests under way finish for up to [`SHUTDOWN_GRACE`]. A request still
/// running after that is dropped: its transaction never commits, and its
/// claim is taken over by a retry once the lease runs out.
///
/// Every connection is held to `limits`: headers late or too large close it
/// (hyper answers 431 itself, with an empty body), and a body that does not
/// arrive in time fails to read, which [`ApiJson`] answers with 408.
pub async fn serve(
    mut listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: config::ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::{
        rt::{TokioIo, TokioTimer},
        server::graceful::GracefulShutdown,
        service::TowerToHyperService,
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes);
    let service = TowerToHyperService::new(tower_http::timeout::RequestBodyDeadline::new(
        router,
        limits.body_timeout,
    ));
    let connections = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            // axum's accept logs and retries failures (out of file descriptors)
            (stream, _) = axum::serve::Listener::accept(&mut listener) => {
                let connection = connections.watch(http.serve_connection(TokioIo::new(stream), service.clone()));
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(%error, "connection closed");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tokio::select! {
        () = connections.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {
            tracing::warn!("requests still running after the grace period were dropped");
        }
    }
    Ok(())
}

//! What every Retrysafe service shares below the idempotency layer.
//!
//! - [`db`]: the seam between services and their two backends (`Db`, `Tx`).
//! - [`error`]: the one problem+json error type.
//! - [`auth`]: bearer API keys → account, principal, role.
//! - [`json`]: validated JSON bodies.
//! - [`page`], [`rows`]: cursor pages, and reading one account's rows by id or by page.
//! - [`openapi`]: what every operation's OpenAPI entry answers by construction.
//! - [`path`]: ids put into another system's URLs, as data.
//! - [`time`]: the timestamp type of responses and both databases.
//! - `health`: `GET /healthz`, one probe of the database at a time.
//! - [`server`]: the one server loop every server runs, and what bounds a client.
//! - [`config`], [`telemetry`]: environment configuration and structured logs.
//! - [`fail_point`]: where a crash test stops a process dead.
//! - [`cli`]: the command line every binary shares (`--help`, `create-api-key`).
//! - [`simulated`]: what the simulated external systems share.

pub mod auth;
pub mod cli;
pub mod config;
pub mod db;
pub mod error;
pub mod fail_point;
mod health;
pub mod json;
pub mod metrics;
pub mod openapi;
pub mod page;
pub mod path;
pub mod problems;
pub mod rows;
pub mod server;
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
pub use server::{SHUTDOWN_GRACE, serve, shutdown_signal};
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

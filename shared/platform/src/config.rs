//! Configuration from the environment, the same way for every service.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `<SERVICE>_ADDR` | listen address, e.g. `TICKETS_ADDR=127.0.0.1:7001` | the service's sandbox port |
//! | `RETRYSAFE_BASE_PORT` | moves every sandbox port at once: each keeps its distance from 7000 (`8000`: console :8000, tickets :8001, … controller :8102) | `7000` |
//! | `<SERVICE>_DATABASE_URL` | this service's database, used as given | — |
//! | `DATABASE_URL` | a PostgreSQL URL; each service uses its own database `<name>_<service>` on that server | — |
//! | `RETRYSAFE_DATA_DIR` | where the SQLite files live | `./.sandbox` |
//! | `RETRYSAFE_SANDBOX` | `true` turns on the demo keys | `false` (`true` under `cargo run`) |
//! | `RETRYSAFE_HEADER_TIMEOUT_SECONDS` | a connection whose request headers take longer is closed | `10` |
//! | `RETRYSAFE_BODY_TIMEOUT_SECONDS` | a request body that takes longer after its headers is answered 408 | `10` |
//! | `RETRYSAFE_WRITE_TIMEOUT_SECONDS` | a connection whose answer the client does not read for this long is closed | `10` |
//! | `RETRYSAFE_MAX_CONNECTIONS` | the connections the process holds open at once, across all its servers; past it, 503 | `512` |
//! | `LOG_FORMAT` | `text` or `json` | `text` |

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The service's name: `tickets`, `payments`, `deployments`.
    pub service: &'static str,
    pub listen: SocketAddr,
    pub database_url: String,
    /// Sandbox mode: the demo keys of docs/contract.md §12 exist.
    pub sandbox: bool,
    pub max_connections: u32,
    pub limits: ConnectionLimits,
}

/// What one client may hold of a server (docs/contract.md §1, §14): a slow
/// or idle client costs a socket for a bounded time, never a worker, and
/// all clients together hold at most [`ConnectionCap`] sockets.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// A connection whose request headers are not complete within this is
    /// closed; so is a kept-alive connection idle for this long.
    pub header_timeout: Duration,
    /// Request headers (with the request line) larger than this → 431.
    pub max_header_bytes: usize,
    /// A request body not all received within this of its headers → 408.
    pub body_timeout: Duration,
    /// A connection whose answer makes no progress for this long (the client
    /// reads none of it) is closed.
    pub write_timeout: Duration,
    /// The connections open at once. Shared by every server given the same
    /// cap: a process makes one and hands it to each server it runs.
    pub connections: ConnectionCap,
}

/// The default of `RETRYSAFE_MAX_CONNECTIONS`: under the common default limit
/// of 1024 open files, with room for what the process opens itself (its
/// database pools, its calls to other services, its files).
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout: Duration::from_secs(10),
            max_header_bytes: 32 * 1024,
            body_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            connections: ConnectionCap::new(DEFAULT_MAX_CONNECTIONS),
        }
    }
}

impl ConnectionLimits {
    /// The defaults, with `RETRYSAFE_HEADER_TIMEOUT_SECONDS`,
    /// `RETRYSAFE_BODY_TIMEOUT_SECONDS`, `RETRYSAFE_WRITE_TIMEOUT_SECONDS` and
    /// `RETRYSAFE_MAX_CONNECTIONS` applied, and a new cap: call it once per
    /// process and give every server the result (or a clone of it).
    pub fn from_env() -> Result<Self, ConfigError> {
        let defaults = ConnectionLimits::default();
        let max_connections = match env("RETRYSAFE_MAX_CONNECTIONS") {
            Some(v) => match v.parse::<usize>() {
                Ok(max) if (1..=ConnectionCap::MAX).contains(&max) => max,
                _ => {
                    return Err(ConfigError(format!(
                        "RETRYSAFE_MAX_CONNECTIONS `{v}` is not a whole number from 1 to {}",
                        ConnectionCap::MAX
                    )));
                }
            },
            None => DEFAULT_MAX_CONNECTIONS,
        };
        Ok(ConnectionLimits {
            header_timeout: seconds("RETRYSAFE_HEADER_TIMEOUT_SECONDS")?.unwrap_or(defaults.header_timeout),
            body_timeout: seconds("RETRYSAFE_BODY_TIMEOUT_SECONDS")?.unwrap_or(defaults.body_timeout),
            write_timeout: seconds("RETRYSAFE_WRITE_TIMEOUT_SECONDS")?.unwrap_or(defaults.write_timeout),
            connections: ConnectionCap::new(max_connections),
            ..defaults
        })
    }
}

fn seconds(name: &str) -> Result<Option<Duration>, ConfigError> {
    env(name)
        .map(|v| match v.parse::<u64>() {
            Ok(seconds) if seconds > 0 => Ok(Duration::from_secs(seconds)),
            _ => Err(ConfigError(format!(
                "{name} `{v}` is not a whole number of seconds above 0"
            ))),
        })
        .transpose()
}

/// The positive number in the environment variable `name`: `None` when it is
/// unset or blank, an error for anything else, 0 included. How the idempotency
/// layer and its extensions read their settings.
pub fn number(name: &str) -> Result<Option<f64>, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<f64>() {
            Ok(n) if n.is_finite() && n > 0.0 => Ok(Some(n)),
            _ => Err(format!("{name} `{v}` is not a positive number")),
        },
        _ => Ok(None),
    }
}

/// The longest time a setting may name: any clock can add it to now without overflowing.
pub const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// [`number`] `unit`s as a duration, at most [`LONGEST`]: an error, never a panic.
pub fn duration(name: &str, unit: Duration) -> Result<Option<Duration>, String> {
    let Some(n) = number(name)? else { return Ok(None) };
    match Duration::try_from_secs_f64(n * unit.as_secs_f64()) {
        Ok(time) if time <= LONGEST => Ok(Some(time)),
        _ => Err(format!("{name} `{n}` is longer than a hundred years")),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

impl ServiceConfig {
    pub fn from_env(service: &'static str, default_port: u16, sandbox_default: bool) -> Result<Self, ConfigError> {
        let upper = service.to_ascii_uppercase();
        let listen = listen_addr(service, default_port)?;
        let database_url = database_url_for(
            service,
            env(&format!("{upper}_DATABASE_URL")),
            env("DATABASE_URL"),
            &data_dir(),
        );
        let sandbox = match env("RETRYSAFE_SANDBOX") {
            Some(v) => matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes"),
            None => sandbox_default,
        };
        let max_connections = match env("RETRYSAFE_DB_CONNECTIONS") {
            Some(v) => v
                .parse()
                .map_err(|_| ConfigError(format!("RETRYSAFE_DB_CONNECTIONS `{v}` is not a number")))?,
            None => 16,
        };
        Ok(ServiceConfig {
            service,
            listen,
            database_url,
            sandbox,
            max_connections,
            limits: ConnectionLimits::from_env()?,
        })
    }
}

/// `<SERVICE>_ADDR`, or `127.0.0.1:<its sandbox port>` (see [`sandbox_port`]).
pub fn listen_addr(service: &str, default_port: u16) -> Result<SocketAddr, ConfigError> {
    let upper = service.to_ascii_uppercase();
    let port = sandbox_port(default_port)?;
    match env(&format!("{upper}_ADDR")) {
        Some(addr) => addr
            .parse()
            .map_err(|_| ConfigError(format!("{upper}_ADDR `{addr}` is not an address like 127.0.0.1:{port}"))),
        None => Ok(SocketAddr::from(([127, 0, 0, 1], port))),
    }
}

/// The sandbox's ports are laid out from 7000; all of them sit this far
/// above `RETRYSAFE_BASE_PORT`'s value at most.
const SANDBOX_BASE: u16 = 7000;
const SANDBOX_SPAN: u16 = 102;

/// The port a server of the sandbox listens on unless told otherwise:
/// `default_port` (7000–7102), moved with every other by `RETRYSAFE_BASE_PORT`
/// so that two sandboxes, or a sandbox and something else on 7000, fit on one
/// machine with one variable.
pub fn sandbox_port(default_port: u16) -> Result<u16, ConfigError> {
    let Some(base) = env("RETRYSAFE_BASE_PORT") else {
        return Ok(default_port);
    };
    match base.trim().parse::<u16>() {
        Ok(base) if (1024..=u16::MAX - SANDBOX_SPAN).contains(&base) => {
            Ok(base + default_port.saturating_sub(SANDBOX_BASE))
        }
        _ => Err(ConfigError(format!(
            "RETRYSAFE_BASE_PORT `{base}` is not a port from 1024 to {} (every port up to 102 above it is used)",
            u16::MAX - SANDBOX_SPAN
        ))),
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

pub fn data_dir() -> PathBuf {
    env("RETRYSAFE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".sandbox"))
}

/// Picks a service's database: its own URL if given; else its own database on
/// the `DATABASE_URL` server (`…/retrysafe` → `…/retrysafe_tickets`); else a
/// SQLite file `<data dir>/<service>.db`.
pub fn database_url_for(
    service: &str,
    own: Option<String>,
    shared: Option<String>,
    data_dir: &std::path::Path,
) -> String {
    if let Some(url) = own {
        return url;
    }
    if let Some(url) = shared.filter(|u| u.starts_with("postgres")) {
        return postgres_database_for(&url, service);
    }
    format!("sqlite://{}", data_dir.join(format!("{service}.db")).display())
}

fn postgres_database_for(url: &str, service: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let (server, database) = match base[scheme_end..].find('/') {
        Some(slash) => (&base[..scheme_end + slash], &base[scheme_end + slash + 1..]),
        None => (base, ""),
    };
    let prefix = if database.is_empty() { "retrysafe" } else { database };
    let mut out = format!("{server}/{prefix}_{service}");
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn each_service_gets_its_own_database_on_the_shared_postgres_server() {
        let url = database_url_for(
            "tickets",
            None,
            Some("postgres://postgres@127.0.0.1:5432/retrysafe".into()),
            Path::new("x"),
        );
        assert_eq!(url, "postgres://postgres@127.0.0.1:5432/retrysafe_tickets");
        let url = database_url_for(
            "payments",
            None,
            Some("postgres://h:5432?sslmode=disable".into()),
            Path::new("x"),
        );
        assert_eq!(url, "postgres://h:5432/retrysafe_payments?sslmode=disable");
    }

    #[test]
    fn a_service_url_wins_and_sqlite_is_the_default() {
        assert_eq!(
            database_url_for(
                "tickets",
                Some("sqlite://t.db".into()),
                Some("postgres://h/x".into()),
                Path::new("d")
            ),
            "sqlite://t.db"
        );
        assert_eq!(
            database_url_for("tickets", None, None, Path::new(".sandbox")),
            "sqlite://.sandbox/tickets.db"
        );
    }
}

/// The connections a process holds open at once, across every server it
/// runs: sockets are the process's, not one listener's (the sandbox serves
/// every service from one process). Clones share the same connections.
#[derive(Debug, Clone)]
pub struct ConnectionCap {
    open: Arc<Semaphore>,
    max: usize,
}

impl ConnectionCap {
    /// The largest cap there can be.
    pub const MAX: usize = Semaphore::MAX_PERMITS;

    /// A cap of `max` connections (at least one).
    pub fn new(max: usize) -> ConnectionCap {
        let max = max.clamp(1, Self::MAX);
        ConnectionCap {
            open: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// The connections open now.
    pub fn open(&self) -> usize {
        self.max - self.open.available_permits()
    }

    /// A place for one more connection, held until the permit drops; none
    /// past the cap. Never waits: a client past the cap is answered at once.
    pub(crate) fn take(&self) -> Option<OwnedSemaphorePermit> {
        self.open.clone().try_acquire_owned().ok()
    }
}

//! The one server loop every Retrysafe server runs — the services, the
//! simulators, the console, the MCP endpoint — and what it bounds
//! (docs/contract.md §1, §14). A slow or idle client costs a socket for a
//! bounded time and never a worker, and all clients together hold at most a
//! fixed number of sockets:
//!
//! - headers late or too large close the connection (hyper answers 431
//!   itself, with an empty body);
//! - a body that does not arrive in time fails to read, which
//!   [`ApiJson`](crate::ApiJson) answers with 408;
//! - an answer the client does not read closes the connection;
//! - past the process's [`ConnectionCap`](crate::config::ConnectionCap), a new connection is answered 503
//!   with `Retry-After` and closed, before anything of it is read.

use std::{net::SocketAddr, sync::LazyLock, time::Duration};

use tokio::net::{TcpListener, TcpStream};

use crate::{ApiError, config::ConnectionLimits};

/// Binds `addr` for the server `name` (`tickets`, `payment_provider`, `mcp`:
/// the `<NAME>_ADDR` variable moves it), which `what` names for a person.
/// A failure says which server, where, and how to move it: a port already in
/// use is most often the first thing a new user meets.
pub async fn listen(name: &str, what: &str, addr: SocketAddr) -> Result<TcpListener, ListenError> {
    TcpListener::bind(addr).await.map_err(|cause| {
        // the variable `config::listen_addr` reads
        let variable = format!("{}_ADDR", name.to_ascii_uppercase());
        let why = match cause.kind() {
            std::io::ErrorKind::AddrInUse => {
                "the address is already in use (another process listens there: an earlier run still going?)".to_owned()
            }
            _ => cause.to_string(),
        };
        ListenError {
            message: format!(
                "{what} cannot listen on {addr}: {why}; stop what holds it, or move {what} with \
                 {variable}=127.0.0.1:<another port> (RETRYSAFE_BASE_PORT=<port> moves every sandbox port at once)"
            ),
            cause,
        }
    })
}

/// A server that could not listen, said for the person starting it: which
/// server, where, why, and the variable that moves it.
pub struct ListenError {
    message: String,
    cause: std::io::Error,
}

impl ListenError {
    /// The operating system's reason (`AddrInUse`, `PermissionDenied`, …).
    pub fn kind(&self) -> std::io::ErrorKind {
        self.cause.kind()
    }
}

impl std::fmt::Display for ListenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

// A `main` that returns the error prints its `Debug`: the sentence, not the
// io::Error's fields.
impl std::fmt::Debug for ListenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ListenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.cause)
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
/// Every connection is held to `limits` (see the module's doc).
pub async fn serve(
    mut listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
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
                let Some(place) = limits.connections.take() else {
                    refuse(stream);
                    continue;
                };
                let stream = TokioIo::new(Box::pin(with_write_timeout(stream, limits.write_timeout)));
                let connection = connections.watch(http.serve_connection(stream, service.clone()));
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(%error, "connection closed");
                    }
                    drop(place);
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

/// `stream`, whose writes fail once one has made no progress for `timeout`:
/// hyper then closes the connection. The clock runs only while a write
/// waits for the client to read, so neither a long computation nor a
/// stream quiet between its events is cut, nor a slow reader that keeps
/// reading. hyper has a timeout for the headers but none for the answer,
/// and a tower layer sees only the response future, not the socket it is
/// written to; `tokio-io-timeout` is a small, long-kept crate that wraps
/// the socket for exactly this.
fn with_write_timeout(stream: TcpStream, timeout: Duration) -> tokio_io_timeout::TimeoutWriter<TcpStream> {
    let mut stream = tokio_io_timeout::TimeoutWriter::new(stream);
    stream.set_timeout(Some(timeout));
    stream
}

/// How long a client past the cap is asked to wait.
const RETRY_AFTER_SECONDS: u64 = 1;

/// The whole answer to a connection past the cap, made once.
static TOO_MANY_CONNECTIONS: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let body = ApiError::too_many_connections()
        .with_retry_after(RETRY_AFTER_SECONDS)
        .to_problem_json();
    let mut answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: {}\r\nRetry-After: {RETRY_AFTER_SECONDS}\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n",
        crate::error::PROBLEM_JSON,
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    answer
});

/// Answers a connection past the cap with a fixed 503 and closes it, in the
/// accept loop itself: no task, nothing kept, nothing that waits on the
/// client.
/// A fresh socket's send buffer takes the whole answer at once; if it did
/// not, the client sees the connection closed, which refuses it as well.
/// What the client already sent, up to a page, is read first (and
/// dropped): a socket closed with unread data is reset, and a reset can lose
/// the answer. A client that sent more may get the reset instead, which
/// refuses it all the same.
fn refuse(stream: TcpStream) {
    let mut sent = [0u8; 4096];
    let _ = stream.try_read(&mut sent);
    let _ = stream.try_write(&TOO_MANY_CONNECTIONS);
    tracing::debug!("connection refused: the process holds as many connections as it may");
}

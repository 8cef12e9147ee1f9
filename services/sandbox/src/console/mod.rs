//! The approval console (docs/contract.md §6): a web page where a human sees
//! the pending approvals of every running service — what each would do, to
//! what, with which fingerprint, who asked and until when — and approves or
//! rejects them, page by page, with the counts of what waits. Every approval is
//! listed too, with who decided and when. It also lists what the outbox could
//! not settle by itself — operations whose outcome is unknown, deliveries that
//! are dead — for an admin to settle with evidence or send again.
//!
//! The console is just another client of the public API: it has no database,
//! and acts with the signed-in approver's or admin's own API key. The key
//! stays on the server: signing in verifies it with the services and opens a
//! session (`session`); the browser holds only the session's opaque id, in
//! an HttpOnly, SameSite=Strict cookie. Pages are rendered on the server with
//! plain HTML forms and one stylesheet of its own: no script, nothing from a
//! CDN, so it works with no network and its Content-Security-Policy can
//! forbid everything else — framing included.
//!
//! The map, in the order a request meets it:
//! - this file: the routes, and the headers every answer carries;
//! - `access`: signing in and out, and which posted forms are acted on;
//! - `page`: the page a person reads, gathered from every service;
//! - `actions`: a decision, a settlement or a redelivery, sent to its service;
//! - `services`: the services' API as the console calls it, and their refusals in words;
//! - `views`: the templates (`templates/console/`), which escape every value they write.

mod access;
mod actions;
mod page;
mod services;
mod session;
mod views;

use std::time::Duration;

use axum::{
    Router,
    http::{HeaderName, HeaderValue, StatusCode, header},
    middleware,
    response::{IntoResponse, Response},
    routing::{get, post},
};

pub use session::SessionLimits;
use session::Sessions;

/// The sandbox's console port (docs/contract.md §12).
pub const DEFAULT_PORT: u16 = 7000;

/// How many approvals, or operations, one page lists.
pub const PAGE_SIZE: usize = 20;

/// A service whose approvals the console shows.
#[derive(Debug, Clone)]
pub struct ServiceLink {
    pub name: String,
    /// e.g. `http://127.0.0.1:7001`
    pub url: String,
}

#[derive(Debug, Clone, Default)]
pub struct ConsoleConfig {
    pub services: Vec<ServiceLink>,
    /// Pre-filled in the sign-in form (the sandbox's demo approver); never sent anywhere by itself.
    pub suggested_key: Option<String>,
    pub session: SessionLimits,
}

#[derive(Clone)]
struct Console {
    config: ConsoleConfig,
    http: reqwest::Client,
    sessions: Sessions,
}

pub fn router(config: ConsoleConfig) -> Router {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default();
    let sessions = Sessions::new(config.session);
    Router::new()
        .route("/", get(page::page))
        .route("/key", post(access::sign_in))
        .route("/forget", post(access::sign_out))
        .route("/decide", post(actions::decide))
        .route("/resolve", post(actions::resolve))
        .route("/redeliver", post(actions::redeliver))
        .route("/console.css", get(stylesheet))
        .route("/healthz", get(|| async { "ok" }))
        .fallback(not_found)
        .with_state(Console { config, http, sessions })
        .layer(middleware::map_response(protect))
}

/// Serves the console, its connections held to `limits`, until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: ConsoleConfig,
    limits: platform::config::ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing::info!(addr = %listener.local_addr()?, "approval console listening");
    Ok(platform::serve(listener, router(config), limits, shutdown).await?)
}

/// On every answer, pages, redirects and errors alike: no other page may
/// frame the console (a framed page can be clicked through unseen), nothing
/// but its own stylesheet and forms may run or load, and nothing it shows is
/// kept in a cache.
async fn protect(mut response: Response) -> Response {
    const HEADERS: [(HeaderName, &str); 5] = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    for (name, value) in HEADERS {
        response.headers_mut().insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn not_found() -> Response {
    views::problem_page(StatusCode::NOT_FOUND, "There is no such page in the console.")
}

async fn stylesheet() -> Response {
    let style = include_str!("console.css");
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], style).into_response()
}

/// `text` as one query-string value.
fn url_encoded(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

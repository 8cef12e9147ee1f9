//! Structured logs: one span per request carrying the operation id, account,
//! fingerprint and outcome; text or JSON output chosen by `LOG_FORMAT`.

use std::time::Duration;

use axum::{extract::Request, http::Response};
use tower_http::{
    classify::{ServerErrorsAsFailures, SharedClassifier},
    trace::TraceLayer,
};
use tracing::{Span, field::Empty};
use tracing_subscriber::EnvFilter;

use crate::error::InternalCause;

/// Installs the global subscriber. `LOG_FORMAT=json` selects JSON lines;
/// `RUST_LOG` filters (default `info`). Safe to call more than once.
pub fn init() {
    install(std::io::stdout);
}

/// [`init`], writing to stderr: for a process whose stdout is a protocol's
/// (the MCP server over stdio).
pub fn init_to_stderr() {
    install(std::io::stderr);
}

fn install<W>(writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let json = std::env::var("LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(writer);
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

/// The request span and its closing log line. The idempotency layer fills in
/// `operation_id`, `fingerprint` and `outcome`; authentication fills in the
/// account and principal.
#[allow(clippy::type_complexity)]
pub fn request_layer() -> TraceLayer<
    SharedClassifier<ServerErrorsAsFailures>,
    fn(&Request) -> Span,
    (),
    fn(&Response<axum::body::Body>, Duration, &Span),
> {
    TraceLayer::new_for_http()
        .make_span_with(request_span as fn(&Request) -> Span)
        .on_request(())
        .on_response(log_response as fn(&Response<axum::body::Body>, Duration, &Span))
}

fn request_span(request: &Request) -> Span {
    tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
        account_id = Empty,
        principal_id = Empty,
        operation_id = Empty,
        fingerprint = Empty,
        outcome = Empty,
    )
}

fn log_response(response: &Response<axum::body::Body>, latency: Duration, _span: &Span) {
    let status = response.status().as_u16();
    let latency_ms = latency.as_secs_f64() * 1000.0;
    match response.extensions().get::<InternalCause>() {
        Some(InternalCause(cause)) => {
            tracing::error!(status, latency_ms, cause = %cause, "request failed")
        }
        None => tracing::info!(status, latency_ms, "request finished"),
    }
}

pub fn record_principal(account_id: &str, principal_id: &str) {
    let span = Span::current();
    span.record("account_id", account_id);
    span.record("principal_id", principal_id);
}

/// Records which operation this request is an attempt at. Each field is
/// recorded once per request: the text format appends a re-recorded field.
pub fn record_operation(operation_id: &str, fingerprint: &str) {
    let span = Span::current();
    span.record("operation_id", operation_id);
    span.record("fingerprint", fingerprint);
}

/// Records what the attempt came to: `created`, `replayed`, `key_reused`,
/// `in_progress`, `failed`, `rejected`, `awaiting_approval`,
/// `outcome_unknown` or `server_error`.
pub fn record_outcome(outcome: &'static str) {
    Span::current().record("outcome", outcome);
    crate::metrics::note_outcome(outcome);
}

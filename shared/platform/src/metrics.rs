//! Prometheus metrics: what every service counts and how it serves them at
//! `GET /metrics` (docs/contract.md §5; the list is in the README).
//!
//! Each service records into a registry of its own, every series of which
//! carries its `service` label, rather than into the process's global one:
//! the sandbox runs every service in one process, and tests run many
//! services side by side, each reading back only its own counts. Recording
//! still goes through the `metrics` facade's macros, pointed at the
//! service's registry ([`Metrics::record`]). Histograms have explicit
//! buckets, so Prometheus can aggregate them across replicas; no label ever
//! holds a key, an account, a fingerprint or an id.

pub mod gauges;

use std::{cell::Cell, sync::Arc, time::Duration};

use axum::{
    extract::{MatchedPath, Request, State},
    http::header,
    middleware::Next,
    response::{IntoResponse, Response},
};
use metrics::Label;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

/// Seconds, for everything a request or a statement waits on.
const LATENCY_BUCKETS: [f64; 14] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Seconds, for a human's decision: minutes to the approval's expiry.
const DECISION_BUCKETS: [f64; 9] = [5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0];

/// The series every service has, by name; what each one counts is its
/// help text (`DESCRIBED`).
pub mod names {
    pub const REQUESTS: &str = "retrysafe_idempotency_requests_total";
    pub const REQUEST_DURATION: &str = "retrysafe_request_duration_seconds";
    pub const CLAIM_DURATION: &str = "retrysafe_idempotency_claim_duration_seconds";
    pub const DB_ACQUIRE: &str = "retrysafe_db_acquire_duration_seconds";
    pub const DB_CONNECTIONS: &str = "retrysafe_db_pool_connections";
    pub const DB_MAX_CONNECTIONS: &str = "retrysafe_db_pool_max_connections";
    pub const OUTBOX_EVENTS: &str = "retrysafe_outbox_events";
    pub const OUTBOX_OLDEST_PENDING: &str = "retrysafe_outbox_oldest_pending_age_seconds";
    pub const OUTBOX_DELIVERIES: &str = "retrysafe_outbox_deliveries_total";
    pub const OUTBOX_RECONCILIATIONS: &str = "retrysafe_outbox_reconciliations_total";
    pub const OUTBOX_DEAD_LETTERED: &str = "retrysafe_outbox_dead_lettered_total";
    pub const APPROVALS: &str = "retrysafe_approvals";
    pub const APPROVAL_DECISION: &str = "retrysafe_approval_decision_seconds";
    pub const OPERATIONS: &str = "retrysafe_operations";
    pub const OLDEST_UNKNOWN: &str = "retrysafe_operations_oldest_unknown_age_seconds";
    pub const JOURNAL_BACKLOG: &str = "retrysafe_journal_inbox_backlog";
    pub const CHAIN_ROUND_DURATION: &str = "retrysafe_journal_chain_round_duration_seconds";
    pub const JOURNAL_HEAD_BEHIND: &str = "retrysafe_journal_head_behind_total";
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Each series' kind and help text, which Prometheus shows and `promtool` requires.
const DESCRIBED: &[(&str, Kind, &str)] = &[
    (
        names::REQUESTS,
        Kind::Counter,
        "Writes with an `Idempotency-Key`, by `route` and `outcome`.",
    ),
    (
        names::REQUEST_DURATION,
        Kind::Histogram,
        "Every routed request, by `route`, `method` and `status` class.",
    ),
    (
        names::CLAIM_DURATION,
        Kind::Histogram,
        "The statement that claims a key, by claim `mode`.",
    ),
    (
        names::DB_ACQUIRE,
        Kind::Histogram,
        "The wait for a connection to begin a transaction: a keyed request's, the outbox's, or a person's settlement.",
    ),
    (
        names::DB_CONNECTIONS,
        Kind::Gauge,
        "Connections of each pool, `in_use` or `idle`.",
    ),
    (
        names::DB_MAX_CONNECTIONS,
        Kind::Gauge,
        "How many connections each pool may open.",
    ),
    (
        names::OUTBOX_EVENTS,
        Kind::Gauge,
        "Outbox events not settled yet, by `state` (`pending`, `sending`, `unknown`, `dead`).",
    ),
    (
        names::OUTBOX_OLDEST_PENDING,
        Kind::Gauge,
        "How long the oldest pending event has waited (0 when none waits).",
    ),
    (
        names::OUTBOX_DELIVERIES,
        Kind::Counter,
        "Deliveries, by `result`: `accepted`, `refused`, `not_accepted`, `answer_lost`.",
    ),
    (
        names::OUTBOX_RECONCILIATIONS,
        Kind::Counter,
        "Reconciler lookups, by `result`: `found`, `absent`, `not_asked`.",
    ),
    (names::OUTBOX_DEAD_LETTERED, Kind::Counter, "Events that became dead."),
    (
        names::APPROVALS,
        Kind::Gauge,
        "Approvals, by `state` (`pending`, `approved`, `rejected`, `expired`).",
    ),
    (
        names::APPROVAL_DECISION,
        Kind::Histogram,
        "From an approval's request to its decision, by `decision`.",
    ),
    (
        names::OPERATIONS,
        Kind::Gauge,
        "Operations that are not finished, by `state`.",
    ),
    (
        names::OLDEST_UNKNOWN,
        Kind::Gauge,
        "How long the oldest `unknown` operation has been so (0 when none is).",
    ),
    (
        names::JOURNAL_BACKLOG,
        Kind::Gauge,
        "Journal records waiting to be linked into the chain.",
    ),
    (names::CHAIN_ROUND_DURATION, Kind::Histogram, "One chain round."),
    (
        names::JOURNAL_HEAD_BEHIND,
        Kind::Counter,
        "Chain rounds that linked nothing because the journal no longer held the entry this process last linked: it was cut or rewritten under the running service.",
    ),
];

/// One service's registry.
#[derive(Clone)]
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// A registry whose every series is labelled `service`.
    pub fn new(service: &'static str) -> Metrics {
        let recorder = PrometheusBuilder::new()
            .add_global_label("service", service)
            .set_buckets(&LATENCY_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(names::APPROVAL_DECISION.into()), &DECISION_BUCKETS))
            .expect("the bucket lists are not empty")
            .build_recorder();
        let handle = recorder.handle();
        let metrics = Metrics {
            recorder: Arc::new(recorder),
            handle,
        };
        metrics.record(|| {
            for &(name, kind, help) in DESCRIBED {
                match kind {
                    Kind::Counter => metrics::describe_counter!(name, help),
                    Kind::Gauge => metrics::describe_gauge!(name, help),
                    Kind::Histogram => metrics::describe_histogram!(name, metrics::Unit::Seconds, help),
                }
            }
        });
        metrics
    }

    /// Runs `record` with this service's registry as the facade's recorder:
    /// `metrics.record(|| counter!(…).increment(1))`.
    pub fn record<T>(&self, record: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(self.recorder.as_ref(), record)
    }

    pub fn count(&self, name: &'static str, labels: &[(&'static str, &str)]) {
        let labels = to_labels(labels);
        self.record(|| metrics::counter!(name, labels).increment(1));
    }

    pub fn observe(&self, name: &'static str, labels: &[(&'static str, &str)], took: Duration) {
        let labels = to_labels(labels);
        self.record(|| metrics::histogram!(name, labels).record(took.as_secs_f64()));
    }

    pub fn set(&self, name: &'static str, labels: &[(&'static str, &str)], value: f64) {
        let labels = to_labels(labels);
        self.record(|| metrics::gauge!(name, labels).set(value));
    }

    /// The registry in Prometheus's text format.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Drains what histograms hold between scrapes every few seconds,
    /// forever, so that their buffers stay small.
    pub async fn run_upkeep_forever(self) {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            self.handle.run_upkeep();
        }
    }
}

fn to_labels(labels: &[(&'static str, &str)]) -> Vec<Label> {
    labels
        .iter()
        .map(|&(key, value)| Label::new(key, value.to_owned()))
        .collect()
}

/// `GET /metrics`'s answer: Prometheus's text format.
pub fn exposition(text: String) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}

tokio::task_local! {
    /// What the idempotency layer made of the request being served.
    static OUTCOME: Cell<Option<&'static str>>;
}

/// Notes what an attempt came to for the request's metrics (see
/// [`crate::telemetry::record_outcome`]); outside a request, nothing.
pub(crate) fn note_outcome(outcome: &'static str) {
    let _ = OUTCOME.try_with(|noted| noted.set(Some(outcome)));
}

/// A middleware for a service's routes: each request's duration, and for a
/// write with an `Idempotency-Key` what it came to. A keyed write the layer
/// never saw was refused before any claim (`invalid`: bad input, no key, a
/// refused principal) or failed (`error`).
pub async fn track(State(metrics): State<Metrics>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    // a read that happens to carry the header is no write
    let keyed = request.method() != axum::http::Method::GET && request.headers().contains_key("idempotency-key");
    let started = std::time::Instant::now();
    let (response, outcome) = OUTCOME
        .scope(Cell::new(None), async {
            let response = next.run(request).await;
            (response, OUTCOME.with(Cell::get))
        })
        .await;
    let status = response.status();
    let class = match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    metrics.observe(
        names::REQUEST_DURATION,
        &[("route", &route), ("method", &method), ("status", class)],
        started.elapsed(),
    );
    // a keyed write the layer never saw was refused before any claim, or failed;
    // one that succeeded without it (a settlement by hand) is no operation to count
    let outcome = outcome.map(outcome_label).or(match status.as_u16() {
        400..=499 => Some("invalid"),
        500.. => Some("error"),
        _ => None,
    });
    if let (true, Some(outcome)) = (keyed, outcome) {
        metrics.count(names::REQUESTS, &[("route", &route), ("outcome", outcome)]);
    }
    response
}

/// The layer's own words for an attempt, as the metric names them: a run
/// that ended, either way (a refused approval's answer too), was `executed`.
fn outcome_label(outcome: &'static str) -> &'static str {
    match outcome {
        "created" | "failed" | "completed" | "rejected" => "executed",
        "server_error" => "error",
        other => other,
    }
}

/// `routes`, each request through [`track`] into `metrics`. Only routed
/// requests are seen, so `route` is always a route's template, never a path
/// with ids in it.
pub fn tracked<S: Clone + Send + Sync + 'static>(routes: axum::Router<S>, metrics: Metrics) -> axum::Router<S> {
    routes.route_layer(axum::middleware::from_fn_with_state(metrics, track))
}

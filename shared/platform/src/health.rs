//! `GET /healthz`: whether this replica can serve writes, for a load
//! balancer (docs/contract.md §5).
//!
//! The route needs no key, and each probe asks the database on a connection
//! of its own, so a flood of probes would be a flood of connections. Probes
//! therefore go one at a time: the others wait for the probe under way and
//! take its answer, which serves every probe for a short while after it.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use tokio::sync::Mutex;

use crate::Db;

/// How long a probe waits for the database: `/healthz` must hear within a
/// couple of seconds that this replica cannot serve writes.
const PROBE_WITHIN: Duration = Duration::from_secs(1);

/// How long one probe's answer serves the probes after it: at most one
/// database connection per this, however many probes arrive.
const ANSWER_SERVES_FOR: Duration = Duration::from_millis(500);

/// The database of one service, as its probes see it.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    db: Db,
    /// The last probe's answer and when it came; held while a probe runs.
    last: Arc<Mutex<Option<(Instant, bool)>>>,
}

impl Probe {
    pub(crate) fn new(db: Db) -> Probe {
        Probe {
            db,
            last: Default::default(),
        }
    }

    /// Whether the database answers and takes writes: the last answer if it
    /// is recent, else a new probe's.
    async fn reachable(&self) -> bool {
        // the lock is fair: those who wait for a probe take its answer in turn
        let mut last = self.last.lock().await;
        if let Some((at, reachable)) = *last
            && at.elapsed() < ANSWER_SERVES_FOR
        {
            return reachable;
        }
        let reachable = self.db.reachable(PROBE_WITHIN).await;
        *last = Some((Instant::now(), reachable));
        reachable
    }
}

/// `/healthz`: 200 while the database answers and takes writes, else 503 with
/// `Retry-After`, so a load balancer sends requests to a replica that can
/// claim keys. It says nothing of why: the service's log does.
pub(crate) async fn health(State(probe): State<Probe>) -> Response {
    if probe.reachable().await {
        Json(serde_json::json!({"status": "ok", "database": "reachable"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            Json(serde_json::json!({"status": "unavailable", "database": "unreachable"})),
        )
            .into_response()
    }
}

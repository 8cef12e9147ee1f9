//! What happens to an operation ([`AuditEvent`], [`Record`]), and the
//! [`Sink`] it is reported to: the journal is one (docs/design.md §8).

pub mod inbox;

use futures_core::future::BoxFuture;
use platform::{Db, Principal, Timestamp, Tx, metrics::Metrics};
use serde::{Deserialize, Serialize};

/// Where an operation's transitions are reported.
pub trait Sink: std::any::Any + std::fmt::Debug + Send + Sync + 'static {
    /// Records `records` in `tx`, the transaction that makes them.
    fn record<'a>(&'a self, tx: &'a mut Tx, records: &'a [Record]) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// Notes what an attempt observed and did not change (a replay, a 409).
    fn observe<'a>(&'a self, db: &'a Db, record: Record) -> BoxFuture<'a, ()>;

    /// Background work until the layer stops (the journal links its chain).
    fn keep(&self, _db: Db, _metrics: Metrics) -> Option<BoxFuture<'static, ()>> {
        None
    }

    /// Makes what was recorded or observed so far readable (the journal links it).
    fn flush<'a>(&'a self, _db: &'a Db, _metrics: &'a Metrics) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// The last [`flush`](Sink::flush), when the layer stops.
    fn stop<'a>(&'a self, db: &'a Db, metrics: &'a Metrics) -> BoxFuture<'a, ()> {
        self.flush(db, metrics)
    }

    /// Sets the sink's gauges, at a scrape of `/metrics` (the journal's backlog).
    fn read_gauges<'a>(&'a self, _db: &'a Db, _metrics: &'a Metrics) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async { Ok(()) })
    }

    /// Whether the sink reads [`inbox`] rows: then a claim writes them in its
    /// own call instead of calling [`record`](Sink::record).
    fn reads_the_inbox(&self) -> bool {
        false
    }
}

/// The sink of a layer given none: transitions are dropped, so nothing piles up
/// unread (a service without the journal: docs/adopt.md §3).
#[derive(Debug, Default)]
pub struct Unrecorded;

impl Sink for Unrecorded {
    fn record<'a>(&'a self, _tx: &'a mut Tx, _records: &'a [Record]) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async { Ok(()) })
    }

    fn observe<'a>(&'a self, _db: &'a Db, _record: Record) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// A journal entry's event; docs/contract.md §8 says what each means.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, strum::IntoStaticStr, strum::EnumString,
)]
#[serde(rename_all = "snake_case")]
// stored as `into_str()` and read back by `str::parse`: strum's names, by serde's rule
#[strum(serialize_all = "snake_case", const_into_str)]
#[cfg_attr(test, derive(strum::EnumIter))]
pub enum AuditEvent {
    Attempted,
    Claimed,
    Replayed,
    KeyReused,
    InProgress,
    ApprovalRequested,
    Approved,
    Rejected,
    Expired,
    Stale,
    Dispatched,
    Accepted,
    Completed,
    Failed,
    Unknown,
    Reconciled,
    Released,
    StateChanged,
    Resolved,
    DeadLettered,
    Redelivered,
    ExternalRefRefused,
}

/// What to record: who, which operation, what happened, when. Never an API key or a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub account_id: String,
    pub principal_id: String,
    pub operation_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub fingerprint: Option<String>,
    pub route: Option<String>,
    pub event: AuditEvent,
    pub external_ref: Option<String>,
    pub at: Timestamp,
    /// The attempt an entry stands for too: a claim finished in one
    /// transaction journals only its outcome, which carries the number.
    pub attempt: Option<i64>,
    /// The resource a `state_changed` entry is about, and its new state.
    pub change: Option<StateChange>,
    /// What a person gave for `resolved` or `external_ref_refused`.
    pub evidence: Option<String>,
}

/// A business resource's new state: `{resource_type, resource_id, state}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    /// In the service's words: `ticket`, `payment_intent`, `deployment`.
    pub resource_type: String,
    pub resource_id: String,
    pub state: String,
}

impl Record {
    /// `principal` changed a resource's state through `route`, with no key.
    pub fn state_changed(principal: &Principal, route: &str, change: StateChange) -> Record {
        Record {
            account_id: principal.account_id.clone(),
            principal_id: principal.principal_id.clone(),
            operation_id: None,
            idempotency_key: None,
            fingerprint: None,
            route: Some(route.to_owned()),
            event: AuditEvent::StateChanged,
            external_ref: None,
            at: Timestamp::now(),
            attempt: None,
            change: Some(change),
            evidence: None,
        }
    }

    /// The record, standing for attempt `n` on its operation too.
    pub fn by_attempt(self, n: i64) -> Record {
        Record {
            attempt: Some(n),
            ..self
        }
    }
}

impl StateChange {
    pub fn new(resource_type: &str, resource_id: &str, state: &str) -> StateChange {
        StateChange {
            resource_type: resource_type.to_owned(),
            resource_id: resource_id.to_owned(),
            state: state.to_owned(),
        }
    }
}

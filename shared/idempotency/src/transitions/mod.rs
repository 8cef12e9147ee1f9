//! What happens to an operation, as it is reported (docs/contract.md §8):
//! its transitions ([`AuditEvent`], [`Record`]), and the extension point
//! they are reported to, the [`Sink`] — inside the transaction that makes a
//! transition, and after the answer for what an attempt only observed (a
//! replay, a 409). The hash-chained journal (the `journal` crate) is the
//! sink a service's layer reports to; a transition is recorded as an
//! [`inbox`] row, the one shape every sink reads.

pub mod inbox;

use std::{future::Future, pin::Pin};

use platform::{Db, Principal, Timestamp, Tx, metrics::Metrics};
use serde::{Deserialize, Serialize};

/// Where an operation's transitions are reported. Besides its two duties, a
/// sink may keep background work, which the layer's
/// [`spawn_background`](crate::Idempotency::spawn_background) runs and
/// [`Background::stop`](crate::Background::stop) ends.
pub trait Sink: std::any::Any + std::fmt::Debug + Send + Sync + 'static {
    /// Records `records` in `tx`, the transaction that makes them: they
    /// commit, or roll back, with it.
    fn record<'a>(&'a self, tx: &'a mut Tx, records: &'a [Record]) -> Recording<'a>;

    /// Notes what an attempt observed and did not change (a replay, a 409),
    /// with no transaction of its own.
    fn observe<'a>(&'a self, db: &'a Db, record: Record) -> Observing<'a>;

    /// What the sink does in the background until the layer stops (the
    /// journal links its chain); nothing by default.
    fn keep(&self, _db: Db, _metrics: Metrics) -> Option<Observing<'static>> {
        None
    }

    /// Makes what was recorded or observed until now readable (the journal
    /// links it); before a read of it, and when the layer stops.
    fn flush<'a>(&'a self, _db: &'a Db, _metrics: &'a Metrics) -> Observing<'a> {
        Box::pin(async {})
    }

    /// The last [`flush`](Sink::flush), when the layer stops.
    fn stop<'a>(&'a self, db: &'a Db, metrics: &'a Metrics) -> Observing<'a> {
        self.flush(db, metrics)
    }

    /// Observations the sink holds in this process's memory, waiting (a gauge).
    fn held(&self) -> usize {
        0
    }

    /// Whether the sink reads what is recorded as [`inbox`] rows: then a
    /// claim writes its rows in its own statement, one round trip on
    /// PostgreSQL, instead of calling [`record`](Sink::record).
    fn reads_the_inbox(&self) -> bool {
        false
    }
}

/// The sink of a layer given none: nothing is kept, so nothing piles up
/// unread (a service that adopts the core alone: docs/adopt.md).
#[derive(Debug, Default)]
pub struct Unrecorded;

impl Sink for Unrecorded {
    fn record<'a>(&'a self, _tx: &'a mut Tx, _records: &'a [Record]) -> Recording<'a> {
        Box::pin(async { Ok(()) })
    }

    fn observe<'a>(&'a self, _db: &'a Db, _record: Record) -> Observing<'a> {
        Box::pin(async {})
    }
}

/// What [`Sink::record`] returns: its writes, as a boxed future, so the layer can hold any sink.
pub type Recording<'a> = Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'a>>;

/// What [`Sink::observe`] returns, as a boxed future, so the layer can hold any sink.
pub type Observing<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
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
    /// An approved run found that what its summary promised no longer holds
    /// (the release a deployment replaces): the operation is `rejected` with
    /// 409 `approval_stale` and never runs.
    Stale,
    Dispatched,
    Accepted,
    Completed,
    Failed,
    Unknown,
    Reconciled,
    /// A claim freed after a server error: nothing happened, the key may be claimed again.
    Released,
    /// A business resource changed state with no transition of an operation
    /// to record it: a request with no key (a ticket's status, a cancel), or
    /// a worker that follows work elsewhere (a rollout the controller began
    /// running). The entry names the resource and its new state; a request
    /// that changed nothing (the resource already had that state) journals
    /// nothing. With a key, the operation's own entries record the change.
    StateChanged,
    /// A person settled an operation whose outcome was unknown: who, with
    /// what evidence, and the external reference they found. The entry for
    /// the outcome (`completed`, `failed`) follows it.
    Resolved,
    /// An outbox event failed too often and is no longer tried; its operation
    /// is left as it was.
    DeadLettered,
    /// An admin gave a dead event back to be tried again.
    Redelivered,
    /// A person's resolution named an external reference the external system
    /// does not confirm as the operation's: who, with what evidence, and the
    /// reference refused. Nothing else changed.
    ExternalRefRefused,
}

named!(AuditEvent {
    Attempted = "attempted",
    Claimed = "claimed",
    Replayed = "replayed",
    KeyReused = "key_reused",
    InProgress = "in_progress",
    ApprovalRequested = "approval_requested",
    Approved = "approved",
    Rejected = "rejected",
    Expired = "expired",
    Stale = "stale",
    Dispatched = "dispatched",
    Accepted = "accepted",
    Completed = "completed",
    Failed = "failed",
    Unknown = "unknown",
    Reconciled = "reconciled",
    Released = "released",
    StateChanged = "state_changed",
    Resolved = "resolved",
    DeadLettered = "dead_lettered",
    Redelivered = "redelivered",
    ExternalRefRefused = "external_ref_refused",
});

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
    /// Which attempt on the operation made the entry, where the entry stands
    /// for the attempt too: a claim that ran and finished in one transaction
    /// journals only its outcome, and that entry carries the attempt's number.
    pub attempt: Option<i64>,
    /// The resource a `state_changed` entry is about, and its new state.
    pub change: Option<StateChange>,
    /// What a person gave for settling an operation by hand (`resolved`,
    /// `external_ref_refused`).
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

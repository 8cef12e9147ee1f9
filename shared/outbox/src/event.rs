//! An event of the outbox — what an effect hands on ([`Event`]) and what a
//! worker holds ([`OutboxEvent`]) — and what a service gives the outbox for
//! its events: the [`Destination`] they go to, the [`Ledger`] of its own
//! rows, and the [`Witness`] a person's resolution is checked with.

use std::future::Future;

use idempotency::{
    OperationIdentity,
    status::EventState,
    transitions::{AuditEvent, Record},
};
use platform::{Timestamp, Tx};
use serde::Serialize;

use crate::answer::{Delivery, Lookup};

/// The external idempotency key of an operation's event: derived from the
/// operation id, so every delivery of it — after any retry or restart — is
/// the same request to the external system.
pub fn external_key(operation_id: &str) -> String {
    format!("retrysafe-{operation_id}")
}

/// Work that leaves the process (a charge, a rollout), as an effect hands it
/// to the outbox: `Effect::with_handoff(Event::new(kind, &payload))`. It is
/// written as a `kind` event in the effect's transaction, and the outbox
/// delivers it with a key derived from the operation id ([`external_key`]).
/// The operation answers now — the effect's answer, usually a 202 with the
/// resource in its first state — and stays `in_progress`, replaying that
/// answer, until the delivery settles it.
///
/// `kind` names the work in the service's words, and `payload` is what the
/// [`Destination`] needs to send it. A payload that would not serialise is
/// kept as its error: the effect then fails with a server error and nothing
/// commits, rather than an event that says nothing.
#[derive(Debug, Clone)]
pub struct Event {
    pub(crate) kind: &'static str,
    pub(crate) payload: Result<serde_json::Value, String>,
}

impl Event {
    pub fn new(kind: &'static str, payload: &impl Serialize) -> Self {
        Event {
            kind,
            payload: serde_json::to_value(payload).map_err(|e| e.to_string()),
        }
    }
}

/// One event, as a worker or the reconciler holds it.
#[derive(Debug, Clone)]
pub struct OutboxEvent {
    pub event_id: String,
    pub account_id: String,
    pub operation_id: String,
    pub idempotency_key: String,
    pub fingerprint: String,
    pub route: String,
    /// What to deliver, in the service's words (`capture`, `refund`, `rollout`…).
    pub kind: String,
    pub payload: serde_json::Value,
    /// The external system's idempotency key: the same on every delivery.
    pub external_key: String,
    /// Where it was when it was taken: `Sending` means a worker died holding it.
    pub state: EventState,
    /// How many times it was handed to the external system, this time included.
    pub deliveries: i32,
    /// How many deliveries and lookups came to nothing known, and settlements
    /// failed, before this one.
    pub failures: i32,
    pub(crate) lease_token: String,
}

impl OutboxEvent {
    /// A journal record of what happened to this event's operation.
    pub(crate) fn audit(&self, event: AuditEvent, by: &str, external_ref: Option<&str>, at: Timestamp) -> Record {
        self.identity().audit(event, by, external_ref, at)
    }

    /// Who this event's operation is.
    pub fn identity(&self) -> OperationIdentity<'_> {
        OperationIdentity {
            account_id: &self.account_id,
            operation_id: &self.operation_id,
            idempotency_key: &self.idempotency_key,
            fingerprint: &self.fingerprint,
            route: &self.route,
        }
    }
}

/// How an event ended, for the service's business rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement<'a> {
    Accepted {
        external_ref: &'a str,
    },
    Refused {
        reason: &'a str,
    },
    /// A person found that it took effect, and named no reference (the
    /// external system may be gone for good; see [`resolve`](crate::resolve)): an end like an
    /// acceptance, with no external id for the rows to keep — so nothing
    /// acts at the external system in the operation's name afterwards.
    CompletedByHand,
    /// A person settled it as not taken effect, on the external system's word
    /// that it holds nothing under the operation's key (see [`resolve`](crate::resolve)): an
    /// end like a refusal.
    FailedByHand,
    /// Sent, and nobody knows yet whether it took effect.
    Unknown,
}

/// The external system a service's events go to.
pub trait Destination: Send + Sync + 'static {
    /// Sends `event`, with `event.external_key` as the external system's
    /// idempotency key. The outbox bounds it by its delivery timeout: a
    /// delivery that runs out of time is [`Delivery::AnswerLost`].
    fn deliver(&self, event: &OutboxEvent) -> impl Future<Output = Delivery> + Send;

    /// Asks the external system what became of `event`, by its key or by the
    /// service's own reference. `Err`: it could not be asked.
    fn look_up(&self, event: &OutboxEvent) -> impl Future<Output = Result<Lookup, String>> + Send;
}

/// The external system as a person's resolution asks it ([`resolve`](crate::resolve)): the
/// reconciler's own lookup ([`Destination::look_up`]), as a trait object the
/// layer holds beside its [`Ledger`], since a resolution is a request
/// handler's and not the outbox's. Every [`Destination`] is one; the service
/// gives it to its layer in its [`Events`](crate::Events).
pub trait Witness: std::fmt::Debug + Send + Sync + 'static {
    /// What the external system holds for `event`, by its key or by the
    /// service's own reference. `Err`: it could not be asked.
    fn holds<'a>(&'a self, event: &'a OutboxEvent) -> Asking<'a>;
}

/// What [`Witness::holds`] returns: the lookup, as a boxed future, so that
/// the layer can hold any service's witness.
pub type Asking<'a> = std::pin::Pin<Box<dyn Future<Output = Result<Lookup, String>> + Send + 'a>>;

impl<D: Destination + std::fmt::Debug> Witness for D {
    fn holds<'a>(&'a self, event: &'a OutboxEvent) -> Asking<'a> {
        Box::pin(async move { self.look_up(event).await.map(Lookup::checked) })
    }
}

/// The service's own rows for the work its events carry: how an event's
/// ending is written in them. Apart from the [`Destination`] because a person
/// settles an operation by hand ([`resolve`](crate::resolve)) through the same writes as the
/// reconciler, from any request handler, with no external system involved;
/// the service gives it to its layer in its [`Events`](crate::Events).
pub trait Ledger: std::fmt::Debug + Send + Sync + 'static {
    /// Whether the external system's acceptance ends the operation: `true`
    /// for a charge (accepted is done), `false` for work that goes on there
    /// (a rollout): the operation then stays `in_progress`, with the external
    /// reference, until the service ends it with [`finish`](crate::finish).
    fn completes_on_acceptance(&self, _event: &OutboxEvent) -> bool {
        true
    }

    /// The service's business writes for how `event` ended (a capture
    /// succeeded, a refund failed…), in the transaction that settles the event
    /// and its operation.
    fn settle<'a>(&'a self, tx: &'a mut Tx, event: &'a OutboxEvent, settlement: Settlement<'a>) -> Settling<'a>;
}

/// What [`Ledger::settle`] returns: its writes, as a boxed future, so that
/// the layer can hold any service's ledger.
pub type Settling<'a> = std::pin::Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'a>>;

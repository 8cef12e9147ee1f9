//! An event of the outbox — what an effect hands on ([`Event`]) and what a
//! worker holds ([`OutboxEvent`]) — and what a service gives the outbox for
//! its events: the [`Destination`] they go to, the [`Ledger`] of its own
//! rows, and the [`Witness`] a person's resolution is checked with.

use std::future::Future;

use idempotency::{
    BoxFuture, OperationIdentity,
    status::EventState,
    transitions::{AuditEvent, Record},
};
use platform::{Timestamp, Tx};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::answer::{Delivery, Lookup};

/// The external idempotency key of an operation's work: `retrysafe-` and
/// 128 bits of SHA-256 over what the client sent — its account, the route,
/// its `Idempotency-Key` and the request's fingerprint — as a JSON array, so
/// no two tuples share an encoding. Nothing the server made goes in: every
/// delivery, after any restart, is the same request to the external system,
/// and so is a retry that runs again because a failover lost the claim
/// (docs/design.md §12). It lives here, not in the core, because only work
/// that leaves the process needs it; this is the one place a key is made.
pub fn external_key(operation: &OperationIdentity<'_>) -> String {
    let named = serde_json::to_vec(&[
        operation.account_id,
        operation.route,
        operation.idempotency_key,
        operation.fingerprint,
    ])
    .expect("strings serialise to JSON");
    // 128 bits keep a collision negligible at any volume, in a key short enough for any provider
    format!("retrysafe-{}", hex::encode(&Sha256::digest(named)[..16]))
}

/// Work that leaves the process (a charge, a rollout), as an effect hands it
/// to the outbox: `Effect::with_handoff(Event::new(kind, &payload))`. It is
/// written as a `kind` event in the effect's transaction, and the outbox
/// delivers it with a key derived from what the client sent ([`external_key`]).
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
    fn holds<'a>(&'a self, event: &'a OutboxEvent) -> BoxFuture<'a, Result<Lookup, String>>;
}

impl<D: Destination + std::fmt::Debug> Witness for D {
    fn holds<'a>(&'a self, event: &'a OutboxEvent) -> BoxFuture<'a, Result<Lookup, String>> {
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
    fn settle<'a>(
        &'a self,
        tx: &'a mut Tx,
        event: &'a OutboxEvent,
        settlement: Settlement<'a>,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: OperationIdentity<'static> = OperationIdentity {
        account_id: "acme",
        operation_id: "op_0193a1b2c3d4e5f60718293a4b5c6d7e",
        idempotency_key: "capture-order-2077",
        fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        route: "/v1/payment_intents/{intent_id}/capture",
    };

    #[test]
    fn the_external_key_is_the_same_for_the_same_request_whatever_operation_runs_it() {
        let again = OperationIdentity {
            operation_id: "op_0193a1b2c3d4e5f60718293a4b5c6d7f",
            ..FIRST
        };
        assert_eq!(external_key(&again), external_key(&FIRST));
    }

    #[test]
    fn the_external_key_differs_when_the_account_the_route_the_key_or_the_body_differs() {
        let others = [
            OperationIdentity {
                account_id: "globex",
                ..FIRST
            },
            OperationIdentity {
                route: "/v1/payment_intents/{intent_id}/refunds",
                ..FIRST
            },
            OperationIdentity {
                idempotency_key: "capture-order-2078",
                ..FIRST
            },
            OperationIdentity {
                fingerprint: "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752",
                ..FIRST
            },
        ];
        for other in others {
            assert_ne!(external_key(&other), external_key(&FIRST), "{other:?}");
        }
    }

    #[test]
    fn the_external_key_tells_apart_requests_whose_parts_only_run_together_the_same() {
        let split = |account_id, idempotency_key| OperationIdentity {
            account_id,
            idempotency_key,
            route: "",
            ..FIRST
        };
        assert_ne!(external_key(&split("acme", "-1")), external_key(&split("acme-", "1")));
    }

    #[test]
    fn the_external_key_is_a_key_any_provider_accepts() {
        let key = external_key(&FIRST);
        assert_eq!(key.len(), "retrysafe-".len() + 32, "{key}");
        assert!(key.starts_with("retrysafe-"), "{key}");
        assert!(key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'), "{key}");
    }
}

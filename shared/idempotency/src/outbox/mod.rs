//! Work that leaves the process (docs/contract.md §5, docs/design.md §5 and
//! §6): a payment provider's charge, a deployment controller's rollout. A
//! database transaction cannot take back a charge once it has left, so an
//! effect never calls the external system itself. It hands the work to the
//! outbox ([`Effect::with_outbox`](crate::Effect::with_outbox)): an **event**
//! written in the same transaction as the business rows and the operation's
//! first answer (a 202). The operation then stays `in_progress`, its answer
//! replayed to every retry, until the outbox settles it.
//!
//! # The life of an event
//!
//! ```text
//! pending ──worker takes it──► sending ──sent──► delivered | failed | unknown | pending, later
//! unknown, or sending past its lease ──reconciler asks──► delivered | pending, now | unknown
//! ```
//!
//! A **worker** ([`Outbox::deliver_due`]) takes due `pending` events, journals
//! `dispatched` with the take, sends each through the service's
//! [`Destination`] with an external idempotency key derived from the
//! operation id ([`external_key`]) — the same on every delivery and after
//! every restart — and settles the event, the operation and the service's
//! business rows in one transaction with what the external system said:
//!
//! | the external system… | event | operation | journal |
//! |---|---|---|---|
//! | accepted it | `delivered` | `completed`, with its `external_ref` | `dispatched`, `accepted`, `completed` |
//! | refused it, finally | `failed` | `failed` | `dispatched`, `failed` |
//! | cannot have taken it (unreachable, 408, a bare 429, 401/403) | `pending` again, after a backoff, same key | unchanged | `dispatched` |
//! | may have taken it or still be at it (answer lost, 409, 425, 429 with a reason, 5xx) | `unknown` | `unknown` | `dispatched`, `unknown` |
//!
//! Work that goes on at the external system after it accepted it (a rollout)
//! leaves the operation `in_progress`, with its `external_ref` and without
//! `completed`, until the service ends it with [`finish`].
//!
//! The **reconciler** ([`Outbox::reconcile_due`]) takes every event whose fate
//! nobody knows — `unknown`, or `sending` past its lease (a worker that died
//! holding it) — and *asks* the external system through
//! [`Destination::look_up`]: first by the external key, then by the service's
//! own reference, since keys expire and can be lost on the way. It never
//! guesses, never sends a second, different request for the same operation,
//! and never drops an event because a worker timed out:
//!
//! | the lookup… | event | operation | journal |
//! |---|---|---|---|
//! | found it | `delivered` | as accepted | `reconciled`, `completed` |
//! | found no trace of it | `pending`, due at once: sent again with the **same** key | unchanged | — |
//! | could not be made, or found something that is not it, the event `sending` | `unknown` | `unknown` | `unknown` |
//! | could not be made, or found something that is not it, the event `unknown` | `unknown`, asked again after a backoff | unchanged | — |
//!
//! Events are held under a lease (a token and the time it ends) while a worker
//! or the reconciler handles them, and every settlement is a compare-and-set on
//! that token: two processes on one database never settle one event twice, and
//! a holder that dies is replaced when its lease ends.
//!
//! # The files
//!
//! - `mod.rs`: [`Outbox`], which runs the two loops;
//! - `event.rs`: an event, and what a service gives the outbox: the
//!   [`Destination`] it sends to, the [`Ledger`] of its rows, the [`Witness`]
//!   a person's resolution is checked with;
//! - `worker.rs` and `reconciler.rs`: taking due events, delivering, asking;
//! - `plan.rs`: the rows of both tables above, one pure function from an
//!   outcome to what it writes; `settle.rs` writes it in one transaction;
//! - `store.rs`: the SQL that takes, lets go and settles events, one function
//!   per statement, both backends; `status.rs`: the reads of what an event
//!   shows (an operation's status, the lists that wait for a person);
//! - `ending.rs`: what the service ends itself ([`withdraw`], [`finish`]);
//! - `by_hand.rs`: what a person does when the outbox cannot settle an
//!   operation by itself ([`resolve`], checked with the external system
//!   through the service's [`Witness`]; [`redeliver`]);
//! - `answer.rs`: how an answer is read ([`Delivery::from_refusal`], [`Lookup`]);
//! - `config.rs`: the pace ([`OutboxConfig`]).

mod answer;
mod by_hand;
mod config;
mod ending;
pub mod event;
mod extension;
mod plan;
mod reconciler;
mod settle;
mod status;
mod store;
mod worker;

use std::sync::Arc;

use serde::Serialize;

pub use answer::{Delivery, Lookup, is_external_id};
pub use by_hand::{ByHandError, Resolution, Resolved, redeliver, resolve};
pub use config::OutboxConfig;
pub use ending::{finish, withdraw};
pub use event::{Asking, Destination, EventState, Ledger, OutboxEvent, Settlement, Settling, Witness};
pub use extension::Events;
pub use status::{DeliveryStatus, event_of};

use platform::{Timestamp, Tx};

use crate::{
    execute::Effect,
    handoff::{Handoff, Writing},
    layer::Idempotency,
    operation::OperationIdentity,
};

/// The principal the journal names for what the worker does.
pub const WORKER: &str = "system:outbox-worker";
/// The principal the journal names for what the reconciler does.
pub const RECONCILER: &str = "system:reconciler";

/// The external idempotency key of an operation's event: derived from the
/// operation id, so every delivery of it — after any retry or restart — is
/// the same request to the external system.
pub fn external_key(operation_id: &str) -> String {
    format!("retrysafe-{operation_id}")
}

/// What an effect hands to the outbox: the kind of work, in the service's
/// words, and what the [`Destination`] needs to send it. A payload that would
/// not serialise is kept as its error: the effect then fails with a server
/// error and nothing commits, rather than an event that says nothing.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    pub kind: &'static str,
    pub payload: Result<serde_json::Value, String>,
}

impl Message {
    pub fn new(kind: &'static str, payload: &impl Serialize) -> Self {
        Message {
            kind,
            payload: serde_json::to_value(payload).map_err(|e| e.to_string()),
        }
    }
}

/// An event is written as the effect's handed-on work, in its transaction.
impl Handoff for Message {
    fn write<'a>(&'a self, tx: &'a mut Tx, of: OperationIdentity<'a>, now: Timestamp) -> Writing<'a> {
        Box::pin(store::enqueue(tx, of, self, now))
    }
}

impl Effect {
    /// Work that leaves the process (a charge, a rollout): `payload` goes to
    /// the outbox as a `kind` event, in the transaction of this effect, and the
    /// outbox delivers it with a key derived from the operation id (see
    /// [`crate::outbox`]). The operation answers now — this effect's answer,
    /// usually a 202 with the resource in its first state — and stays
    /// `in_progress`, replaying that answer, until the delivery settles it.
    pub fn with_outbox(self, kind: &'static str, payload: &impl Serialize) -> Self {
        self.with_handoff(Message::new(kind, payload))
    }
}

/// The outbox of one service: its idempotency layer (database, journal, the
/// service's [`Ledger`]), the external system its events go to, and the pace.
#[derive(Debug)]
pub struct Outbox<D> {
    idempotency: Idempotency,
    ledger: Arc<dyn Ledger>,
    destination: Arc<D>,
    config: OutboxConfig,
}

impl<D> Clone for Outbox<D> {
    fn clone(&self) -> Self {
        Outbox {
            idempotency: self.idempotency.clone(),
            ledger: self.ledger.clone(),
            destination: self.destination.clone(),
            config: self.config.clone(),
        }
    }
}

impl<D: Destination> Outbox<D> {
    /// A lease no longer than the delivery timeout is made twice the timeout:
    /// otherwise every slow delivery would be taken over while it runs.
    ///
    /// # Panics
    ///
    /// If `idempotency` has no [`Ledger`] (events could be delivered but
    /// never settled in the service's rows) or no [`Witness`] (a person could
    /// not settle an operation the outbox cannot: nothing would check what
    /// they say). A wiring mistake, caught at start-up.
    pub fn new(idempotency: Idempotency, destination: D, mut config: OutboxConfig) -> Self {
        if config.lease <= config.delivery_timeout {
            tracing::warn!(lease = ?config.lease, timeout = ?config.delivery_timeout,
                "the outbox lease must outlast a delivery; using twice the delivery timeout");
            config.lease = config.delivery_timeout * 2;
        }
        let ledger = idempotency
            .ledger()
            .expect("an outbox settles its events in the service's ledger: give it with Idempotency::with_ledger");
        assert!(
            idempotency.witness().is_some(),
            "a person's resolution is checked with the external system: give it with Idempotency::with_witness"
        );
        Outbox {
            idempotency,
            ledger,
            destination: Arc::new(destination),
            config,
        }
    }

    pub fn destination(&self) -> &D {
        &self.destination
    }

    /// Runs the worker and the reconciler until the returned task is aborted,
    /// each in its own loop, so a slow delivery never holds up a lookup. The
    /// worker starts at once when an effect in this process wrote an event;
    /// otherwise both look every `poll`.
    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            tokio::join!(self.run_worker(), self.run_reconciler());
        })
    }
}

fn new_lease_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

//! Work that leaves the process (docs/contract.md §5, docs/design.md §5 and
//! §6): a payment provider's charge, a deployment controller's rollout. A
//! database transaction cannot take back a charge once it has left, so an
//! effect never calls the external system itself. It hands the work to the
//! outbox (`Effect::with_handoff(`[`Event::new`]`(kind, &payload))`, the
//! core's extension point for work an effect hands on): an **event** written
//! in the same transaction as the business rows and the operation's first
//! answer (a 202). The operation then stays `in_progress`, its answer
//! replayed to every retry, until the outbox settles it.
//!
//! This crate is an extension of the idempotency core, and the core knows
//! nothing of it. It plugs in where the core says work and its status go:
//! an event is the effect's [`Handoff`](idempotency::handoff::Handoff);
//! [`Events`] is its [`Extension`](idempotency::Extension) (the event's state
//! in an operation's status, the outbox's gauges, the operations it leaves
//! for a person), registered with `Idempotency::with_extension`, and it holds
//! the service's [`Ledger`] and [`Witness`], which [`Outbox`] and the settling
//! [`routes()`] find there; every transition it makes is reported to the
//! layer's sink (`Idempotency::transitions`), in the transaction that makes
//! it. It needs no other extension.
//!
//! Its tables stay in the core's migrations (`migrations/idempotency/`,
//! `idempotency::MIGRATIONS`): a migration already applied cannot move to
//! another migrator without breaking the databases that applied it.
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
//! [`Destination`] with an external idempotency key derived from what the
//! client sent ([`external_key`]) — the same on every delivery, after every
//! restart, and on a retry that runs again after a failover lost the
//! claim — and settles the event, the operation and the service's
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
//! # Where each part is
//!
//! From the bottom up: a module imports only modules listed before it, and
//! the crate's own items from where they are defined.
//!
//! - `answer.rs`: how an answer is read ([`Delivery::from_refusal`], [`Lookup`]);
//! - `config.rs`: the pace ([`OutboxConfig`]);
//! - `event.rs`: an event — what an effect hands on ([`Event`], with its
//!   [`external_key`]) and what a worker holds ([`OutboxEvent`]) — and what a
//!   service gives the outbox: the [`Destination`] it sends to, the
//!   [`Ledger`] of its rows, the [`Witness`] a person's resolution is
//!   checked with;
//! - `resolution.rs`: what a person found out at the external system ([`Resolution`]);
//! - `plan.rs`: the rows of both tables above and of a person's resolution,
//!   one pure function from an outcome to what it writes, and who journals
//!   it ([`WORKER`], [`RECONCILER`]);
//! - `status.rs`: the reads of what an event shows (an operation's status,
//!   the lists that wait for a person); `store.rs`: the SQL that writes,
//!   takes, lets go and settles events, one function per statement, both
//!   backends;
//! - `extension.rs`: [`Events`], the outbox as the layer's extension, with
//!   the service's [`Ledger`] and [`Witness`];
//! - `ending.rs`: what the service ends itself ([`withdraw`], [`finish`]);
//! - `by_hand.rs`: what a person does when the outbox cannot settle an
//!   operation by itself ([`resolve`], checked with the external system
//!   through the service's [`Witness`]; [`redeliver`]);
//! - `routes.rs`: the settling routes a service merges ([`routes()`], and
//!   [`routes::SettlingApi`] for its OpenAPI document);
//! - `lib.rs`: [`Outbox`], which runs the two loops: `worker.rs` and
//!   `reconciler.rs` take due events, deliver and ask; `settle.rs` writes
//!   what each came to in one transaction.

mod answer;
mod by_hand;
mod config;
mod ending;
mod event;
mod extension;
mod plan;
mod reconciler;
mod resolution;
pub mod routes;
mod settle;
mod status;
mod store;
mod worker;

use std::sync::Arc;

use idempotency::Idempotency;

pub use answer::{Delivery, Lookup, is_external_id};
pub use by_hand::{ByHandError, redeliver, resolve};
pub use config::OutboxConfig;
pub use ending::{finish, withdraw};
pub use event::{Destination, Event, Ledger, OutboxEvent, Settlement, Witness, external_key};
pub use extension::Events;
/// Where an event is, as an operation's status shows it: the core's, since
/// the status resource's shape is.
pub use idempotency::status::EventState;
pub use plan::{RECONCILER, WORKER};
pub use resolution::{Resolution, Resolved};
pub use routes::routes;
pub use status::{DeliveryStatus, event_of};

/// The outbox of one service: its idempotency layer (database, journal, and
/// the service's [`Ledger`] in its [`Events`]), the external system its
/// events go to, and the pace.
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
    /// If `idempotency` has no [`Events`] (events could be delivered but
    /// never settled in the service's rows, and a person's resolution would
    /// have nothing to check it with). A wiring mistake, caught at start-up.
    pub fn new(idempotency: Idempotency, destination: D, mut config: OutboxConfig) -> Self {
        if config.lease <= config.delivery_timeout {
            tracing::warn!(lease = ?config.lease, timeout = ?config.delivery_timeout,
                "the outbox lease must outlast a delivery; using twice the delivery timeout");
            config.lease = config.delivery_timeout * 2;
        }
        let ledger = idempotency.extension::<Events>().map(Events::ledger).expect(
            "an outbox settles its events in the service's ledger: add outbox::Events with Idempotency::with_extension",
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

//! Idempotent writes for services whose callers retry (docs/contract.md §1–§5).
//!
//! A service hands each POST that creates an effect to [`Idempotency::execute`]
//! with the validated command and a closure doing the business writes. The
//! crate does everything else, once: it parses the key ([`IdempotencyKey`]),
//! computes the [`Fingerprint`], claims the key under the primary key before any
//! effect, runs the closure in a transaction that also completes the
//! operation, and answers duplicates — replay byte for byte, 409 while running,
//! 422 for a changed request. [`routes`] serves the operation status resource;
//! [`reaper`] removes finished operations after the retention period.
//!
//! # How a route is shaped
//!
//! Nothing happens before the claim (docs/contract.md §3): an attempt answered
//! with a replay, a 409 or a 422 has had no effect at all. So every POST
//! handler does, in this order, and nothing else:
//!
//! 1. **parse** the request into a validated command (a 400 claims nothing);
//! 2. **look up, read-only**, what the command or an approver's summary needs
//!    (the intent a capture names, the release a rollback restores) — never a
//!    write, a call to another system or a state change;
//! 3. **[`Idempotency::execute`]** with a closure doing *every* write, in the
//!    transaction it is given. Work for another system is handed on
//!    ([`Effect::with_handoff`]: the `outbox` crate's events); a call whose
//!    answer the effect needs (a cancel at a controller) is the call-out of
//!    [`Idempotency::execute_calling_out`], made once the claim has committed;
//! 4. **answer** what the crate answers.
//!
//! A POST that needs no key (a cancel) keeps the same order with no claim:
//! whatever it sends out follows a committed record of the request.
//!
//! ```no_run
//! use axum::{Json, extract::State, http::StatusCode, response::Response};
//! use idempotency::{Attempt, Effect, Idempotency, IdempotencyHeaders};
//! use platform::{Principal, on_tx};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize, Serialize)]
//! struct CreateNote {
//!     text: String,
//! }
//!
//! async fn create_note(
//!     State(idempotency): State<Idempotency>,
//!     principal: Principal,
//!     key: IdempotencyHeaders,   // a missing or malformed key is a 400 that claims nothing
//!     Json(command): Json<CreateNote>,
//! ) -> Response {
//!     let attempt = Attempt::post("/v1/notes", &principal, key);
//!     idempotency
//!         .execute(attempt, &command, async |tx, operation| {
//!             on_tx!(tx, |conn| {
//!                 sqlx::query("INSERT INTO notes (account_id, operation_id, text) VALUES ($1, $2, $3)")
//!                     .bind(&principal.account_id)
//!                     .bind(operation.operation_id)
//!                     .bind(&command.text)
//!                     .execute(conn)
//!                     .await
//!                     .map(drop) // each backend says how many rows in a type of its own
//!             })?;
//!             Ok(Effect::json(StatusCode::CREATED, &command))
//!         })
//!         .await
//! }
//! ```
//!
//! # Where each part is
//!
//! From the bottom up: a module imports only modules listed before it.
//!
//! - [`key`], [`fingerprint`] and [`config`]: the `Idempotency-Key` header,
//!   what a request's fingerprint hashes, and the settings
//!   ([`IdempotencyConfig`], [`ClaimMode`]);
//! - [`transitions`]: what happens to an operation, and where it is
//!   reported ([`transitions::Sink`]), as the inbox row every sink reads
//!   ([`transitions::inbox`]);
//! - [`operation`]: an operation, its states, its stored answer, and its
//!   identity ([`OperationIdentity`]), the one way a journal record of it is built;
//! - [`handoff`]: work an effect hands on ([`handoff::Handoff`]);
//! - [`responses`]: the answers as HTTP responses, byte for byte, and the refusals;
//! - [`status`]: the operation status resource's shape, and the states of
//!   what extensions add to it;
//! - [`gate`]: a gate consulted before an operation's effect ([`gate::Gate`]);
//! - [`store`]: the operations table's statements — claim, complete, read, reap;
//!   [`replay_cache`] remembers finished answers, [`attempts`] counts attempts;
//! - [`layer`]: [`Idempotency`], one service's layer and its background work,
//!   and what an extension adds beside the write ([`Extension`]); `gauges.rs`
//!   are what `/metrics` reads from the database, each extension's included;
//! - [`reaper`]: removes what is past its retention;
//! - [`execute`]: one attempt, from its key to its answer: the two claim
//!   modes, what a taken key means (`execute/verdict.rs`, a pure function),
//!   and how a run ends (`execute/conclude.rs`);
//! - [`routes`]: the operation status routes every service mounts (the
//!   approvals', the journal's and the outbox's are in their crates).
//!
//! # Extension points
//!
//! What goes beyond the idempotent write is a crate on top of this one, which
//! depends on it and never the reverse: the `journal`, the `outbox`,
//! `approvals`. It plugs in at one of four points, each a trait the layer holds:
//!
//! - [`transitions::Sink`]: where transitions are reported, in the
//!   transaction that makes them (the journal is the sink every service
//!   reports to), given with [`Idempotency::with_sink`];
//! - [`handoff::Handoff`]: work an effect hands on, written in the effect's
//!   transaction, the operation `in_progress` until it is settled
//!   ([`Effect::with_handoff`]; the outbox's events are one);
//! - [`gate::Gate`]: a gate consulted before the effect, which may hold an
//!   operation `awaiting_approval` until a person decides, and is asked again
//!   in the effect's transaction before it runs, given with
//!   [`Idempotency::with_gate`] (approvals are the gate);
//! - [`Extension`]: what an extension shows and keeps beside the write — its
//!   part of an operation's status, its gauges, the operations it leaves for
//!   a person, its background work — given with [`Idempotency::with_extension`]
//!   and found again by its routes with [`Idempotency::extension`].
//!
//! What an extension uses of the core besides is public and says so: a
//! transaction of the layer ([`Idempotency::begin`]) and its sink
//! ([`Idempotency::transitions`]), the statements that settle an operation
//! whose work was handed on ([`store::settle_external`],
//! [`store::settle_unknown`]), an operation's identity
//! ([`OperationIdentity`]), the status resource's shape ([`status`]) and a
//! setting's number ([`config::number`]); an extension reads its gauges with
//! `platform::metrics::gauges`, as the core reads its own.

/// `as_str` and `parse` of an enum stored and sent as text, from one table
/// of its names, so that the two cannot disagree.
macro_rules! named {
    ($ty:ident { $($variant:ident = $name:literal,)* }) => {
        impl $ty {
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)*
                }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($name => Some($ty::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

pub mod attempts;
pub mod config;
pub mod execute;
#[doc(hidden)]
pub mod fail_point;
pub mod fingerprint;
pub mod gate;
mod gauges;
pub mod handoff;
pub mod key;
pub mod layer;
pub mod operation;
pub mod reaper;
pub mod replay_cache;
pub mod responses;
pub mod routes;
pub mod status;
pub mod store;
pub mod transitions;

pub use config::{ClaimMode, IdempotencyConfig};
pub use execute::{Attempt, Effect, IDEMPOTENT_REPLAYED, OPERATION_ID};
pub use fingerprint::Fingerprint;
pub use key::{IdempotencyHeaders, IdempotencyKey, OptionalIdempotencyHeaders};
pub use layer::{Background, Boxed, Extension, Idempotency};
pub use operation::{OperationIdentity, OperationRecord, OperationState, ResourceRef, StoredResponse};
/// The types this crate's API is written in (`Db`, `Tx`, `Principal`,
/// `ApiError`, `ApiJson`), so that a service needs no other crate of the project.
pub use platform;

/// The operations, approvals and audit journal tables, for both backends:
/// the extensions' tables too (the `approvals` and `journal` crates'), since a
/// migration already applied cannot move to another migrator.
pub static MIGRATIONS: platform::Migrations = platform::Migrations {
    postgres: sqlx::migrate!("../../migrations/idempotency/postgres"),
    sqlite: sqlx::migrate!("../../migrations/idempotency/sqlite"),
};

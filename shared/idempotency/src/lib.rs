//! Idempotent writes for services whose callers retry (docs/contract.md §1–§5, docs/design.md §1).
//!
//! A service hands each POST that creates an effect to [`Idempotency::execute`] with a closure doing
//! the business writes; the crate does the rest once: the key, the claim, every duplicate's answer.
//!
//! # How a route is shaped
//!
//! Nothing happens before the claim (docs/contract.md §3), so every POST handler does, in this
//! order, and nothing else:
//!
//! 1. **parse** the request into a validated command (a 400 claims nothing);
//! 2. **look up, read-only**, what the command or an approver's summary needs: never a write, a
//!    call to another system or a state change;
//! 3. **[`Idempotency::execute`]** with a closure doing *every* write, in the transaction it is
//!    given; work for another system is handed on ([`Effect::with_handoff`]) or is the call-out
//!    of [`Idempotency::execute_calling_out`], made once the claim has committed;
//! 4. **answer** what the crate answers.
//!
//! A POST that needs no key (a cancel) keeps the same order with no claim: whatever it sends out
//! follows a committed record of the request.
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
//! - [`key`], [`fingerprint`], [`config`]: the `Idempotency-Key` header, the request's hash, the settings;
//! - [`transitions`]: what happens to an operation, and the sink it is reported to;
//! - [`operation`]: an operation, its states, its stored answer and its identity;
//! - [`handoff`]: work an effect hands on;
//! - [`responses`]: the answers as HTTP responses, byte for byte, and the refusals;
//! - [`status`]: the operation status resource's shape;
//! - [`gate`]: a gate consulted before an operation's effect;
//! - [`store`]: the operations table's statements; [`replay_cache`] and [`attempts`] beside them;
//! - [`layer`]: [`Idempotency`], one service's layer, its background work and its gauges (`gauges.rs`);
//! - [`reaper`]: removes what is past its retention;
//! - [`execute`]: one attempt, from its key to its answer;
//! - [`routes`]: the operation status routes every service mounts.
//!
//! # Extension points
//!
//! An extension is a crate on top of this one, never the reverse (`journal`, `outbox`,
//! `approvals`). It plugs in at one of four traits the layer holds (docs/design.md §1):
//!
//! - [`transitions::Sink`] ([`Idempotency::with_sink`]): where transitions are reported, in the
//!   transaction that makes them (the journal);
//! - [`handoff::Handoff`] ([`Effect::with_handoff`]): work written in the effect's transaction,
//!   the operation `in_progress` until it is settled (the outbox's events);
//! - [`gate::Gate`] ([`Idempotency::with_gate`]): may hold an operation `awaiting_approval` before
//!   its effect, and is asked again in the effect's transaction (approvals);
//! - [`Extension`] ([`Idempotency::with_extension`]): its part of an operation's status, its
//!   gauges, the operations it leaves for a person, its background work.
//!
//! What else an extension uses is public and says so ([`Idempotency::begin`], [`Idempotency::transitions`],
//! [`OperationIdentity`], [`store::Completion`]). An extension that ends an operation waiting on it
//! (the outbox settling handed-on work, a rejected or expired approval) does so with a statement of
//! its own, a compare-and-set on the state it expects.

pub mod attempts;
pub mod config;
pub mod execute;
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
/// What every extension point returns: a boxed future, so that the layer can hold any extension.
pub use futures_core::future::BoxFuture;
pub use key::{IdempotencyHeaders, IdempotencyKey, OptionalIdempotencyHeaders};
pub use layer::{Background, Extension, Idempotency};
pub use operation::{OperationIdentity, OperationRecord, OperationState, ResourceRef, StoredResponse};
/// The types this crate's API is written in, so that a service needs no other crate of the project.
pub use platform;

/// The operations table and the extensions' tables (approvals, journal), for both backends:
/// a migration already applied cannot move to another migrator.
pub static MIGRATIONS: platform::Migrations = platform::Migrations {
    postgres: sqlx::migrate!("../../migrations/idempotency/postgres"),
    sqlite: sqlx::migrate!("../../migrations/idempotency/sqlite"),
};

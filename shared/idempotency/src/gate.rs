//! The extension point for a gate consulted before an operation's effect
//! (approvals are one: docs/contract.md §6, docs/design.md §7).
//!
//! An attempt whose route's policy asks for it ([`Attempt::approval`](crate::Attempt::approval))
//! claims its key as `awaiting_approval`, the gate's answer stored and
//! replayed while the operation waits. A retry asks the gate where it stands;
//! the run, once let, asks again in the effect's own transaction, so that a
//! promise broken meanwhile refuses it: the operation ends `rejected`, the
//! refusal its answer for good. Every write a gate makes is in a transaction
//! of the core's, beside the operation's own change, and every answer it
//! gives is stored as the operation's: a gate never answers a request itself.
//! A gate is an [`Extension`](crate::Extension) too
//! ([`Idempotency::with_gate`](crate::Idempotency::with_gate)).

use std::{any::Any, fmt::Debug, future::Future, pin::Pin};

use platform::{ApiError, Db, Timestamp, Tx};

/// Where an operation waiting at its gate stands: the status resource's
/// approval state, which the pure verdict decides a retry's fate from.
pub use crate::status::ApprovalState;
use crate::{
    operation::{OperationIdentity, OperationRecord, StoredResponse},
    transitions::{AuditEvent, Record},
};

/// What a gate's calls return: a boxed future, so that the layer can hold any gate.
pub type Asking<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a route's policy asks the gate for (approvals: the summary a human
/// judges). The core holds it for the attempt and hands it to the gate.
pub trait Request: Any + Debug + Send + Sync {}

impl<T: Any + Debug + Send + Sync> Request for T {}

/// The operation a gate is asked about as its key is claimed.
#[derive(Debug, Clone, Copy)]
pub struct Waiting<'a> {
    pub operation: OperationIdentity<'a>,
    /// The principal whose attempt asked.
    pub requested_by: &'a str,
    pub now: Timestamp,
    /// Until when it may wait: for a decision, and once decided for the
    /// retry that runs it ([`IdempotencyConfig::approval_ttl`](crate::IdempotencyConfig::approval_ttl)).
    pub until: Timestamp,
}

/// What the gate gives for an operation about to wait.
#[derive(Debug, Clone)]
pub struct Requested {
    /// What the operation waits for (its `approval_id`).
    pub id: String,
    /// The answer stored for the operation and replayed to its retries while
    /// it waits (a 202).
    pub answer: StoredResponse,
}

/// Why an operation that waited never runs: `answer` is stored as its
/// answer, the operation `rejected`, and the refusal journaled as `event`.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub answer: ApiError,
    pub event: AuditEvent,
}

/// A gate consulted before an operation's effect. An error from any call
/// answers a server error and changes nothing.
pub trait Gate: Debug + Send + Sync + 'static {
    /// What the operation `waiting` will wait for, as `asked`: its id and
    /// the answer stored for the operation while it waits. Nothing is
    /// written yet: the claim comes first.
    fn request(&self, waiting: &Waiting<'_>, asked: &dyn Request) -> Result<Requested, ApiError>;

    /// Writes what the operation `waiting` waits for (`requested`, as
    /// `asked`) in `tx`, the transaction that has just claimed its key as
    /// `awaiting_approval`.
    fn write<'a>(
        &'a self,
        tx: &'a mut Tx,
        waiting: &'a Waiting<'a>,
        asked: &'a dyn Request,
        requested: &'a Requested,
    ) -> Asking<'a, Result<(), ApiError>>;

    /// Where `operation`, which waits, stands as of `now`.
    fn state<'a>(
        &'a self,
        db: &'a Db,
        operation: &'a OperationRecord,
        now: Timestamp,
    ) -> Asking<'a, Result<ApprovalState, ApiError>>;

    /// Why `operation`, which waited and is now run, may not run after all,
    /// if it may not: asked in `tx`, the effect's transaction, before the
    /// effect. `asked` is what the route's policy asks for the request now.
    fn check<'a>(
        &'a self,
        tx: &'a mut Tx,
        operation: &'a OperationRecord,
        asked: Option<&'a dyn Request>,
        now: Timestamp,
    ) -> Asking<'a, Result<Option<Refusal>, ApiError>>;

    /// Whether `error`, which the effect of `operation` answered, is the
    /// gate's refusal (a promise the effect found broken in its own
    /// transaction); if so, how the operation ends.
    fn refusal(&self, error: &ApiError, operation: &OperationRecord) -> Option<Refusal>;

    /// Ends `operation`, whose wait ran out as of `now`, in `tx`: `rejected`,
    /// with the gate's refusal as its answer. What to journal of it, if it
    /// ended it; `None` when it was decided or started meanwhile, and nothing
    /// is to be kept of `tx`.
    fn expire<'a>(
        &'a self,
        tx: &'a mut Tx,
        operation: &'a OperationRecord,
        now: Timestamp,
    ) -> Asking<'a, Result<Option<Record>, ApiError>>;
}

/// What `asked` is, if it is a `T`: how a gate reads its own request.
pub fn read<T: Request>(asked: &dyn Request) -> Option<&T> {
    let any: &dyn Any = asked;
    any.downcast_ref()
}

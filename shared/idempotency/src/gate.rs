//! The extension point for a gate consulted before an operation's effect (approvals: docs/design.md
//! §1, §7). A gate never answers a request itself: every write it makes is in a transaction of the
//! core's, and every answer it gives is stored as the operation's.

use std::{any::Any, fmt::Debug};

use futures_core::future::BoxFuture;
use platform::{ApiError, Db, Timestamp, Tx};

/// Where an operation waiting at its gate stands, from which the pure verdict decides a retry's fate.
pub use crate::status::ApprovalState;
use crate::{
    operation::{OperationIdentity, OperationRecord, StoredResponse},
    transitions::{AuditEvent, Record},
};

/// What a route's policy asks the gate for (approvals: the summary a person judges).
pub trait Request: Any + Debug + Send + Sync {}

impl<T: Any + Debug + Send + Sync> Request for T {}

/// The operation a gate is asked about as its key is claimed.
#[derive(Debug, Clone, Copy)]
pub struct Waiting<'a> {
    pub operation: OperationIdentity<'a>,
    pub requested_by: &'a str,
    pub now: Timestamp,
    /// Until when it may wait, for a decision and then for the retry that runs it (`approval_ttl`).
    pub until: Timestamp,
}

/// What the gate gives for an operation about to wait.
#[derive(Debug, Clone)]
pub struct Requested {
    /// What the operation waits for (its `approval_id`).
    pub id: String,
    /// The answer stored and replayed to the operation's retries while it waits (a 202).
    pub answer: StoredResponse,
}

/// Why an operation that waited never runs: `answer` is stored, the operation `rejected`, `event` journaled.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub answer: ApiError,
    pub event: AuditEvent,
}

/// A gate consulted before an operation's effect. An error from any call is a server error and changes nothing.
pub trait Gate: Debug + Send + Sync + 'static {
    /// What `waiting` will wait for, as `asked`: its id and its answer. It writes nothing: the claim comes first.
    fn request(&self, waiting: &Waiting<'_>, asked: &dyn Request) -> Result<Requested, ApiError>;

    /// Writes what `waiting` waits for in `tx`, the transaction that has just claimed its key.
    fn write<'a>(
        &'a self,
        tx: &'a mut Tx,
        waiting: &'a Waiting<'a>,
        asked: &'a dyn Request,
        requested: &'a Requested,
    ) -> BoxFuture<'a, Result<(), ApiError>>;

    /// Where `operation`, which waits, stands as of `now`.
    fn state<'a>(
        &'a self,
        db: &'a Db,
        operation: &'a OperationRecord,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<ApprovalState, ApiError>>;

    /// Why `operation`, which waited, may not run after all: asked in the effect's `tx`, with what the
    /// route's policy asks for the request now.
    fn check<'a>(
        &'a self,
        tx: &'a mut Tx,
        operation: &'a OperationRecord,
        asked: Option<&'a dyn Request>,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Refusal>, ApiError>>;

    /// Whether `error` from the effect is the gate's refusal (a promise it found broken), and how the operation ends.
    fn refusal(&self, error: &ApiError, operation: &OperationRecord) -> Option<Refusal>;

    /// Ends `operation`, whose wait ran out, `rejected` in `tx`, and says what to journal; `None`
    /// when it was decided or started meanwhile, and nothing is to be kept of `tx`.
    fn expire<'a>(
        &'a self,
        tx: &'a mut Tx,
        operation: &'a OperationRecord,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, ApiError>>;
}

/// What `asked` is, if it is a `T`: how a gate reads its own request.
pub fn read<T: Request>(asked: &dyn Request) -> Option<&T> {
    let any: &dyn Any = asked;
    any.downcast_ref()
}

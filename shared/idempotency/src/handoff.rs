//! The extension point for work an effect hands on to something that
//! outlives the request (the outbox: docs/design.md §5).
//!
//! An effect that hands work on ([`Effect::with_handoff`](crate::Effect::with_handoff))
//! answers now, and its operation stays `in_progress`, replaying that first
//! answer, until whatever took the work settles it. The work is written in
//! the effect's own transaction, with the operation's first answer: it exists
//! if and only if the effect does. Once that transaction commits, the layer
//! wakes whatever waits for such work in this process
//! ([`Idempotency::work_handed_on`](crate::Idempotency::work_handed_on)).

use std::{future::Future, pin::Pin};

use platform::{Timestamp, Tx};

use crate::operation::OperationIdentity;

/// Work an effect hands on: how it is written beside the effect.
pub trait Handoff: std::fmt::Debug + Send + Sync + 'static {
    /// Writes the work for the operation `of` in `tx`, the effect's own
    /// transaction. An error rolls the effect back and answers a server error.
    fn write<'a>(&'a self, tx: &'a mut Tx, of: OperationIdentity<'a>, now: Timestamp) -> Writing<'a>;
}

/// What [`Handoff::write`] returns: its writes, as a boxed future, so that an
/// effect can carry any kind of work.
pub type Writing<'a> = Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'a>>;

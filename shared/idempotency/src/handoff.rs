//! The extension point for work an effect hands on to something that outlives the request (the
//! outbox: docs/design.md §1, §5). The work is written in the effect's transaction, so it exists
//! if and only if the effect does; the operation stays `in_progress` until the work is settled.

use std::{future::Future, pin::Pin};

use platform::{Timestamp, Tx};

use crate::operation::OperationIdentity;

/// Work an effect hands on: how it is written beside the effect.
pub trait Handoff: std::fmt::Debug + Send + Sync + 'static {
    /// Writes the work for `of` in `tx`, the effect's transaction; an error rolls the effect back.
    fn write<'a>(&'a self, tx: &'a mut Tx, of: OperationIdentity<'a>, now: Timestamp) -> Writing<'a>;
}

/// What [`Handoff::write`] returns, boxed so that an effect can carry any kind of work.
pub type Writing<'a> = Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'a>>;

//! The extension point for work an effect hands on to something that outlives the request (the
//! outbox: docs/design.md §1, §5). The work is written in the effect's transaction, so it exists
//! if and only if the effect does; the operation stays `in_progress` until the work is settled.

use futures_core::future::BoxFuture;
use platform::{Timestamp, Tx};

use crate::operation::OperationIdentity;

/// Work an effect hands on: how it is written beside the effect.
pub trait Handoff: std::fmt::Debug + Send + Sync + 'static {
    /// Writes the work for `of` in `tx`, the effect's transaction; an error rolls the effect back.
    fn write<'a>(
        &'a self,
        tx: &'a mut Tx,
        of: OperationIdentity<'a>,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;
}

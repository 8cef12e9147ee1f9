//! Retention: deleting finished operations (docs/design.md §4).

use platform::{Db, Timestamp, on_pool};

/// Deletes finished operations last touched before `cutoff`.
pub async fn reap(db: &Db, cutoff: Timestamp) -> Result<u64, sqlx::Error> {
    // UUIDv7 ids sort by creation and an operation finishes after it is
    // created, so the operation_id index up to `cutoff`'s first id finds them
    // all, and no index of the reaper's own costs every write an entry
    // (docs/design.md §4)
    const REAP: &str = "DELETE FROM idempotency_operations \
         WHERE operation_id < $1 AND state IN ('completed', 'failed', 'rejected') AND updated_at < $2";
    Ok(on_pool!(db.write(), |pool| {
        sqlx::query(REAP)
            .bind(crate::operation::first_operation_id_at(cutoff))
            .bind(cutoff)
            .execute(pool)
            .await?
            .rows_affected()
    }))
}

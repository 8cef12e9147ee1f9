//! Retention: a finished operation is deleted once its answer has been kept
//! as long as promised; one running, awaiting a decision or unknown never is.

use platform::{Db, Timestamp, on_pool};

/// Deletes finished operations last touched before `cutoff`. Operations
/// `in_progress`, `awaiting_approval` or `unknown` are never reaped.
pub async fn reap(db: &Db, cutoff: Timestamp) -> Result<u64, sqlx::Error> {
    // Operation ids are UUIDv7, which sort by creation time, and an operation
    // finishes after it is created: every operation finished before `cutoff`
    // has an id below the first id of `cutoff`'s millisecond. So the reaper
    // walks the operation_id index up to there, and no index of its own costs
    // every write an entry.
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

//! What `GET /metrics` reads from the database: counts over the whole
//! service database, no account in any label (docs/metrics.md).

use platform::{
    Timestamp,
    metrics::{
        gauges::{age, counts, oldest, set_each, set_pools},
        names,
    },
};

use crate::layer::Idempotency;

const UNFINISHED: [&str; 3] = ["in_progress", "awaiting_approval", "unknown"];

/// `/metrics` needs no key, so a flood of scrapes must not be one of queries.
const READ_AT_MOST_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// A starved database is when metrics matter most: serve them stale, not late.
const READ_AT_MOST_FOR: std::time::Duration = std::time::Duration::from_secs(2);

/// Sets the pool gauges, and the rest unless fresh; one read at a time.
pub(crate) async fn refresh_if_stale(idempotency: &Idempotency) -> Result<(), sqlx::Error> {
    set_pools(&idempotency.db, &idempotency.metrics);
    let mut read_at = idempotency.gauges_read.lock().await;
    if read_at.is_some_and(|at| at.elapsed() < READ_AT_MOST_EVERY) {
        return Ok(());
    }
    tokio::time::timeout(READ_AT_MOST_FOR, refresh(idempotency))
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)??;
    *read_at = Some(std::time::Instant::now());
    Ok(())
}

async fn refresh(idempotency: &Idempotency) -> Result<(), sqlx::Error> {
    let (db, metrics) = (&idempotency.db, &idempotency.metrics);
    let now = Timestamp::now();

    let operations = counts(
        db,
        // spelled as the partial index's WHERE is, so that SQLite sees it can read the index
        "SELECT state, COUNT(*) FROM idempotency_operations \
         WHERE state = 'in_progress' OR state = 'awaiting_approval' OR state = 'unknown' GROUP BY state",
    )
    .await?;
    set_each(metrics, names::OPERATIONS, &UNFINISHED, &operations);
    let oldest_unknown = oldest(
        db,
        "SELECT MIN(updated_at) FROM idempotency_operations WHERE state = 'unknown'",
    )
    .await?;
    metrics.set(names::OLDEST_UNKNOWN, &[], age(oldest_unknown, now));

    for extension in idempotency.extensions() {
        extension.read_gauges(db, metrics, now).await?;
    }
    idempotency.transitions.read_gauges(db, metrics).await
}

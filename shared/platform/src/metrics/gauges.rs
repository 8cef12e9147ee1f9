//! Gauges a service reads from its database at a scrape of `/metrics`: counts
//! by state, the age of the oldest row waiting, and the pools' connections.
//! The idempotency layer reads its own with these, and each extension its own.

use crate::{
    Db, Timestamp,
    metrics::{Metrics, names},
    on_pool,
};

/// This process's connections, per pool: read from the pools, not the database.
pub fn set_pools(db: &Db, metrics: &Metrics) {
    for pool in db.pool_stats() {
        let in_use = f64::from(pool.size) - pool.idle as f64;
        metrics.set(
            names::DB_CONNECTIONS,
            &[("pool", pool.name), ("state", "in_use")],
            in_use.max(0.0),
        );
        metrics.set(
            names::DB_CONNECTIONS,
            &[("pool", pool.name), ("state", "idle")],
            pool.idle as f64,
        );
        metrics.set(names::DB_MAX_CONNECTIONS, &[("pool", pool.name)], f64::from(pool.max));
    }
}

/// `(state, count)` rows of a `GROUP BY state`, for an extension's gauges too.
pub async fn counts(db: &Db, sql: &'static str) -> Result<Vec<(String, i64)>, sqlx::Error> {
    Ok(on_pool!(db.read(), |pool| sqlx::query_as(sql).fetch_all(pool).await?))
}

/// The one timestamp a `SELECT MIN(…)` reads, if any row has one.
pub async fn oldest(db: &Db, sql: &'static str) -> Result<Option<Timestamp>, sqlx::Error> {
    Ok(on_pool!(db.read(), |pool| sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await?))
}

/// Each of `states` set from `rows`, 0 where no row names it: a state that
/// empties must read 0, not keep its last value.
pub fn set_each(metrics: &Metrics, name: &'static str, states: &[&'static str], rows: &[(String, i64)]) {
    for &state in states {
        let count = rows.iter().find(|(s, _)| s == state).map_or(0, |(_, n)| *n);
        metrics.set(name, &[("state", state)], count as f64);
    }
}

/// Seconds from `since` to `now`; 0 when there is nothing to age.
pub fn age(since: Option<Timestamp>, now: Timestamp) -> f64 {
    since.map_or(0.0, |at| {
        (now.as_datetime() - at.as_datetime()).num_milliseconds().max(0) as f64 / 1000.0
    })
}

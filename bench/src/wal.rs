//! What one create writes to the write-ahead log, idempotent and layer off.

use std::time::Duration;

use platform::Db;

use crate::{creates::create_directly, load::median, report::WalPerCreate, service::Service};

/// What one create writes to the WAL, idempotent and layer off (see
/// [`WalPerCreate`]): the median of three samples of sequential creates.
pub async fn wal_per_create(on: &Service, off: &Service, quick: bool) -> WalPerCreate {
    let (unit, creates) = match on.db {
        // few enough that SQLite's automatic checkpoint (at 1000 frames) does not restart the log
        Db::Sqlite(_) => ("pages", if quick { 5 } else { 40 }),
        Db::Postgres(_) => ("bytes", if quick { 20 } else { 200 }),
    };
    let mut samples = (Vec::new(), Vec::new());
    for sample in 0..3 {
        samples
            .0
            .push(wal_written(on, creates, &format!("wal-on-{sample}")).await);
        samples
            .1
            .push(wal_written(off, creates, &format!("wal-off-{sample}")).await);
    }
    let (on, off) = (median(samples.0.into_iter()), median(samples.1.into_iter()));
    WalPerCreate {
        unit: unit.into(),
        creates,
        on,
        off,
        ratio: on / off,
    }
}

/// `creates` creates, one after another, and the WAL they wrote per create:
/// SQLite's frames (the log is emptied first), PostgreSQL's bytes (the
/// journal's pending round included; the cluster's WAL is shared, so other
/// databases must be quiet meanwhile).
pub async fn wal_written(service: &Service, creates: u64, tag: &str) -> f64 {
    let idempotency = &service.app.idempotency;
    idempotency.flush_journal().await;
    let create_all = async {
        for n in 0..creates {
            assert!(
                create_directly(&service.app, &format!("{tag}-{}-{n}", std::process::id())).await,
                "a create failed while measuring the WAL"
            );
        }
        idempotency.flush_journal().await;
    };
    let written = match service.db.write() {
        platform::Pool::Sqlite(pool) => {
            // (busy, frames in the log, frames checkpointed); busy while a
            // reader (the chainer's, say) still reads from the log
            let mut emptied = false;
            for _ in 0..100 {
                let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
                    .fetch_one(pool)
                    .await
                    .unwrap();
                if busy == 0 {
                    emptied = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(emptied, "the WAL could not be emptied: a reader stayed in the way");
            create_all.await;
            let (_, frames, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
                .fetch_one(pool)
                .await
                .unwrap();
            frames as f64
        }
        platform::Pool::Postgres(pool) => {
            let start: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
                .fetch_one(pool)
                .await
                .unwrap();
            create_all.await;
            sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::float8")
                .bind(start)
                .fetch_one(pool)
                .await
                .unwrap()
        }
    };
    written / creates as f64
}

//! Counting attempts (`attempts` in the operation status) off the hot path.
//!
//! Every request that carries a key is one more attempt. Writing that count
//! with each replay would make a replay — which otherwise only reads — wait
//! for a write (SQLite's single writer, PostgreSQL's WAL flush). So attempts
//! are counted in memory and written in coalesced batches, with relaxed
//! durability; a status read in this process writes them first, so what it
//! shows is exact. A crash may lose the last few increments: `attempts` is
//! for people reading the history, and no outcome depends on it.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use platform::Db;

use crate::store;

#[derive(Debug, Default)]
pub struct AttemptCounter {
    pending: Mutex<HashMap<(String, String), i32>>,
    wake: tokio::sync::Notify,
    /// One flush at a time, so two never add the same increments.
    flushing: tokio::sync::Mutex<()>,
}

impl AttemptCounter {
    /// Counts one more request for `(account_id, key)`; never waits.
    pub fn count(&self, account_id: &str, key: &str) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        *pending.entry((account_id.to_owned(), key.to_owned())).or_insert(0) += 1;
        self.wake.notify_one();
    }

    /// Writes every pending count.
    pub async fn flush(&self, db: &Db) -> Result<(), sqlx::Error> {
        let _one_at_a_time = self.flushing.lock().await;
        let batch = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        let mut unwritten = batch.into_iter();
        while let Some(((account_id, key), n)) = unwritten.next() {
            if let Err(e) = store::add_attempts(db, &account_id, &key, n).await {
                // keep what was not written for the next round
                let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                for (id, count) in std::iter::once(((account_id, key), n)).chain(unwritten) {
                    *pending.entry(id).or_insert(0) += count;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Flushes shortly after counts arrive, coalescing whatever comes meanwhile.
    pub async fn write_continuously(&self, db: &Db) {
        loop {
            self.wake.notified().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let Err(e) = self.flush(db).await {
                tracing::warn!(error = %e, "could not write attempt counts; they are kept for the next round");
            }
        }
    }
}

//! Counting attempts in memory and writing them in batches, with relaxed
//! durability, so that a replay waits for no write unless the counts of
//! [`KEYS_COUNTED_AT_MOST`] keys already wait (docs/design.md §4).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use platform::Db;

use crate::store;

/// Keys whose counts one process holds at most, unwritten: a few MB.
pub const KEYS_COUNTED_AT_MOST: usize = 10_000;

/// How long a request that found no room waits after a refused write.
const WRITE_AGAIN_AFTER: Duration = Duration::from_millis(100);

/// How long counts gather before they are written: a key retried in a tight
/// loop is written once in this time, not once a retry. A status read writes
/// this process's counts first, so it shows them exact.
const GATHER_FOR: Duration = Duration::from_secs(1);

/// The attempt counts of one process. A cheap handle: clones share them.
#[derive(Debug, Clone, Default)]
pub struct AttemptCounter {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Counts not written yet. One leaves only once written, so what is held
    /// never outgrows [`KEYS_COUNTED_AT_MOST`].
    pending: Mutex<HashMap<(String, String), i32>>,
    wake: tokio::sync::Notify,
    /// One flush at a time, so two never add the same increments.
    flushing: tokio::sync::Mutex<()>,
}

impl AttemptCounter {
    /// How many keys have counts waiting to be written.
    pub fn pending(&self) -> usize {
        self.counts().len()
    }

    /// Counts one more request; when there is no room, writes the others first.
    pub async fn count(&self, db: &Db, account_id: &str, key: &str) {
        while !self.add(account_id, key) {
            if let Err(e) = self.flush(db).await {
                tracing::warn!(error = %e, "could not write attempt counts to make room; this request waits and tries again");
                tokio::time::sleep(WRITE_AGAIN_AFTER).await;
            }
        }
        self.shared.wake.notify_one();
    }

    /// Adds one to the key's count, unless it is a new key and there is no room.
    fn add(&self, account_id: &str, key: &str) -> bool {
        let mut counts = self.counts();
        let id = (account_id.to_owned(), key.to_owned());
        if let Some(n) = counts.get_mut(&id) {
            *n += 1;
            return true;
        }
        if counts.len() >= KEYS_COUNTED_AT_MOST {
            return false;
        }
        counts.insert(id, 1);
        true
    }

    fn counts(&self) -> MutexGuard<'_, HashMap<(String, String), i32>> {
        self.shared.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes every pending count, in a task of its own: a caller that went
    /// away must not stop it between writing a count and taking it out.
    pub async fn flush(&self, db: &Db) -> Result<(), sqlx::Error> {
        let (counter, db) = (self.clone(), db.clone());
        tokio::spawn(async move { counter.write_pending(&db).await })
            .await
            // the task panicked, or the runtime is shutting down
            .unwrap_or_else(|stopped| Err(sqlx::Error::Io(std::io::Error::other(stopped))))
    }

    async fn write_pending(&self, db: &Db) -> Result<(), sqlx::Error> {
        let _one_at_a_time = self.shared.flushing.lock().await;
        let batch: Vec<((String, String), i32)> = self.counts().iter().map(|(id, n)| (id.clone(), *n)).collect();
        for (id, n) in batch {
            store::add_attempts(db, &id.0, &id.1, n).await?;
            // what was counted meanwhile stays for the next flush
            let mut counts = self.counts();
            if let Some(left) = counts.get_mut(&id) {
                *left -= n;
                if *left == 0 {
                    counts.remove(&id);
                }
            }
        }
        Ok(())
    }

    /// Flushes a second after counts arrive, coalescing whatever comes meanwhile.
    pub async fn write_continuously(self, db: Db) {
        loop {
            self.shared.wake.notified().await;
            tokio::time::sleep(GATHER_FOR).await;
            if let Err(e) = self.flush(&db).await {
                tracing::warn!(error = %e, "could not write attempt counts; they are kept for the next round");
            }
        }
    }
}

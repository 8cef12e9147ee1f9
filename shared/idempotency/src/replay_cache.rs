//! Recent finished answers, which never change, kept in memory to answer
//! replays with no query; a miss goes to the database (docs/design.md §4).

use std::{
    num::NonZeroUsize,
    sync::{Arc, Mutex},
    time::Duration,
};

use platform::{Timestamp, db::Outages};

use crate::{fingerprint::Fingerprint, operation::OperationState, operation::StoredResponse};

/// A finished operation, as a replay needs it.
#[derive(Debug)]
pub struct CachedAnswer {
    pub operation_id: String,
    pub fingerprint: Fingerprint,
    pub state: OperationState,
    pub response: StoredResponse,
    /// When the cached answer stops being served: before the reaper may
    /// delete the row, so memory never answers for a key the database forgot.
    expires_at: Timestamp,
    /// Outages seen when the attempt that learned it began: after another,
    /// the database may no longer have the operation.
    outages_seen: u64,
}

/// `(account_id, idempotency_key)` → the answer, least recently used evicted first.
type Entries = lru::LruCache<(String, String), Arc<CachedAnswer>>;

#[derive(Debug)]
pub struct ReplayCache {
    entries: Option<Mutex<Entries>>,
    lifetime: Duration,
    outages: Outages,
}

impl ReplayCache {
    /// Holds up to `capacity` answers (0: off), each until `lifetime` after
    /// its operation finished (the retention less a margin) or an outage.
    pub fn new(capacity: usize, lifetime: Duration, outages: Outages) -> Self {
        ReplayCache {
            entries: NonZeroUsize::new(capacity).map(|c| Mutex::new(lru::LruCache::new(c))),
            lifetime,
            outages,
        }
    }

    pub fn get(&self, account_id: &str, key: &str) -> Option<Arc<CachedAnswer>> {
        let mut entries = self.entries.as_ref()?.lock().unwrap_or_else(|p| p.into_inner());
        let id = (account_id.to_owned(), key.to_owned());
        match entries.get(&id) {
            // an answer learned before the last outage seen may name rows the database lost
            Some(answer) if Timestamp::now() < answer.expires_at && answer.outages_seen == self.outages.seen() => {
                Some(answer.clone())
            }
            Some(_) => {
                entries.pop(&id);
                None
            }
            None => None,
        }
    }

    /// Remembers a finished operation's answer (an unfinished one is ignored)
    /// until `finished` plus the cache's lifetime, with the outages seen as its
    /// attempt began.
    #[allow(clippy::too_many_arguments)]
    pub fn put(
        &self,
        account_id: &str,
        key: &str,
        operation_id: &str,
        fingerprint: &Fingerprint,
        state: OperationState,
        response: &StoredResponse,
        finished: Timestamp,
        outages_seen: u64,
    ) {
        let Some(entries) = self.entries.as_ref() else { return };
        if !state.is_finished() {
            return;
        }
        let answer = CachedAnswer {
            operation_id: operation_id.to_owned(),
            fingerprint: fingerprint.clone(),
            state,
            response: response.clone(),
            expires_at: finished.plus(self.lifetime),
            outages_seen,
        };
        entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .put((account_id.to_owned(), key.to_owned()), Arc::new(answer));
    }
}

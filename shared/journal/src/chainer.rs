//! The chainer: one task per service database that links what waits into
//! the chain, in rounds, so no write waits on the chain — the transitions in
//! `audit_inbox`, and the observations this process holds — and that
//! refuses a journal cut under it (docs/design.md §8).

use std::{
    collections::VecDeque,
    sync::{
        Arc, LazyLock, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use platform::{
    Db, Tx,
    metrics::{Metrics, names},
    on_pool, on_tx,
};

use platform::fail_point::fail_point;

use crate::{
    chain::{AuditEntry, Head, Record, chained},
    inbox,
    query::{HEAD, InboxRow, head_or_genesis},
};

/// How often the chainer links what is waiting, at the latest.
const CHAIN_EVERY: Duration = Duration::from_millis(100);

/// Inbox records, and observations, one round links at most: it bounds the
/// round's transaction, and on SQLite the time it holds the one writer that
/// every create waits for.
const ROUND_SIZE: usize = 5_000;

/// Observations one process holds at most while they wait for a round: two
/// rounds' worth, a few MB. Past it they are written to the inbox (see
/// [`Journal::observe`]).
pub const OBSERVATIONS_HELD_AT_MOST: usize = 2 * ROUND_SIZE;

/// How long a producer waits before it tries again to write the held
/// observations, when the database refused them.
const WRITE_AGAIN_AFTER: Duration = Duration::from_millis(100);

/// Serialises rounds on PostgreSQL, across processes (`pg_advisory_xact_lock`);
/// any constant that no other part of the database uses. SQLite's rounds are
/// serialised by its one writer. Whoever holds it holds the chain: no round
/// links until it is released.
pub const CHAIN_LOCK: i64 = 0x0a0d_1700_c4a1;

/// The journal of one service database, as one process feeds it: what
/// reaches the chain, the rounds that link it, and the head it last linked.
/// A cheap handle: clones share it.
///
/// Two kinds of events, two kinds of durability:
/// - a **transition** (claimed, completed, failed, approval_requested,
///   approved, …) is recorded in `audit_inbox` by [`record`](crate::record)
///   in the transaction that makes it, so it is never lost, and never
///   recorded for a change that rolled back;
/// - an **observation** (an attempt answered from what is stored: replayed,
///   key_reused, in_progress) changes nothing, so this process holds it in
///   memory ([`Journal::observe`]) and a replay writes nothing. A crash loses
///   at most what is held. Written to the inbox and read back, each would
///   cost the round twice as much, and replays come many times faster than
///   creates. At most [`OBSERVATIONS_HELD_AT_MOST`] are held: a producer
///   that finds no room writes them all to the inbox first, where they wait
///   like transitions (see [`Journal::observe`]).
///
/// A round, in one transaction under the chain's lock: read the head and
/// check it (below); take a batch out of the inbox in id order (one `DELETE
/// … RETURNING`, so what is linked is exactly what was removed); add the
/// held observations that may follow it (below); put the batch in the order
/// its events happened, hash it onto the head, insert it, commit. The
/// observations leave memory only once the round has committed, so a round
/// that dies anywhere before its commit leaves the inbox, the chain and the
/// held observations as they were. Across operations the chain's order is
/// the order of linking, and `at` says when each event happened.
///
/// **An observation follows the transition it saw.** Its cause committed
/// before the observation was made, so it is in the inbox for every
/// statement that runs after (PostgreSQL's READ COMMITTED takes a snapshot
/// a statement; SQLite has one writer), or already linked. A round that
/// empties what it can see of the inbox takes the cause too: it links every
/// held observation. A full round leaves records behind, so the first full
/// round that passes an observation over stamps it with the highest inbox id
/// left (read after its take): the cause, if still waiting, has an id no
/// higher. Rounds take the inbox in id order, so once a round leaves nothing
/// up to the stamp, the cause is linked — in that round or before — and the
/// observation goes in with it. A record with a lower id that commits late
/// (PostgreSQL hands out ids before commit) only delays it: it committed
/// after the observation, so it is not its cause. So a busy inbox delays
/// observations by the rounds it holds, and never starves them. Observations
/// written to the inbox are ordered by their ids, given after their
/// causes'. A round and a write of the held observations never overlap
/// (one lock in this process), so this process's observations keep their
/// order.
///
/// **The head it last linked.** The process remembers the newest entry it
/// linked or found. A round that finds that entry gone or changed — the
/// journal was cut or rewritten under the running service, its guards
/// dropped — links nothing: it logs the entry it remembers (the head to
/// verify against), counts it (`retrysafe_journal_head_behind_total`), and
/// everything keeps waiting, rather than link new entries onto a head
/// behind it and reuse the removed entries' numbers. Once the journal holds
/// that entry again (restored), rounds go on. A restart forgets it: the new
/// process starts from the head it finds, and logs it.
#[derive(Debug, Clone, Default)]
pub struct Journal {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// The observations this process holds, oldest first; never more than
    /// [`OBSERVATIONS_HELD_AT_MOST`].
    held: Mutex<VecDeque<Held>>,
    /// One round at a time in this process (across processes, the chain's lock).
    round: tokio::sync::Mutex<()>,
    /// A round and a write of the held observations to the inbox never run
    /// together: each copies the oldest held observations and removes them
    /// once it has committed. Taken once the database's own lock is held
    /// (the chain's lock, SQLite's writer), never before, so neither can
    /// wait for the other in the other order.
    linking: tokio::sync::Mutex<()>,
    /// One write of the held observations at a time: the producers that
    /// find no room wait for it.
    writing: tokio::sync::Mutex<()>,
    /// The newest entry this process linked or found in the chain.
    head: Mutex<Option<Head>>,
    /// Whether the last round found the journal behind `head`.
    refusing: AtomicBool,
}

/// An observation this process holds.
#[derive(Debug)]
struct Held {
    /// Shared, so that a round copies it out from under the lock that every
    /// replay takes to hold its own, not while holding it.
    record: Arc<Record>,
    /// The highest inbox id its cause can have, stamped by the first full
    /// round that passed it over: it is linked once none up to it is left.
    behind: Option<i64>,
}

/// Why a round linked nothing.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The journal no longer holds the entry this process last linked, as
    /// it linked it: it was cut or rewritten under the running service.
    #[error(
        "the audit journal no longer holds entry {linked} as this process linked it (it ends at {found}): \
         it was cut or rewritten under the running service; nothing is linked onto it"
    )]
    Cut { linked: Head, found: Head },
    /// The task running the rounds panicked, or the runtime is shutting down.
    #[error("the journal's rounds stopped halfway: {0}")]
    Stopped(String),
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Entries it appended: inbox records and observations.
    pub entries: usize,
    /// Held observations among them.
    pub observations: usize,
    /// Whether it took as many inbox records as a round can: more may wait.
    pub full: bool,
}

impl Journal {
    /// How many observations this process holds, waiting for a round.
    pub fn queued(&self) -> usize {
        self.held().len()
    }

    /// Holds an observation for the next round. It waits only when the
    /// process holds [`OBSERVATIONS_HELD_AT_MOST`] already: then every held
    /// observation is written to the inbox first, in one transaction, and
    /// linked from there like a transition — none is dropped, and no more
    /// are held. While the database refuses that write (it is down), the
    /// producer waits and tries again: a replay is then answered once the
    /// database takes writes again, or its client gives up and retries.
    pub async fn observe(&self, db: &Db, record: Record) {
        let mut record = record;
        while let Some(no_room) = self.hold(record) {
            self.make_room(db).await;
            record = no_room;
        }
    }

    /// Holds `record` if there is room for it, or gives it back.
    fn hold(&self, record: Record) -> Option<Record> {
        let mut held = self.held();
        if held.len() >= OBSERVATIONS_HELD_AT_MOST {
            return Some(record);
        }
        held.push_back(Held {
            record: Arc::new(record),
            behind: None,
        });
        None
    }

    fn held(&self) -> MutexGuard<'_, VecDeque<Held>> {
        self.shared.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes every held observation to the inbox, or waits for the
    /// producer doing so.
    async fn make_room(&self, db: &Db) {
        let _one_write_at_a_time = self.shared.writing.lock().await;
        if self.queued() < OBSERVATIONS_HELD_AT_MOST {
            // the write before this one made room
            return;
        }
        let (journal, db) = (self.clone(), db.clone());
        // a task of its own: once the write commits, what it wrote must leave
        // memory, even if this request's client hung up meanwhile
        if let Err(e) = tokio::spawn(async move { journal.write_held(&db).await }).await {
            tracing::error!(error = %e, "writing the held audit observations to the inbox stopped halfway");
        }
    }

    /// Writes the held observations to the inbox, trying again until the
    /// database takes them.
    async fn write_held(&self, db: &Db) {
        while let Err(e) = self.try_write_held(db).await {
            tracing::warn!(
                error = %e,
                "could not write the held audit observations to the inbox; their producers wait, and it is tried again"
            );
            tokio::time::sleep(WRITE_AGAIN_AFTER).await;
        }
    }

    async fn try_write_held(&self, db: &Db) -> Result<(), sqlx::Error> {
        let mut tx = db.begin().await?;
        let _no_round = self.shared.linking.lock().await;
        let shared: Vec<Arc<Record>> = self.held().iter().map(|held| held.record.clone()).collect();
        let copies: Vec<Record> = shared.iter().map(|record| Record::clone(record)).collect();
        inbox::record_many(&mut tx, &copies).await?;
        tx.commit().await?;
        // what leaves memory is freed once the lock is let go
        let written: Vec<Held> = self.held().drain(..copies.len()).collect();
        drop(written);
        Ok(())
    }

    /// Links everything waiting into the chain, a round at a time until a
    /// round finds less than it can take. Returns how many entries it
    /// appended. Each round's duration goes to `metrics`.
    ///
    /// The rounds run as a task of their own: a round removes from memory
    /// what it linked once it has committed, so a caller that went away
    /// mid-round (a client that hung up on `GET /v1/audit`) must not stop
    /// it between the two.
    pub async fn chain_pending(&self, db: &Db, metrics: &Metrics) -> Result<usize, ChainError> {
        let (journal, db, metrics) = (self.clone(), db.clone(), metrics.clone());
        let rounds = tokio::spawn(async move {
            let _one_round_at_a_time = journal.shared.round.lock().await;
            let mut appended = 0;
            loop {
                let round = journal.timed_round(&db, &metrics).await?;
                appended += round.entries;
                if !round.full && round.observations < ROUND_SIZE {
                    return Ok(appended);
                }
            }
        });
        rounds.await.unwrap_or_else(|e| Err(ChainError::Stopped(e.to_string())))
    }

    /// One round (see [`Journal`]), and what it did. Its caller must not go
    /// away before it ends; [`chain_pending`](Self::chain_pending) makes sure.
    pub async fn chain_round(&self, db: &Db, metrics: &Metrics) -> Result<Round, ChainError> {
        let _one_round_at_a_time = self.shared.round.lock().await;
        self.timed_round(db, metrics).await
    }

    async fn timed_round(&self, db: &Db, metrics: &Metrics) -> Result<Round, ChainError> {
        let started = Instant::now();
        let round = self.round(db, metrics).await;
        metrics.observe(names::CHAIN_ROUND_DURATION, &[], started.elapsed());
        round
    }

    async fn round(&self, db: &Db, metrics: &Metrics) -> Result<Round, ChainError> {
        if self.queued() == 0 && !inbox_has_records(db).await? {
            // an idle service takes no lock
            return Ok(Round::default());
        }
        let mut tx = db.begin().await?;
        lock_chain(&mut tx).await?;
        let _no_write_of_held = self.shared.linking.lock().await;
        let head = head_or_genesis(on_tx!(&mut tx, |conn| sqlx::query_as(HEAD)
            .fetch_optional(conn)
            .await?));
        self.check_head(&mut tx, &head, metrics).await?;
        let (observed, behind): (Vec<Arc<Record>>, Vec<Option<i64>>) = self
            .held()
            .iter()
            .take(ROUND_SIZE)
            .map(|held| (held.record.clone(), held.behind))
            .unzip();
        let mut batch = take_batch(&mut tx).await?;
        let full = batch.len() == ROUND_SIZE;
        let left = if full { inbox_ids_left(&mut tx).await? } else { None };
        let (linkable, behind) = may_follow(&behind, left);
        batch.extend(observed.iter().take(linkable).map(|record| Record::clone(record)));
        // stable: records that share a time keep their order
        batch.sort_by_key(|record| record.at);
        let entries = chained(head.clone(), batch);
        insert_entries(&mut tx, &entries).await?;
        fail_point("audit::chain_round").await;
        tx.commit().await?;
        {
            // committed: what it linked leaves memory, what it passed over keeps its stamp
            let mut held = self.held();
            let linked: Vec<Held> = held.drain(..linkable).collect();
            for (held, stamp) in held.iter_mut().zip(&behind[linkable..]) {
                held.behind = *stamp;
            }
            drop(held);
            // freed once the lock is let go
            drop(linked);
        }
        let (seq, hash) = entries.last().map_or(head, |last| (last.seq, last.hash.clone()));
        self.remember(Head { seq, hash });
        Ok(Round {
            entries: entries.len(),
            observations: linkable,
            full,
        })
    }

    /// Refuses a journal that no longer holds, as it was, the newest entry
    /// this process linked or found: its tail was cut or rewritten under it.
    async fn check_head(&self, tx: &mut Tx, head: &(i64, String), metrics: &Metrics) -> Result<(), ChainError> {
        let Some(known) = self.known_head().filter(|known| known.seq > 0) else {
            return Ok(());
        };
        let hash: Option<String> = on_tx!(tx, |conn| sqlx::query_scalar(
            "SELECT hash FROM audit_journal WHERE seq = $1"
        )
        .bind(known.seq)
        .fetch_optional(conn)
        .await?);
        if hash.as_deref() == Some(known.hash.as_str()) {
            if self.shared.refusing.swap(false, Ordering::Relaxed) {
                tracing::info!(seq = known.seq, hash = %known.hash, "the audit journal holds entry {known} again: linking resumes");
            }
            return Ok(());
        }
        metrics.count(names::JOURNAL_HEAD_BEHIND, &[]);
        let (seq, hash) = head.clone();
        let cut = ChainError::Cut {
            linked: known,
            found: Head { seq, hash },
        };
        // once, not every round: the metric counts each round refused
        if !self.shared.refusing.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "{cut}. Everything waits. Restore the journal until `audit verify --pin` with this head holds, \
                 and linking resumes; a restart accepts the journal as it is (docs/design.md §8)"
            );
        }
        Err(cut)
    }

    fn known_head(&self) -> Option<Head> {
        self.shared.head.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Remembers `head` as the newest entry this process linked or found.
    pub(crate) fn remember(&self, head: Head) {
        *self.shared.head.lock().unwrap_or_else(|p| p.into_inner()) = Some(head);
    }

    /// The head to publish (`GET /v1/audit/head`): the database's, unless
    /// the journal was found cut under this process — then the entry it last
    /// linked, which is what the journal must be verified against.
    pub fn published_head(&self, in_database: Head) -> Head {
        match self.known_head() {
            Some(known) if self.shared.refusing.load(Ordering::Relaxed) => known,
            _ => in_database,
        }
    }

    /// A round every `CHAIN_EVERY`, whatever arrives meanwhile: the fewer
    /// rounds, the less each event costs (one transaction and one commit a
    /// round). A reader of the journal (`GET /v1/audit`, the tests) runs a
    /// round first and so never waits for the next tick.
    pub async fn chain_continuously(&self, db: &Db, metrics: &Metrics) {
        let mut tick = tokio::time::interval(CHAIN_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.chain_pending(db, metrics).await {
                log_unlinked(&e);
            }
        }
    }
}

/// Logs why a round linked nothing, unless the round did (a cut journal is
/// logged once, when it is found).
pub(crate) fn log_unlinked(e: &ChainError) {
    if !matches!(e, ChainError::Cut { .. }) {
        tracing::warn!(error = %e, "could not link audit events; they wait for the next round");
    }
}

/// How many of the held observations `behind` (oldest first, each with its
/// stamp) may follow a round's batch, and each one's stamp after the round.
/// `left`: the lowest and highest inbox ids a full round left behind, none
/// if it left nothing (or was not full). An observation not stamped yet is
/// stamped with the highest id left; one may follow once nothing up to its
/// stamp is left. The oldest go first, so this process's observations keep
/// their order.
fn may_follow(behind: &[Option<i64>], left: Option<(i64, i64)>) -> (usize, Vec<Option<i64>>) {
    let Some((lowest, highest)) = left else {
        return (behind.len(), vec![None; behind.len()]);
    };
    let stamps: Vec<i64> = behind.iter().map(|stamp| stamp.unwrap_or(highest)).collect();
    let linkable = stamps.iter().take_while(|&&stamp| stamp < lowest).count();
    (linkable, stamps.into_iter().map(Some).collect())
}

/// The lowest and highest inbox ids left, as the round's transaction sees
/// them after its take; none if it is empty. Each by the primary key's
/// index (SQLite reads both ends by it only one aggregate at a time).
async fn inbox_ids_left(tx: &mut Tx) -> Result<Option<(i64, i64)>, sqlx::Error> {
    const LEFT: &str = "SELECT (SELECT MIN(id) FROM audit_inbox), (SELECT MAX(id) FROM audit_inbox)";
    let (lowest, highest): (Option<i64>, Option<i64>) = on_tx!(tx, |conn| sqlx::query_as(LEFT).fetch_one(conn).await?);
    Ok(lowest.zip(highest))
}

/// By the primary key's index, like the round's own read: the inbox is a
/// queue, and until a vacuum its table is mostly rows already deleted.
async fn inbox_has_records(db: &Db) -> Result<bool, sqlx::Error> {
    const FIRST: &str = "SELECT id FROM audit_inbox ORDER BY id LIMIT 1";
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query_scalar::<_, i64>(FIRST)
            .fetch_optional(pool)
            .await?
            .is_some()
    }))
}

async fn lock_chain(tx: &mut Tx) -> Result<(), sqlx::Error> {
    if let Tx::Postgres(pg) = tx {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(CHAIN_LOCK)
            .execute(&mut **pg)
            .await?;
    }
    Ok(())
}

/// Takes the oldest `ROUND_SIZE` records out of the inbox, in inbox order.
async fn take_batch(tx: &mut Tx) -> Result<Vec<Record>, sqlx::Error> {
    // the limit is in the text, not bound: SQLite plans a bound LIMIT by its value, so every
    // binding would make it prepare the statement again, holding the one writer
    static TAKE: LazyLock<String> = LazyLock::new(|| {
        format!(
            "DELETE FROM audit_inbox \
             WHERE (account_id, id) IN (SELECT account_id, id FROM audit_inbox ORDER BY id LIMIT {ROUND_SIZE}) \
             RETURNING id, account_id, principal_id, operation_id, idempotency_key, fingerprint, route, \
                       event, external_ref, at, attempt, resource_type, resource_id, state, evidence"
        )
    });
    let mut taken = on_tx!(tx, |conn| {
        sqlx::query_as::<_, InboxRow>(TAKE.as_str())
            .fetch_all(conn)
            .await?
            .into_iter()
            .map(|row| Ok::<_, sqlx::Error>((row.id, Record::try_from(row.record)?)))
            .collect::<Result<Vec<_>, _>>()?
    });
    // RETURNING promises no order
    taken.sort_unstable_by_key(|(id, _)| *id);
    Ok(taken.into_iter().map(|(_, record)| record).collect())
}

/// Appends `entries`, in order, in one statement; the database checks each
/// entry's link as it goes in. The entries travel as one JSON array, in a
/// statement whose text never changes: bound one parameter a field, a
/// round's entries cost more to bind and to parse than to write, and under
/// SQLite's one writer every create waits for them.
async fn insert_entries(tx: &mut Tx, entries: &[AuditEntry]) -> Result<(), sqlx::Error> {
    const POSTGRES: &str = "INSERT INTO audit_journal \
         (seq, account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, \
          at, attempt, resource_type, resource_id, state, evidence, prev_hash, hash) \
         SELECT * FROM jsonb_to_recordset($1::jsonb) AS e \
             (seq bigint, account_id text, principal_id text, operation_id text, idempotency_key text, \
              fingerprint text, route text, event text, external_ref text, at timestamptz, attempt bigint, \
              resource_type text, resource_id text, state text, evidence text, prev_hash text, hash text) \
         ORDER BY seq";
    const SQLITE: &str = "INSERT INTO audit_journal \
         (seq, account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, \
          at, attempt, resource_type, resource_id, state, evidence, prev_hash, hash) \
         SELECT value->>'seq', value->>'account_id', value->>'principal_id', value->>'operation_id', \
                value->>'idempotency_key', value->>'fingerprint', value->>'route', value->>'event', \
                value->>'external_ref', value->>'at', value->>'attempt', value->>'resource_type', \
                value->>'resource_id', value->>'state', value->>'evidence', value->>'prev_hash', value->>'hash' \
         FROM jsonb_each($1) ORDER BY key";
    let json = serde_json::to_string(entries).map_err(|e| sqlx::Error::Encode(e.into()))?;
    tx.insert_json_rows([POSTGRES, SQLITE], json, entries.len()).await
}

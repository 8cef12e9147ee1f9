//! The chainer: one task per service database that links what waits in
//! `audit_inbox` into the chain, in rounds, so no write waits on the chain
//! (docs/design.md §8).

use platform::metrics::{Metrics, names};
use std::{sync::Mutex, time::Duration};

use platform::{Db, Timestamp, Tx, on_pool, on_tx};
use sqlx::Row;

use super::{
    chain::{AuditEntry, GENESIS, Record, chained},
    query::decode_record,
};
use crate::execute::fail_point;

/// How often the chainer links what is waiting, at the latest.
const CHAIN_EVERY: Duration = Duration::from_millis(100);

/// Inbox records, and observations, one round links at most: it bounds the
/// round's transaction, and on SQLite the time it holds the one writer that
/// every create waits for.
const ROUND_SIZE: usize = 5_000;

/// Serialises rounds on PostgreSQL, across processes (`pg_advisory_xact_lock`);
/// any constant that no other part of the database uses. SQLite's rounds are
/// serialised by its one writer.
const CHAIN_LOCK: i64 = 0x0a0d_1700_c4a1;

/// The journal of one service database: what reaches the chain, and the
/// rounds that link it.
///
/// Two kinds of events, two kinds of durability:
/// - a **transition** (claimed, completed, failed, approval_requested,
///   approved, …) is recorded in `audit_inbox` by [`record`](super::record)
///   in the transaction that makes it, so it is never lost, and never
///   recorded for a change that rolled back;
/// - an **observation** (an attempt answered from what is stored: replayed,
///   key_reused, in_progress) changes nothing, so it waits in memory
///   ([`Journal::observe`]) and a replay never waits for a write. A crash
///   loses at most the observations of the last round. Written to the inbox
///   and read back, each would cost the round twice as much, and replays come
///   many times faster than creates.
///
/// A round, in one transaction under the chain's lock: read the head; take a
/// batch out of the inbox in inbox order (one `DELETE … RETURNING`, so what
/// is linked is exactly what was removed) and, unless that left more
/// waiting, add the waiting observations; put the batch in the order its
/// events happened, hash it onto the head, insert it, commit. A round that dies anywhere before its commit leaves
/// the inbox and the chain as they were. An observation saw a state that had
/// committed before it, so its cause is in the same round or an earlier one:
/// each operation's entries are in the order they happened. Across
/// operations the chain's order is the order of linking, and `at` says when
/// each event happened.
#[derive(Debug, Default)]
pub struct Journal {
    observed: Mutex<Vec<Record>>,
    /// One round at a time in this process (across processes, the chain's lock).
    round: tokio::sync::Mutex<()>,
}

impl Journal {
    /// How many observations wait in this process's memory for a round.
    pub fn queued(&self) -> usize {
        self.queue().len()
    }

    /// Queues observations; never waits.
    pub fn observe(&self, records: impl IntoIterator<Item = Record>) {
        self.queue().extend(records);
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Record>> {
        self.observed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts observations a round did not link back at the head of the queue.
    fn queue_again(&self, observed: Vec<Record>) {
        let mut queue = self.queue();
        let newer = std::mem::replace(&mut *queue, observed);
        queue.extend(newer);
    }

    /// Links everything waiting into the chain, a round at a time until a
    /// round finds less than it can take. Returns how many entries it
    /// appended. On failure the round's observations are queued again. Each
    /// round's duration goes to `metrics`.
    pub async fn chain_pending(&self, db: &Db, metrics: &Metrics) -> Result<usize, sqlx::Error> {
        let _one_round_at_a_time = self.round.lock().await;
        let mut appended = 0;
        loop {
            let observed = {
                let mut queue = self.queue();
                let at_most = queue.len().min(ROUND_SIZE);
                let rest = queue.split_off(at_most);
                std::mem::replace(&mut *queue, rest)
            };
            let started = std::time::Instant::now();
            let linked = round(db, &observed).await;
            metrics.observe(names::CHAIN_ROUND_DURATION, &[], started.elapsed());
            match linked {
                Ok(linked) if linked.full => {
                    // the observations waited: what they saw may be among what the inbox still holds
                    appended += linked.entries;
                    self.queue_again(observed);
                }
                Ok(linked) => {
                    appended += linked.entries;
                    if observed.len() < ROUND_SIZE {
                        return Ok(appended);
                    }
                }
                Err(e) => {
                    self.queue_again(observed);
                    return Err(e);
                }
            }
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
                tracing::warn!(error = %e, "could not link audit events; they wait for the next round");
            }
        }
    }
}

/// What a round linked: how many entries, and whether it took as many inbox
/// records as a round can. A full round may leave behind the transition an
/// observation saw, so it links no observations: they wait for a round that
/// empties the inbox.
struct Linked {
    entries: usize,
    full: bool,
}

/// One round (see [`Journal`]).
async fn round(db: &Db, observed: &[Record]) -> Result<Linked, sqlx::Error> {
    if observed.is_empty() && !inbox_has_records(db).await? {
        // an idle service takes no lock
        return Ok(Linked {
            entries: 0,
            full: false,
        });
    }
    let mut tx = db.begin().await?;
    lock_chain(&mut tx).await?;
    let head = head_or_genesis(on_tx!(&mut tx, |conn| sqlx::query_as(HEAD)
        .fetch_optional(conn)
        .await?));
    let mut batch = take_batch(&mut tx).await?;
    let full = batch.len() == ROUND_SIZE;
    if !full {
        batch.extend_from_slice(observed);
    }
    // stable: records that share a time keep their order
    batch.sort_by_key(|record| record.at);
    let entries = chained(head, batch);
    insert_entries(&mut tx, &entries).await?;
    fail_point("audit::chain_round").await;
    tx.commit().await?;
    Ok(Linked {
        entries: entries.len(),
        full,
    })
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

/// The chain's last entry, `(seq, hash)` (none while the chain is empty).
pub(super) const HEAD: &str = "SELECT seq, hash FROM audit_journal ORDER BY seq DESC LIMIT 1";

/// What the next entry follows: the last entry's `(seq, hash)`, or `(0, GENESIS)`.
pub(super) fn head_or_genesis(last: Option<(i64, String)>) -> (i64, String) {
    last.unwrap_or((0, GENESIS.to_owned()))
}

/// Takes the oldest `ROUND_SIZE` records out of the inbox, in inbox order.
async fn take_batch(tx: &mut Tx) -> Result<Vec<Record>, sqlx::Error> {
    const TAKE: &str = "DELETE FROM audit_inbox \
         WHERE id IN (SELECT id FROM audit_inbox ORDER BY id LIMIT $1) \
         RETURNING id, account_id, principal_id, operation_id, idempotency_key, fingerprint, route, \
                   event, external_ref, at, attempt, resource_type, resource_id, state, evidence";
    let mut taken = on_tx!(tx, |conn| {
        sqlx::query(TAKE)
            .bind(ROUND_SIZE as i64)
            .fetch_all(conn)
            .await?
            .iter()
            .map(taken_record)
            .collect::<Result<Vec<_>, _>>()?
    });
    // RETURNING promises no order
    taken.sort_unstable_by_key(|(id, _)| *id);
    Ok(taken.into_iter().map(|(_, record)| record).collect())
}

fn taken_record<R>(row: &R) -> Result<(i64, Record), sqlx::Error>
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok((row.try_get("id")?, decode_record(row)?))
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
    let inserted = match &mut *tx {
        Tx::Postgres(pg) => sqlx::query(POSTGRES)
            .bind(json)
            .execute(&mut **pg)
            .await?
            .rows_affected(),
        Tx::Sqlite(lite) => sqlx::query(SQLITE)
            .bind(json)
            .execute(&mut **lite)
            .await?
            .rows_affected(),
    };
    if inserted != entries.len() as u64 {
        // cannot happen: the database refuses the whole statement, or takes every entry
        return Err(sqlx::Error::Protocol("the audit entries did not all go in".into()));
    }
    Ok(())
}

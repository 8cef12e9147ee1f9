//! The chainer: one task per service database that moves what waits (the
//! inbox, the observations queued in memory, SQLite's claims) into the chain
//! in rounds, so no write waits on the chain (docs/design.md §8).

use std::{sync::Mutex, time::Duration};

use platform::{Db, Pool, Timestamp, Tx, on_pool, on_tx};
use sqlx::Row;

use super::{
    append::{HEAD, head_or_genesis, insert_entries, lock_chain},
    chain::{AuditEntry, Record, chained},
    claims::{CLAIMS_MARK, Claims, unlinked_claims},
    query::decode_record,
};

/// How often the chainer links what is waiting, at the latest.
const CHAIN_EVERY: Duration = Duration::from_millis(100);

/// Inbox records a process's rounds delete before it vacuums the inbox
/// (PostgreSQL). Every create puts records in and a round takes them out, so
/// the table is a queue: its dead rows stay until a VACUUM, and every round's
/// read of the inbox scans them all. Autovacuum comes a minute apart at best,
/// and may be off; a vacuum every few thousand records keeps each read small
/// at a small cost per create.
const VACUUM_INBOX_AFTER: u64 = 5_000;

/// The journal of one service database: links recorded transitions and
/// observed attempts into the chain, in batches.
///
/// Two kinds of events, two kinds of durability:
/// - a **transition** (claimed, completed, failed, approval_requested,
///   approved, rejected, expired, …) is recorded in the transaction that
///   makes it — by [`record`](super::record), into `audit_inbox`; on SQLite, a claim that
///   finishes in its own transaction keeps its records in its operation row
///   (see [`finished_claim`](super::finished_claim)) — so it is never lost, and never recorded for a
///   change that rolled back;
/// - an **observation** (an attempt answered from what is stored: replayed,
///   key_reused, in_progress) changes nothing, so it is queued in memory
///   ([`Journal::observe`]) and never makes a replay wait for a write. A crash
///   loses at most the observations of the last round (`CHAIN_EVERY`).
///
/// A round takes the queued observations *first*, then reads what waits in
/// the database: an observation saw a state that had committed before it, so
/// its cause is in this round or an earlier one, and sorting a round by time
/// puts it after. Each operation's entries are in the order they happened;
/// across operations the chain's order is the order of linking, and `at`
/// says when each event happened.
#[derive(Debug, Default)]
pub struct Journal {
    observed: Mutex<Vec<Record>>,
    /// One round at a time in this process (across processes, a round that
    /// finds that another linked first prepares its batch again under the
    /// lock; see `link`). It holds how many inbox records this process's
    /// rounds have deleted since it last vacuumed the inbox.
    round: tokio::sync::Mutex<u64>,
}

impl Journal {
    /// Queues observations; never waits.
    pub fn observe(&self, records: impl IntoIterator<Item = Record>) {
        self.observed.lock().unwrap_or_else(|p| p.into_inner()).extend(records);
    }

    /// One round: links everything waiting into the chain. Returns how many
    /// entries it appended. On failure the observations are queued again.
    pub async fn chain_pending(&self, db: &Db) -> Result<usize, sqlx::Error> {
        let mut deleted_since_vacuum = self.round.lock().await;
        let observed = std::mem::take(&mut *self.observed.lock().unwrap_or_else(|p| p.into_inner()));
        match link(db, &observed).await {
            Ok(linked) => {
                *deleted_since_vacuum += linked.inbox_deleted;
                if *deleted_since_vacuum >= VACUUM_INBOX_AFTER {
                    *deleted_since_vacuum = 0;
                    vacuum_inbox(db).await;
                }
                Ok(linked.entries.len())
            }
            Err(e) => {
                let mut queue = self.observed.lock().unwrap_or_else(|p| p.into_inner());
                let newer = std::mem::replace(&mut *queue, observed);
                queue.extend(newer);
                Err(e)
            }
        }
    }

    /// A round every `CHAIN_EVERY`, whatever arrives meanwhile: the
    /// fewer rounds, the less each event costs (one transaction and one
    /// commit a round). A reader of the journal (`GET /v1/audit`, the
    /// tests) runs a round first and so never waits for the next tick.
    pub async fn chain_continuously(&self, db: &Db) {
        let mut tick = tokio::time::interval(CHAIN_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.chain_pending(db).await {
                tracing::warn!(error = %e, "could not link audit events; they wait for the next round");
            }
        }
    }
}

/// What a round linked: the entries it appended, and how many inbox records
/// it deleted.
pub(super) struct Linked {
    entries: Vec<AuditEntry>,
    inbox_deleted: u64,
}

/// Removes the inbox's dead rows (PostgreSQL; see [`VACUUM_INBOX_AFTER`]).
/// It never blocks the creates that insert and the rounds that delete: it
/// skips the table if another process is vacuuming it, and leaves the table at
/// its size (`vacuum_truncate = false`), since shrinking it would lock every
/// create out. A failure costs only speed, so it is logged, not returned.
async fn vacuum_inbox(db: &Db) {
    if let Pool::Postgres(pool) = db.write()
        && let Err(e) = sqlx::raw_sql("VACUUM (SKIP_LOCKED) audit_inbox").execute(pool).await
    {
        tracing::warn!(error = %e, "could not vacuum the audit inbox; its reads slow down until it is");
    }
}

/// One round. Everything that takes time is done before the chain is locked:
/// the head is read, then what waits (all from committed state), and the
/// records are hashed onto the head. The transaction then only checks that no
/// other round linked since, writes, marks what it linked (deletes exactly
/// the inbox records it read; on SQLite, moves the claims' mark), and
/// commits: on SQLite it holds the one writer that long, and every create
/// waits behind it.
///
/// The head is read *first*: if it has not moved by the time the chain is
/// locked, no other round linked anything since, so everything read is still
/// waiting (and on SQLite, which reuses the ids of an emptied inbox, still the
/// record read). On SQLite the claims' mark, read with the claims, is checked
/// too: a round with nothing to link still moves it past operations journaled
/// otherwise. If either has moved — another process's round — the round reads
/// again and hashes under the lock, where nothing moves.
async fn link(db: &Db, observed: &[Record]) -> Result<Linked, sqlx::Error> {
    let head = head_or_genesis(on_pool!(db.read(), |pool| sqlx::query_as(HEAD)
        .fetch_optional(pool)
        .await?));
    let waiting = match db.read() {
        Pool::Postgres(pool) => Waiting::on_postgres(&mut *pool.acquire().await?).await?,
        Pool::Sqlite(pool) => Waiting::on_sqlite(&mut *pool.acquire().await?).await?,
    };
    if waiting.is_empty() && observed.is_empty() {
        return Ok(Linked {
            entries: Vec::new(),
            inbox_deleted: 0,
        });
    }
    let mut round = Round::of(head.clone(), waiting, observed);

    let mut tx = db.begin().await?;
    lock_chain(&mut tx).await?;
    let current = head_or_genesis(on_tx!(&mut tx, |conn| sqlx::query_as(HEAD)
        .fetch_optional(conn)
        .await?));
    let mark = match &mut tx {
        Tx::Postgres(_) => None,
        Tx::Sqlite(lite) => Some(sqlx::query_scalar(CLAIMS_MARK).fetch_one(&mut **lite).await?),
    };
    if current != head || mark != round.claims.map(|(after, _)| after) {
        let waiting = match &mut tx {
            Tx::Postgres(pg) => Waiting::on_postgres(pg).await?,
            Tx::Sqlite(lite) => Waiting::on_sqlite(lite).await?,
        };
        round = Round::of(current, waiting, observed);
    }
    insert_entries(&mut tx, &round.entries).await?;
    let deleted = match &mut tx {
        Tx::Postgres(pg) => sqlx::query("DELETE FROM audit_inbox WHERE id = ANY($1)")
            .bind(&round.inbox_ids)
            .execute(&mut **pg)
            .await?
            .rows_affected(),
        Tx::Sqlite(lite) => sqlx::query("DELETE FROM audit_inbox WHERE id IN (SELECT value FROM json_each($1))")
            .bind(serde_json::to_string(&round.inbox_ids).map_err(|e| sqlx::Error::Encode(e.into()))?)
            .execute(&mut **lite)
            .await?
            .rows_affected(),
    };
    let marked = match (&mut tx, round.claims) {
        (Tx::Sqlite(lite), Some((after, upto))) if upto > after => {
            sqlx::query("UPDATE audit_progress SET operations_seq = $2 WHERE operations_seq = $1")
                .bind(after)
                .bind(upto)
                .execute(&mut **lite)
                .await?
                .rows_affected()
                == 1
        }
        _ => true,
    };
    if deleted != round.inbox_ids.len() as u64 || !marked {
        // cannot happen while rounds lock the chain; if it does, nothing is linked twice
        tx.rollback().await?;
        return Err(sqlx::Error::Protocol(
            "what waits for the audit chain changed under a locked round".into(),
        ));
    }
    tx.commit().await?;
    Ok(Linked {
        entries: round.entries,
        inbox_deleted: deleted,
    })
}

/// What waits in the database for a round: the inbox's records, with their
/// ids, and on SQLite the claims not linked yet.
pub(super) struct Waiting {
    inbox: Vec<(i64, Record)>,
    claims: Option<Claims>,
}

impl Waiting {
    async fn on_postgres(conn: &mut sqlx::PgConnection) -> Result<Waiting, sqlx::Error> {
        let rows = sqlx::query(READ_INBOX).fetch_all(conn).await?;
        Ok(Waiting {
            inbox: rows.iter().map(waiting).collect::<Result<_, _>>()?,
            claims: None,
        })
    }

    /// The inbox *first*: a transition of an operation commits after its
    /// claim, so every inbox record read then has its claim read after it
    /// (or linked before), and an operation's entries never run ahead of its
    /// claim's, even when the two reads see different moments.
    async fn on_sqlite(conn: &mut sqlx::SqliteConnection) -> Result<Waiting, sqlx::Error> {
        let rows = sqlx::query(READ_INBOX).fetch_all(&mut *conn).await?;
        Ok(Waiting {
            inbox: rows.iter().map(waiting).collect::<Result<_, _>>()?,
            claims: Some(unlinked_claims(conn).await?),
        })
    }

    fn is_empty(&self) -> bool {
        self.inbox.is_empty() && self.claims.as_ref().is_none_or(|c| c.upto == c.after)
    }
}

/// What one round links: the waiting records and the observations, in the
/// order they happened, hashed onto a head.
struct Round {
    inbox_ids: Vec<i64>,
    /// The claims' mark before and after this round (SQLite).
    claims: Option<(i64, i64)>,
    entries: Vec<AuditEntry>,
}

impl Round {
    fn of(head: (i64, String), waiting: Waiting, observed: &[Record]) -> Round {
        let inbox_ids = waiting.inbox.iter().map(|(id, _)| *id).collect();
        let claims = waiting.claims.as_ref().map(|c| (c.after, c.upto));
        // claims first: a transition of the same operation sharing its claim's
        // time still follows it
        let mut batch: Vec<Record> = waiting
            .claims
            .into_iter()
            .flat_map(|c| c.records)
            .chain(waiting.inbox.into_iter().map(|(_, r)| r))
            .chain(observed.iter().cloned())
            .collect();
        // stable: events of one transaction share a time and keep their order
        batch.sort_by_key(|r| r.at);
        Round {
            inbox_ids,
            claims,
            entries: chained(head, batch),
        }
    }
}

/// The waiting records, oldest first, with their ids (decoded by [`waiting`]).
const READ_INBOX: &str = "SELECT id, account_id, principal_id, operation_id, idempotency_key, fingerprint, route, \
     event, external_ref, at, resource_type, resource_id, state FROM audit_inbox ORDER BY id";

fn waiting<R>(row: &R) -> Result<(i64, Record), sqlx::Error>
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok((row.try_get("id")?, decode_record(row)?))
}

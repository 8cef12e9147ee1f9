//! The audit journal (CONTRACT §8): an append-only, hash-chained record of
//! what happened to every operation, one chain per service database.
//!
//! Each entry carries `prev_hash` and `hash = sha256(prev_hash ‖
//! canonical_json(entry))`, the entry being every field but `hash`. The
//! database refuses UPDATE, DELETE and TRUNCATE on the table (triggers), and
//! an entry whose `prev_hash` is not the hash of the entry before it (`seq`
//! is the primary key): no writer can fork the chain or leave a gap in it.
//! Appends are serialised (PostgreSQL: an advisory lock held to the end of
//! the transaction; SQLite: its one writer).
//! [`verify`] checks a chain offline and names the first broken entry.
//!
//! How events reach the chain without serialising every write on it: see
//! [`Journal`].

use std::{sync::Mutex, time::Duration};

use platform::{Db, Timestamp, Tx, on_pool, on_tx};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::fingerprint::canonical_json;

/// The hash before the first entry.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Serialises appenders on PostgreSQL (`pg_advisory_xact_lock`); any constant
/// that no other part of the database uses.
const CHAIN_LOCK: i64 = 0x0a0d_1700_c4a1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditEvent {
    Attempted,
    Claimed,
    Replayed,
    KeyReused,
    InProgress,
    ApprovalRequested,
    Approved,
    Rejected,
    Expired,
    Dispatched,
    Accepted,
    Completed,
    Failed,
    Unknown,
    Reconciled,
    /// A claim freed after a server error: nothing happened, the key may be claimed again.
    Released,
}

impl AuditEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditEvent::Attempted => "attempted",
            AuditEvent::Claimed => "claimed",
            AuditEvent::Replayed => "replayed",
            AuditEvent::KeyReused => "key_reused",
            AuditEvent::InProgress => "in_progress",
            AuditEvent::ApprovalRequested => "approval_requested",
            AuditEvent::Approved => "approved",
            AuditEvent::Rejected => "rejected",
            AuditEvent::Expired => "expired",
            AuditEvent::Dispatched => "dispatched",
            AuditEvent::Accepted => "accepted",
            AuditEvent::Completed => "completed",
            AuditEvent::Failed => "failed",
            AuditEvent::Unknown => "unknown",
            AuditEvent::Reconciled => "reconciled",
            AuditEvent::Released => "released",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }
}

/// What to record: who, which operation, what happened, when. Never an API key or a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub account_id: String,
    pub principal_id: String,
    pub operation_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub fingerprint: Option<String>,
    pub route: Option<String>,
    pub event: AuditEvent,
    pub external_ref: Option<String>,
    pub at: Timestamp,
}

/// One entry of the journal, as stored and as exported (one JSON object a line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditEntry {
    pub seq: i64,
    pub account_id: String,
    pub principal_id: String,
    pub operation_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub fingerprint: Option<String>,
    pub route: Option<String>,
    pub event: AuditEvent,
    pub external_ref: Option<String>,
    pub at: Timestamp,
    pub prev_hash: String,
    pub hash: String,
}

/// Everything but `hash`: what the hash covers.
#[derive(Serialize)]
struct Hashed<'a> {
    seq: i64,
    account_id: &'a str,
    principal_id: &'a str,
    operation_id: Option<&'a str>,
    idempotency_key: Option<&'a str>,
    fingerprint: Option<&'a str>,
    route: Option<&'a str>,
    event: AuditEvent,
    external_ref: Option<&'a str>,
    at: Timestamp,
    prev_hash: &'a str,
}

impl AuditEntry {
    /// The entry that records `record` at `seq`, after `prev_hash`.
    fn of(record: Record, seq: i64, prev_hash: String, hash: String) -> Self {
        AuditEntry {
            seq,
            account_id: record.account_id,
            principal_id: record.principal_id,
            operation_id: record.operation_id,
            idempotency_key: record.idempotency_key,
            fingerprint: record.fingerprint,
            route: record.route,
            event: record.event,
            external_ref: record.external_ref,
            at: record.at,
            prev_hash,
            hash,
        }
    }

    /// `sha256(prev_hash ‖ canonical_json(entry without hash))`, lowercase hex.
    pub fn computed_hash(&self) -> String {
        let hashed = Hashed {
            seq: self.seq,
            account_id: &self.account_id,
            principal_id: &self.principal_id,
            operation_id: self.operation_id.as_deref(),
            idempotency_key: self.idempotency_key.as_deref(),
            fingerprint: self.fingerprint.as_deref(),
            route: self.route.as_deref(),
            event: self.event,
            external_ref: self.external_ref.as_deref(),
            at: self.at,
            prev_hash: &self.prev_hash,
        };
        let mut digest = Sha256::new();
        digest.update(self.prev_hash.as_bytes());
        digest.update(canonical_json(&hashed));
        hex::encode(digest.finalize())
    }
}

/// Records the events of a transition inside the transaction that makes it
/// (the claim, the completion, a decision), so they commit — or not — with
/// what they record. They wait in `audit_inbox` until the [`Journal`]'s
/// chainer links them; no writer waits for another on the chain. (The one
/// exception, a new operation's first entries on SQLite, is
/// `store::claim_finished`'s.)
pub async fn record(tx: &mut Tx, records: &[Record]) -> Result<(), sqlx::Error> {
    if records.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "{INBOX_INSERT} VALUES {}",
        placeholders(1, records.len(), INBOX_COLUMNS)
    );
    on_tx!(tx, |conn| {
        bind_records!(sqlx::query(sqlx::AssertSqlSafe(sql.as_str())), records)
            .execute(conn)
            .await?;
    });
    Ok(())
}

pub(crate) const INBOX_INSERT: &str = "INSERT INTO audit_inbox \
     (account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, at)";
/// Parameters per inbox row.
pub(crate) const INBOX_COLUMNS: usize = 9;

/// Binds the columns an inbox row and a journal entry share (a [`Record`]'s
/// fields, which an [`AuditEntry`] has too), in [`INBOX_INSERT`]'s order.
macro_rules! bind_record_columns {
    ($query:expr, $r:expr) => {
        $query
            .bind(&$r.account_id)
            .bind(&$r.principal_id)
            .bind($r.operation_id.as_deref())
            .bind($r.idempotency_key.as_deref())
            .bind($r.fingerprint.as_deref())
            .bind($r.route.as_deref())
            .bind($r.event.as_str())
            .bind($r.external_ref.as_deref())
            .bind($r.at)
    };
}
pub(crate) use bind_record_columns;

/// Binds each record's inbox columns, in [`INBOX_INSERT`]'s order.
macro_rules! bind_records {
    ($query:expr, $records:expr) => {{
        let mut query = $query;
        for r in $records {
            query = $crate::audit::bind_record_columns!(query, r);
        }
        query
    }};
}
pub(crate) use bind_records;

/// Appends `records` to the chain inside `tx`, in the order given: each
/// entry's `prev_hash` is the hash of the one before. Appenders are
/// serialised (PostgreSQL: an advisory lock held to the end of `tx`;
/// SQLite: its one writer), and the database refuses a fork even if they
/// were not.
pub async fn append(tx: &mut Tx, records: &[Record]) -> Result<Vec<AuditEntry>, sqlx::Error> {
    lock_chain(tx).await?;
    append_locked(tx, records).await
}

/// Appends `records` in a transaction of their own.
pub async fn append_now(db: &Db, records: &[Record]) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let entries = append(&mut tx, records).await?;
    tx.commit().await?;
    Ok(entries)
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

/// Rows per INSERT, largest first. A statement's text fixes its row count,
/// and a statement is prepared once per text and connection, so entries go in
/// a handful of fixed shapes (every batch a sum of them) rather than one
/// statement sized to each batch, which both backends would prepare anew
/// every round (on SQLite, milliseconds the one writer is held for). Three
/// is a create's entries, chained alone when SQLite's head hint was behind.
const APPEND_SHAPES: [usize; 5] = [64, 16, 4, 3, 1];

/// `entries` cut into runs of [`APPEND_SHAPES`] rows, largest first.
fn in_shapes<T>(mut entries: &[T]) -> Vec<&[T]> {
    let mut runs = Vec::new();
    for shape in APPEND_SHAPES {
        while entries.len() >= shape {
            let (run, rest) = entries.split_at(shape);
            runs.push(run);
            entries = rest;
        }
    }
    runs
}

pub(crate) async fn append_locked(tx: &mut Tx, records: &[Record]) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let head = head_or_genesis(on_tx!(tx, |conn| sqlx::query_as(HEAD).fetch_optional(conn).await?));
    let entries = chained(head, records.to_vec());
    insert_entries(tx, &entries).await?;
    Ok(entries)
}

/// The chain's last entry, `(seq, hash)` (none while the chain is empty).
const HEAD: &str = "SELECT seq, hash FROM audit_journal ORDER BY seq DESC LIMIT 1";

/// What the next entry follows: the last entry's `(seq, hash)`, or `(0, GENESIS)`.
fn head_or_genesis(last: Option<(i64, String)>) -> (i64, String) {
    last.unwrap_or((0, GENESIS.to_owned()))
}

/// `records` as the entries that follow `head`, each hashed onto the one before.
pub(crate) fn chained((mut seq, mut prev_hash): (i64, String), records: Vec<Record>) -> Vec<AuditEntry> {
    let mut entries = Vec::with_capacity(records.len());
    for record in records {
        seq += 1;
        let mut entry = AuditEntry::of(record, seq, std::mem::take(&mut prev_hash), String::new());
        entry.hash = entry.computed_hash();
        prev_hash = entry.hash.clone();
        entries.push(entry);
    }
    entries
}

async fn insert_entries(tx: &mut Tx, entries: &[AuditEntry]) -> Result<(), sqlx::Error> {
    for chunk in in_shapes(entries) {
        let sql = format!(
            "{JOURNAL_INSERT} VALUES {}",
            placeholders(1, chunk.len(), JOURNAL_COLUMNS)
        );
        on_tx!(tx, |conn| {
            bind_entries!(sqlx::query(sqlx::AssertSqlSafe(sql.as_str())), chunk)
                .execute(conn)
                .await?;
        });
    }
    Ok(())
}

pub(crate) const JOURNAL_INSERT: &str = "INSERT INTO audit_journal \
     (account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, at, \
      seq, prev_hash, hash)";
/// Parameters per journal row.
pub(crate) const JOURNAL_COLUMNS: usize = 12;

/// A condition that holds while the chain's head is the entry whose hash is
/// bound at `$param` (or the chain is empty and that is [`GENESIS`]).
pub(crate) fn head_is(param: usize) -> String {
    format!("coalesce((SELECT hash FROM audit_journal ORDER BY seq DESC LIMIT 1), '{GENESIS}') = ${param}")
}

/// Binds each entry's columns, in [`JOURNAL_INSERT`]'s order.
macro_rules! bind_entries {
    ($query:expr, $entries:expr) => {{
        let mut query = $query;
        for e in $entries {
            query = $crate::audit::bind_record_columns!(query, e)
                .bind(e.seq)
                .bind(&e.prev_hash)
                .bind(&e.hash);
        }
        query
    }};
}
pub(crate) use bind_entries;

/// `($first, …), (…)`: `rows` groups of `cols` numbered placeholders.
pub(crate) fn placeholders(first: usize, rows: usize, cols: usize) -> String {
    (0..rows)
        .map(|row| {
            let group: Vec<String> = (0..cols).map(|col| format!("${}", first + row * cols + col)).collect();
            format!("({})", group.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// How often the chainer links what is waiting, at the latest.
const CHAIN_EVERY: Duration = Duration::from_millis(100);

/// The journal of one service database: links recorded transitions
/// (`audit_inbox`) and observed attempts into the chain, in batches.
///
/// Two kinds of events, two kinds of durability:
/// - a **transition** (claimed, completed, failed, approval_requested,
///   approved, rejected, expired, …) is recorded by [`record`] in the
///   transaction that makes it: never lost, never recorded for a change that
///   rolled back;
/// - an **observation** (an attempt answered from what is stored: replayed,
///   key_reused, in_progress) changes nothing, so it is queued in memory
///   ([`Journal::observe`]) and never makes a replay wait for a write. A crash
///   loses at most the observations of the last round (~100 ms).
///
/// A round takes the queued observations *first*, then reads the inbox: an
/// observation saw a state that had committed before it, so its cause is in
/// this round or an earlier one, and sorting a round by time puts it after.
///
/// On SQLite a new operation's first entries skip the inbox: they are chained
/// in the claim's own call (`store::claim_finished`). Each operation's entries
/// stay in the order they happened, since nothing about an operation is
/// journaled before its claim; but across operations the chain's order is the
/// order of linking, not of time. An attempt that failed with a server error
/// (queued) can be chained after the retry that created its operation. `at`
/// says when each event happened.
#[derive(Debug, Default)]
pub struct Journal {
    observed: Mutex<Vec<Record>>,
    /// One round at a time in this process (across processes, a round
    /// that finds the head moved prepares its batch again under the lock; see `link`).
    round: tokio::sync::Mutex<()>,
    /// The head as this process last chained it.
    pub(crate) head: HeadHint,
}

/// The chain's head as this process last chained it, for SQLite's hot path:
/// a create hashes its entries onto it without reading the chain, and its
/// insert writes only while the head really is that one (see
/// `store::claim_finished`). Another process's create or round, or a
/// transaction of this process that chained and then rolled back, makes it
/// wrong. A wrong hint costs the create a read of the head, a second hashing
/// and one more insert under the writer; never a fork or a lost entry.
#[derive(Debug, Default)]
pub struct HeadHint(Mutex<Option<(i64, String)>>);

impl HeadHint {
    /// The head to hash onto: the hint, or the empty chain's.
    pub(crate) fn get(&self) -> (i64, String) {
        head_or_genesis(self.0.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// `entries` were just chained: their last is the head.
    pub(crate) fn chained(&self, entries: &[AuditEntry]) {
        if let Some(last) = entries.last() {
            *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((last.seq, last.hash.clone()));
        }
    }
}

impl Journal {
    /// Queues observations; never waits.
    pub fn observe(&self, records: impl IntoIterator<Item = Record>) {
        self.observed.lock().unwrap_or_else(|p| p.into_inner()).extend(records);
    }

    /// One round: links everything waiting into the chain. Returns how many
    /// entries it appended. On failure the observations are queued again.
    pub async fn chain_pending(&self, db: &Db) -> Result<usize, sqlx::Error> {
        let _one_round = self.round.lock().await;
        let observed = std::mem::take(&mut *self.observed.lock().unwrap_or_else(|p| p.into_inner()));
        match link(db, &observed, &self.head).await {
            Ok(entries) => Ok(entries.len()),
            Err(e) => {
                let mut queue = self.observed.lock().unwrap_or_else(|p| p.into_inner());
                let newer = std::mem::replace(&mut *queue, observed);
                queue.extend(newer);
                Err(e)
            }
        }
    }

    /// A round every [`CHAIN_EVERY`], whatever arrives meanwhile: the
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

/// One round. Everything that takes time is done before the chain is locked:
/// the head is read, then the waiting records (both from committed state),
/// and the records are hashed onto the head. The transaction then only
/// checks that the head has not moved, writes, deletes exactly the records it
/// linked, and commits: on SQLite it holds the one writer that long, and
/// every create waits behind it.
///
/// The head is read *first*: if it has not moved by the time the chain is
/// locked, no other round committed since, so every record read is still
/// waiting (and on SQLite, which reuses the ids of an emptied inbox, still
/// the record read). If it has moved — another process's round, or a new
/// operation's claim chained on SQLite (`store::claim_finished`) — the round
/// reads the inbox again and hashes under the lock, where nothing moves. On
/// SQLite under a steady stream of creates that is most rounds: the work
/// done before the lock then pays off on PostgreSQL, and in quiet moments.
async fn link(db: &Db, observed: &[Record], hint: &HeadHint) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let head = head_or_genesis(on_pool!(db.read(), |pool| sqlx::query_as(HEAD)
        .fetch_optional(pool)
        .await?));
    let inbox = on_pool!(db.read(), |pool| {
        let rows = sqlx::query(READ_INBOX).fetch_all(pool).await?;
        rows.iter().map(waiting).collect::<Result<Vec<_>, _>>()?
    });
    if inbox.is_empty() && observed.is_empty() {
        return Ok(Vec::new());
    }
    let mut round = Round::of(head.clone(), inbox, observed);

    let mut tx = db.begin().await?;
    lock_chain(&mut tx).await?;
    let current = head_or_genesis(on_tx!(&mut tx, |conn| sqlx::query_as(HEAD)
        .fetch_optional(conn)
        .await?));
    if current != head {
        let inbox = on_tx!(&mut tx, |conn| {
            let rows = sqlx::query(READ_INBOX).fetch_all(conn).await?;
            rows.iter().map(waiting).collect::<Result<Vec<_>, _>>()?
        });
        round = Round::of(current, inbox, observed);
    }
    insert_entries(&mut tx, &round.entries).await?;
    let deleted = match &mut tx {
        Tx::Postgres(pg) => sqlx::query("DELETE FROM audit_inbox WHERE id = ANY($1)")
            .bind(&round.inbox_ids)
            .execute(&mut **pg)
            .await?
            .rows_affected(),
        Tx::Sqlite(lite) => sqlx::query("DELETE FROM audit_inbox WHERE id IN (SELECT value FROM json_each($1))")
            .bind(serde_json::to_string(&round.inbox_ids).expect("a list of integers is JSON"))
            .execute(&mut **lite)
            .await?
            .rows_affected(),
    };
    if deleted != round.inbox_ids.len() as u64 {
        // cannot happen while rounds lock the chain; if it does, nothing is linked twice
        tx.rollback().await?;
        return Err(sqlx::Error::Protocol(
            "the audit inbox changed under a locked round".into(),
        ));
    }
    // before the commit, while no create of this process can chain past it
    hint.chained(&round.entries);
    tx.commit().await?;
    Ok(round.entries)
}

/// What one round links: the waiting records and the observations, in the
/// order they happened, hashed onto a head.
struct Round {
    inbox_ids: Vec<i64>,
    entries: Vec<AuditEntry>,
}

impl Round {
    fn of(head: (i64, String), inbox: Vec<(i64, Record)>, observed: &[Record]) -> Round {
        let inbox_ids = inbox.iter().map(|(id, _)| *id).collect();
        let mut batch: Vec<Record> = inbox
            .into_iter()
            .map(|(_, r)| r)
            .chain(observed.iter().cloned())
            .collect();
        // stable: events of one transaction share a time and keep their order
        batch.sort_by_key(|r| r.at);
        Round {
            inbox_ids,
            entries: chained(head, batch),
        }
    }
}

/// The waiting records, oldest first, with their ids (decoded by [`waiting`]).
const READ_INBOX: &str = "SELECT id, account_id, principal_id, operation_id, idempotency_key, fingerprint, route, \
     event, external_ref, at FROM audit_inbox ORDER BY id";

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

fn unknown_event(event: &str) -> sqlx::Error {
    sqlx::Error::Decode(format!("audit: unknown event `{event}`").into())
}

/// Which entries of one account to read (`GET /v1/audit`).
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub operation_id: Option<String>,
    pub event: Option<AuditEvent>,
    /// At or after.
    pub since: Option<Timestamp>,
    /// Before.
    pub until: Option<Timestamp>,
}

const ENTRY_COLUMNS: &str = "seq, account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, \
     external_ref, at, prev_hash, hash";

/// Every entry after `after_seq`, in chain order, at most `limit`: the whole
/// journal, every account, for export and verification.
pub async fn entries(db: &Db, after_seq: i64, limit: i64) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let sql = format!("SELECT {ENTRY_COLUMNS} FROM audit_journal WHERE seq > $1 ORDER BY seq LIMIT $2");
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(after_seq)
            .bind(limit)
            .fetch_all(pool)
            .await?
            .iter()
            .map(decode_entry)
            .collect::<Result<Vec<_>, _>>()?
    }))
}

/// One account's entries after `after_seq` that pass `filter`, in chain order.
pub async fn find(
    db: &Db,
    account_id: &str,
    filter: &AuditFilter,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let sql = format!(
        "SELECT {ENTRY_COLUMNS} FROM audit_journal WHERE account_id = $1 AND seq > $2 \
         AND ($3 IS NULL OR operation_id = $3) AND ($4 IS NULL OR event = $4) \
         AND ($5 IS NULL OR at >= $5) AND ($6 IS NULL OR at < $6) ORDER BY seq LIMIT $7"
    );
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(after_seq)
            .bind(filter.operation_id.as_deref())
            .bind(filter.event.map(AuditEvent::as_str))
            .bind(filter.since)
            .bind(filter.until)
            .bind(limit)
            .fetch_all(pool)
            .await?
            .iter()
            .map(decode_entry)
            .collect::<Result<Vec<_>, _>>()?
    }))
}

/// The columns an inbox row and a journal entry share.
fn decode_record<R>(row: &R) -> Result<Record, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let event: String = row.try_get("event")?;
    Ok(Record {
        account_id: row.try_get("account_id")?,
        principal_id: row.try_get("principal_id")?,
        operation_id: row.try_get("operation_id")?,
        idempotency_key: row.try_get("idempotency_key")?,
        fingerprint: row.try_get("fingerprint")?,
        route: row.try_get("route")?,
        event: AuditEvent::parse(&event).ok_or_else(|| unknown_event(&event))?,
        external_ref: row.try_get("external_ref")?,
        at: row.try_get("at")?,
    })
}

fn decode_entry<R>(row: &R) -> Result<AuditEntry, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(AuditEntry::of(
        decode_record(row)?,
        row.try_get("seq")?,
        row.try_get("prev_hash")?,
        row.try_get("hash")?,
    ))
}

/// Where a chain breaks, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the audit chain breaks at entry {seq}: {reason}")]
pub struct ChainBreak {
    pub seq: i64,
    pub reason: &'static str,
}

/// The last entry of a chain: what an operator pins (writes down elsewhere)
/// so that a later verification can tell a journal that lost its tail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub seq: i64,
    pub hash: String,
}

impl std::fmt::Display for Head {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.seq, self.hash)
    }
}

impl std::str::FromStr for Head {
    type Err = String;
    /// `SEQ:HASH`, as [`Display`](std::fmt::Display) prints it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (seq, hash) = s.split_once(':').ok_or("a head is `SEQ:HASH`")?;
        let seq = seq.parse().map_err(|_| format!("`{seq}` is not an entry number"))?;
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("`{hash}` is not a SHA-256 in hex"));
        }
        Ok(Head {
            seq,
            hash: hash.to_ascii_lowercase(),
        })
    }
}

/// What a verification found: how many entries hold, and the head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub entries: u64,
    /// `None` for an empty journal.
    pub head: Option<Head>,
}

/// Checks a whole chain, in order from its first entry: each entry follows
/// the one before it, links to its hash, and hashes to what it says. With
/// `pinned` (a head written down earlier), the chain must still contain that
/// entry unchanged: a chain cut below it, or rewritten up to it, is broken —
/// the one tampering a chain alone cannot show.
pub fn verify<'a>(
    entries: impl IntoIterator<Item = &'a AuditEntry>,
    pinned: Option<&Head>,
) -> Result<Verified, ChainBreak> {
    let (mut expected_seq, mut prev_hash, mut checked) = (1_i64, GENESIS.to_owned(), 0_u64);
    let mut pinned_seen = false;
    for entry in entries {
        let broken = |reason| ChainBreak { seq: entry.seq, reason };
        if entry.seq != expected_seq {
            return Err(broken("an entry is missing or out of order before it"));
        }
        if entry.prev_hash != prev_hash {
            return Err(broken("its prev_hash is not the hash of the entry before it"));
        }
        if entry.computed_hash() != entry.hash {
            return Err(broken("its fields do not hash to its hash"));
        }
        if let Some(pin) = pinned.filter(|pin| pin.seq == entry.seq) {
            if pin.hash != entry.hash {
                return Err(broken(
                    "it is not the entry that was pinned: the chain was rewritten up to here",
                ));
            }
            pinned_seen = true;
        }
        prev_hash = entry.hash.clone();
        expected_seq += 1;
        checked += 1;
    }
    if let Some(pin) = pinned.filter(|_| !pinned_seen) {
        return Err(ChainBreak {
            seq: pin.seq,
            reason: "the journal ends before the pinned head: its tail was cut",
        });
    }
    Ok(Verified {
        entries: checked,
        head: (checked > 0).then(|| Head {
            seq: expected_seq - 1,
            hash: prev_hash,
        }),
    })
}

/// Reads the whole journal in `db`, in pages.
pub async fn all_entries(db: &Db) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let (mut after, mut all) = (0_i64, Vec::new());
    loop {
        let page = entries(db, after, 10_000).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        all.extend(page);
    }
    Ok(all)
}

/// The journal as JSON lines: one entry a line, in chain order.
pub fn to_json_lines(entries: &[AuditEntry]) -> String {
    entries
        .iter()
        .filter_map(|e| serde_json::to_string(e).ok())
        .map(|line| line + "\n")
        .collect()
}

/// Reads an exported journal; an unreadable line is named by its number.
pub fn from_json_lines(text: &str) -> Result<Vec<AuditEntry>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| serde_json::from_str(line).map_err(|e| format!("line {}: {e}", n + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_of_entries_is_appended_in_the_fixed_statement_shapes_each_entry_once_in_order() {
        let batch: Vec<usize> = (0..89).collect();
        let runs = in_shapes(&batch);
        let sizes: Vec<usize> = runs.iter().map(|run| run.len()).collect();
        assert_eq!(sizes, [64, 16, 4, 4, 1]);
        assert_eq!(runs.concat(), batch);
        assert_eq!(
            in_shapes(&[1, 2, 3]).len(),
            1,
            "a create's three entries go in one statement"
        );
    }
}

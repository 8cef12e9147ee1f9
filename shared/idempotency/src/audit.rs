//! The audit journal (docs/contract.md §8): an append-only, hash-chained record
//! of what happened to every operation, one chain per service database.
//!
//! Each entry carries `prev_hash` and `hash = sha256(prev_hash ‖
//! canonical_json(entry))`, the entry being every field but `hash`. The
//! database refuses UPDATE, DELETE and TRUNCATE on the table (triggers), an
//! insert that would replace an entry (SQLite's `INSERT OR REPLACE`, an
//! upsert), and an entry whose `prev_hash` is not the hash of the entry
//! before it (`seq` is the primary key): no writer can fork the chain or
//! leave a gap in it.
//! Appends are serialised (PostgreSQL: an advisory lock held to the end of
//! the transaction; SQLite: its one writer).
//! [`verify`] checks a chain offline and names the first broken entry; a
//! [`Head`] pinned earlier (`GET /v1/audit/head`, the service's log) lets it
//! catch a cut tail too.
//!
//! How events reach the chain without serialising every write on it: see
//! [`Journal`] and docs/design.md §8.

use std::{sync::Mutex, time::Duration};

use platform::{Db, Pool, Principal, Timestamp, Tx, on_pool, on_tx};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::{fingerprint::canonical_json, operation::OperationState};

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
    /// A business resource changed state with no transition of an operation
    /// to record it: a request with no key (a ticket's status, a cancel), or
    /// a worker that follows work elsewhere (a rollout the controller began
    /// running). The entry names the resource and its new state; a request
    /// that changed nothing (the resource already had that state) journals
    /// nothing. With a key, the operation's own entries record the change.
    StateChanged,
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
            AuditEvent::StateChanged => "state_changed",
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
    /// The resource a `state_changed` entry is about, and its new state.
    pub change: Option<StateChange>,
}

/// A business resource's new state: `{resource_type, resource_id, state}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    /// In the service's words: `ticket`, `payment_intent`, `deployment`.
    pub resource_type: String,
    pub resource_id: String,
    pub state: String,
}

impl Record {
    /// `principal` changed a resource's state through `route`, with no key.
    pub fn state_changed(principal: &Principal, route: &str, change: StateChange) -> Record {
        Record {
            account_id: principal.account_id.clone(),
            principal_id: principal.principal_id.clone(),
            operation_id: None,
            idempotency_key: None,
            fingerprint: None,
            route: Some(route.to_owned()),
            event: AuditEvent::StateChanged,
            external_ref: None,
            at: Timestamp::now(),
            change: Some(change),
        }
    }
}

impl StateChange {
    pub fn new(resource_type: &str, resource_id: &str, state: &str) -> StateChange {
        StateChange {
            resource_type: resource_type.to_owned(),
            resource_id: resource_id.to_owned(),
            state: state.to_owned(),
        }
    }
}

/// Journals that `principal` changed a resource's state through `route`
/// with no key, in `tx`: the transaction that changes it, so the entry
/// commits with the change or not at all.
pub async fn record_state_change(
    tx: &mut Tx,
    principal: &Principal,
    route: &str,
    change: StateChange,
) -> Result<(), sqlx::Error> {
    record(tx, &[Record::state_changed(principal, route, change)]).await
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
    /// `state_changed`: the resource and its new state (absent from exports
    /// made before entries had them).
    #[serde(default)]
    pub resource_type: Option<String>,
    #[serde(default)]
    pub resource_id: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
    pub prev_hash: String,
    pub hash: String,
}

/// Everything but `hash`: what the hash covers. The resource fields are left
/// out when empty, so every entry made before they existed hashes as it did.
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
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'a str>,
    prev_hash: &'a str,
}

impl AuditEntry {
    /// The entry that records `record` at `seq`, after `prev_hash`.
    fn of(record: Record, seq: i64, prev_hash: String, hash: String) -> Self {
        let (resource_type, resource_id, state) = match record.change {
            Some(c) => (Some(c.resource_type), Some(c.resource_id), Some(c.state)),
            None => (None, None, None),
        };
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
            resource_type,
            resource_id,
            state,
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
            resource_type: self.resource_type.as_deref(),
            resource_id: self.resource_id.as_deref(),
            state: self.state.as_deref(),
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
/// chainer links them; no writer waits for another on the chain. (On SQLite a
/// claim that finishes in its own transaction keeps its records in its
/// operation row instead: see [`finished_claim`].)
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

/// Journals that `by` (a worker) moved the resource that an operation made
/// or acted on to `state`, in `tx`, the transaction that moves it. The entry
/// carries the operation's id, key, fingerprint and route, and its resource,
/// all read from the operation's row in the same statement. `false`: no such
/// operation, or it names no resource.
pub async fn record_resource_change(
    tx: &mut Tx,
    by: &str,
    account_id: &str,
    operation_id: &str,
    state: &str,
) -> Result<bool, sqlx::Error> {
    let recorded = on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO audit_inbox (account_id, principal_id, operation_id, idempotency_key, fingerprint, route, \
             event, at, resource_type, resource_id, state) \
             SELECT account_id, $3, operation_id, idempotency_key, fingerprint, route, $4, $5, resource_type, \
                    resource_id, $6 \
             FROM idempotency_operations \
             WHERE account_id = $1 AND operation_id = $2 AND resource_type IS NOT NULL AND resource_id IS NOT NULL",
        )
        .bind(account_id)
        .bind(operation_id)
        .bind(by)
        .bind(AuditEvent::StateChanged.as_str())
        .bind(Timestamp::now())
        .bind(state)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(recorded == 1)
}

pub(crate) const INBOX_INSERT: &str = "INSERT INTO audit_inbox \
     (account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, at, \
      resource_type, resource_id, state)";
/// Parameters per inbox row.
pub(crate) const INBOX_COLUMNS: usize = 12;

/// Binds each record's inbox columns, in [`INBOX_INSERT`]'s order.
macro_rules! bind_records {
    ($query:expr, $records:expr) => {{
        let mut query = $query;
        for r in $records {
            query = query
                .bind(&r.account_id)
                .bind(&r.principal_id)
                .bind(r.operation_id.as_deref())
                .bind(r.idempotency_key.as_deref())
                .bind(r.fingerprint.as_deref())
                .bind(r.route.as_deref())
                .bind(r.event.as_str())
                .bind(r.external_ref.as_deref())
                .bind(r.at)
                .bind(r.change.as_ref().map(|c| c.resource_type.as_str()))
                .bind(r.change.as_ref().map(|c| c.resource_id.as_str()))
                .bind(r.change.as_ref().map(|c| c.state.as_str()));
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

/// Entries per INSERT: a round after an outage may link many thousands, and
/// one statement of them all would hold parameters of that size.
const ENTRIES_PER_STATEMENT: usize = 2_000;

/// Appends `entries`, in order, a chunk a statement. A VALUES list would
/// bind a dozen parameters an entry, and binding them would cost more than
/// writing the rows, so each backend takes the chunk whole:
/// - PostgreSQL takes each column as one array parameter and zips them with
///   `unnest`: arrays travel in binary, so nothing is parsed;
/// - SQLite has no arrays: it takes one JSON array and reads it with
///   `jsonb_each`, whose elements are binary JSON, so each field is read
///   without parsing the element's text again.
///
/// The database checks each entry's link as it goes in.
async fn insert_entries(tx: &mut Tx, entries: &[AuditEntry]) -> Result<(), sqlx::Error> {
    for chunk in entries.chunks(ENTRIES_PER_STATEMENT) {
        let inserted = match &mut *tx {
            Tx::Postgres(pg) => {
                let column = |field: fn(&AuditEntry) -> Option<&str>| chunk.iter().map(field).collect::<Vec<_>>();
                sqlx::query(
                    "INSERT INTO audit_journal (seq, account_id, principal_id, operation_id, idempotency_key, \
                     fingerprint, route, event, external_ref, at, prev_hash, hash, resource_type, resource_id, state) \
                     SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], \
                          $6::text[], $7::text[], $8::text[], $9::text[], $10::timestamptz[], $11::text[], $12::text[], \
                          $13::text[], $14::text[], $15::text[]) \
                     ORDER BY 1",
                )
                .bind(chunk.iter().map(|e| e.seq).collect::<Vec<_>>())
                .bind(column(|e| Some(&e.account_id)))
                .bind(column(|e| Some(&e.principal_id)))
                .bind(column(|e| e.operation_id.as_deref()))
                .bind(column(|e| e.idempotency_key.as_deref()))
                .bind(column(|e| e.fingerprint.as_deref()))
                .bind(column(|e| e.route.as_deref()))
                .bind(column(|e| Some(e.event.as_str())))
                .bind(column(|e| e.external_ref.as_deref()))
                .bind(chunk.iter().map(|e| e.at).collect::<Vec<_>>())
                .bind(column(|e| Some(&e.prev_hash)))
                .bind(column(|e| Some(&e.hash)))
                .bind(column(|e| e.resource_type.as_deref()))
                .bind(column(|e| e.resource_id.as_deref()))
                .bind(column(|e| e.state.as_deref()))
                .execute(&mut **pg)
                .await?
                .rows_affected()
            }
            Tx::Sqlite(lite) => sqlx::query(
                "INSERT INTO audit_journal (seq, account_id, principal_id, operation_id, idempotency_key, \
                 fingerprint, route, event, external_ref, at, prev_hash, hash, resource_type, resource_id, state) \
                 SELECT value->>'seq', value->>'account_id', value->>'principal_id', value->>'operation_id', \
                        value->>'idempotency_key', value->>'fingerprint', value->>'route', value->>'event', \
                        value->>'external_ref', value->>'at', value->>'prev_hash', value->>'hash', \
                        value->>'resource_type', value->>'resource_id', value->>'state' \
                 FROM jsonb_each($1) ORDER BY key",
            )
            .bind(serde_json::to_string(chunk).map_err(|e| sqlx::Error::Encode(e.into()))?)
            .execute(&mut **lite)
            .await?
            .rows_affected(),
        };
        if inserted != chunk.len() as u64 {
            // cannot happen: the database refuses the whole statement, or takes every entry
            return Err(sqlx::Error::Protocol(format!(
                "{} audit entries went in as {inserted}",
                chunk.len()
            )));
        }
    }
    Ok(())
}

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
///   makes it — by [`record`], into `audit_inbox`; on SQLite, a claim that
///   finishes in its own transaction keeps its records in its operation row
///   (see [`finished_claim`]) — so it is never lost, and never recorded for a
///   change that rolled back;
/// - an **observation** (an attempt answered from what is stored: replayed,
///   key_reused, in_progress) changes nothing, so it is queued in memory
///   ([`Journal::observe`]) and never makes a replay wait for a write. A crash
///   loses at most the observations of the last round ([`CHAIN_EVERY`]).
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

/// The records of a claim that finished in its own transaction (the create's
/// hot path): the attempt, at `attempted_at`; the claim; and, if the answer
/// the claim stored is final, the outcome — completed or failed (none while
/// the outbox works on it). `record` makes one record of the operation.
///
/// PostgreSQL records them in the inbox, in the claim's own statement. SQLite
/// keeps them in the operation row (`attempted_at`, `claimed_state`), and the
/// chain round makes them from it: SQLite writes every page a transaction
/// changed into its log at commit, and the journal's pages (the table and its
/// two indexes) were as many as the claim's own; a round links hundreds of
/// claims in a few pages.
pub fn finished_claim(
    record: impl Fn(AuditEvent, Timestamp) -> Record,
    attempted_at: Timestamp,
    claimed_at: Timestamp,
    claimed_state: OperationState,
) -> Vec<Record> {
    let outcome = match claimed_state {
        OperationState::Completed => Some(AuditEvent::Completed),
        OperationState::Failed => Some(AuditEvent::Failed),
        _ => None,
    };
    [(AuditEvent::Attempted, attempted_at), (AuditEvent::Claimed, claimed_at)]
        .into_iter()
        .chain(outcome.map(|event| (event, claimed_at)))
        .map(|(event, at)| record(event, at))
        .collect()
}

/// What a round linked: the entries it appended, and how many inbox records
/// it deleted.
struct Linked {
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
struct Waiting {
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

/// SQLite: the records of the claims above the mark (`audit_progress`), and
/// the highest `seq` read (every operation up to it has been looked at; only
/// some carry a claim to link).
struct Claims {
    after: i64,
    upto: i64,
    records: Vec<Record>,
}

/// Every claim `seq` at or below it is linked.
const CLAIMS_MARK: &str = "SELECT operations_seq FROM audit_progress";

/// The claims above the mark, in `seq` order, each row with the mark and the
/// highest `seq` there is (a row with no claim when there is none above the
/// mark). One statement, so one moment: `seq` is AUTOINCREMENT and SQLite has
/// one writer, so an operation that commits later always has a higher `seq`
/// than `upto`, and the mark can move there. Operations journaled otherwise
/// (a lease, an approval, a bulk import) are passed over in the database.
async fn unlinked_claims(conn: &mut sqlx::SqliteConnection) -> Result<Claims, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT p.operations_seq AS mark, (SELECT max(seq) FROM idempotency_operations) AS upto, \
                o.account_id, o.principal_id, o.operation_id, o.idempotency_key, o.fingerprint, o.route, \
                o.attempted_at, o.created_at, o.claimed_state \
         FROM audit_progress p LEFT JOIN idempotency_operations o \
              ON o.seq > p.operations_seq AND o.claimed_state IS NOT NULL \
         ORDER BY o.seq",
    )
    .fetch_all(conn)
    .await?;
    let Some(first) = rows.first() else {
        return Err(sqlx::Error::Protocol("audit_progress has no row".into()));
    };
    let after: i64 = first.try_get("mark")?;
    let upto: Option<i64> = first.try_get("upto")?;
    let mut claims = Claims {
        after,
        upto: upto.unwrap_or(after).max(after),
        records: Vec::new(),
    };
    for row in &rows {
        let (Some(claimed_state), Some(attempted_at)) = (
            row.try_get::<Option<String>, _>("claimed_state")?,
            row.try_get("attempted_at")?,
        ) else {
            continue; // the mark's own row: no claim above it
        };
        let claimed_state = OperationState::parse(&claimed_state)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown claimed_state `{claimed_state}`").into()))?;
        let claim = Record {
            account_id: row.try_get("account_id")?,
            principal_id: row.try_get("principal_id")?,
            operation_id: Some(row.try_get("operation_id")?),
            idempotency_key: Some(row.try_get("idempotency_key")?),
            fingerprint: Some(row.try_get("fingerprint")?),
            route: Some(row.try_get("route")?),
            event: AuditEvent::Claimed,
            external_ref: None,
            at: attempted_at,
            change: None,
        };
        let record = |event, at| Record {
            event,
            at,
            ..claim.clone()
        };
        claims.records.extend(finished_claim(
            record,
            attempted_at,
            row.try_get("created_at")?,
            claimed_state,
        ));
    }
    Ok(claims)
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
     external_ref, at, resource_type, resource_id, state, prev_hash, hash";

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
    let change = match (
        row.try_get::<Option<String>, _>("resource_type")?,
        row.try_get::<Option<String>, _>("resource_id")?,
        row.try_get::<Option<String>, _>("state")?,
    ) {
        (Some(resource_type), Some(resource_id), Some(state)) => Some(StateChange {
            resource_type,
            resource_id,
            state,
        }),
        _ => None,
    };
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
        change,
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
/// `{seq: 0, hash: GENESIS}` for an empty chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Head {
    #[schema(example = 1234)]
    pub seq: i64,
    /// lowercase hex SHA-256
    pub hash: String,
}

/// The chain's newest entry in `db`, or `0:GENESIS` while it is empty.
pub async fn head(db: &Db) -> Result<Head, sqlx::Error> {
    let (seq, hash) = head_or_genesis(on_pool!(db.read(), |pool| sqlx::query_as(HEAD)
        .fetch_optional(pool)
        .await?));
    Ok(Head { seq, hash })
}

/// Logs the chain's head `when` (the service starts, stops): kept in the
/// log, it is a pin that `audit verify --pin SEQ:HASH` can later check a
/// journal against, and so catch a cut tail.
pub async fn log_head(db: &Db, when: &str) {
    match head(db).await {
        Ok(head) => tracing::info!(seq = head.seq, hash = %head.hash, "audit journal head {when}: {head}"),
        Err(e) => tracing::warn!(error = %e, "could not read the audit journal's head {when}"),
    }
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
    // the head of an empty chain: every chain starts there
    let mut pinned_seen = pinned.is_some_and(|pin| pin.seq == 0 && pin.hash == GENESIS);
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

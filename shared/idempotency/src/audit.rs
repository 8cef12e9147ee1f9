//! The audit journal (CONTRACT §8): an append-only, hash-chained record of
//! what happened to every operation, one chain per service database.
//!
//! Each entry carries `prev_hash` and `hash = sha256(prev_hash ‖
//! canonical_json(entry))`, the entry being every field but `hash`. The
//! database refuses UPDATE, DELETE and TRUNCATE on the table (triggers), and
//! `UNIQUE (prev_hash)` means an entry can have one successor only, so two
//! writers can never fork the chain; appends are serialised (PostgreSQL: an
//! advisory lock held to the end of the transaction; SQLite: its one writer).
//! [`verify`] checks a chain offline and names the first broken entry.
//!
//! Not yet wired into the request path: which events each outcome appends,
//! and in which transaction, is decided with approvals (issue 3).

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
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }
}

/// What to record: who, which operation, what happened. Never an API key or a body.
#[derive(Debug, Clone, Default)]
pub struct Record<'a> {
    pub account_id: &'a str,
    pub principal_id: &'a str,
    pub operation_id: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
    pub fingerprint: Option<&'a str>,
    pub route: Option<&'a str>,
    pub event: Option<AuditEvent>,
    pub external_ref: Option<&'a str>,
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

/// Appends `record` to the journal inside `tx`, so the entry commits (or not)
/// with what it records.
pub async fn append(tx: &mut Tx, record: &Record<'_>) -> Result<AuditEntry, sqlx::Error> {
    let event = record
        .event
        .ok_or_else(|| sqlx::Error::Protocol("an audit record needs an event".into()))?;
    if let Tx::Postgres(pg) = tx {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(CHAIN_LOCK)
            .execute(&mut **pg)
            .await?;
    }
    let last: Option<(i64, String)> = on_tx!(tx, |conn| {
        sqlx::query_as("SELECT seq, hash FROM audit_journal ORDER BY seq DESC LIMIT 1")
            .fetch_optional(conn)
            .await?
    });
    let (seq, prev_hash) = match last {
        Some((seq, hash)) => (seq + 1, hash),
        None => (1, GENESIS.to_owned()),
    };
    let mut entry = AuditEntry {
        seq,
        account_id: record.account_id.to_owned(),
        principal_id: record.principal_id.to_owned(),
        operation_id: record.operation_id.map(str::to_owned),
        idempotency_key: record.idempotency_key.map(str::to_owned),
        fingerprint: record.fingerprint.map(str::to_owned),
        route: record.route.map(str::to_owned),
        event,
        external_ref: record.external_ref.map(str::to_owned),
        at: Timestamp::now(),
        prev_hash,
        hash: String::new(),
    };
    entry.hash = entry.computed_hash();
    on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO audit_journal (seq, account_id, principal_id, operation_id, idempotency_key, fingerprint, \
             route, event, external_ref, at, prev_hash, hash) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(entry.seq)
        .bind(&entry.account_id)
        .bind(&entry.principal_id)
        .bind(entry.operation_id.as_deref())
        .bind(entry.idempotency_key.as_deref())
        .bind(entry.fingerprint.as_deref())
        .bind(entry.route.as_deref())
        .bind(entry.event.as_str())
        .bind(entry.external_ref.as_deref())
        .bind(entry.at)
        .bind(&entry.prev_hash)
        .bind(&entry.hash)
        .execute(conn)
        .await?;
    });
    Ok(entry)
}

/// Appends `record` in a transaction of its own.
pub async fn append_now(db: &Db, record: &Record<'_>) -> Result<AuditEntry, sqlx::Error> {
    let mut tx = db.begin().await?;
    let entry = append(&mut tx, record).await?;
    tx.commit().await?;
    Ok(entry)
}

/// Every entry after `after_seq`, in chain order, at most `limit`.
pub async fn entries(db: &Db, after_seq: i64, limit: i64) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let rows = on_pool!(db.read(), |pool| {
        sqlx::query(
            "SELECT seq, account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, \
             external_ref, at, prev_hash, hash FROM audit_journal WHERE seq > $1 ORDER BY seq LIMIT $2",
        )
        .bind(after_seq)
        .bind(limit)
        .fetch_all(pool)
        .await?
        .iter()
        .map(|row| {
            let event: String = row.try_get("event")?;
            Ok::<_, sqlx::Error>(AuditEntry {
                seq: row.try_get("seq")?,
                account_id: row.try_get("account_id")?,
                principal_id: row.try_get("principal_id")?,
                operation_id: row.try_get("operation_id")?,
                idempotency_key: row.try_get("idempotency_key")?,
                fingerprint: row.try_get("fingerprint")?,
                route: row.try_get("route")?,
                event: AuditEvent::parse(&event)
                    .ok_or_else(|| sqlx::Error::Decode(format!("audit_journal: unknown event `{event}`").into()))?,
                external_ref: row.try_get("external_ref")?,
                at: row.try_get("at")?,
                prev_hash: row.try_get("prev_hash")?,
                hash: row.try_get("hash")?,
            })
        })
        .collect::<Result<Vec<_>, _>>()?
    });
    Ok(rows)
}

/// Where a chain breaks, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the audit chain breaks at entry {seq}: {reason}")]
pub struct ChainBreak {
    pub seq: i64,
    pub reason: &'static str,
}

/// Checks a whole chain, in order from its first entry: each entry follows
/// the one before it, links to its hash, and hashes to what it says.
pub fn verify<'a>(entries: impl IntoIterator<Item = &'a AuditEntry>) -> Result<u64, ChainBreak> {
    let (mut expected_seq, mut prev_hash, mut checked) = (1_i64, GENESIS.to_owned(), 0_u64);
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
        prev_hash = entry.hash.clone();
        expected_seq += 1;
        checked += 1;
    }
    Ok(checked)
}

/// Verifies the whole journal in `db`, reading it in pages.
pub async fn verify_database(db: &Db) -> Result<Result<u64, ChainBreak>, sqlx::Error> {
    let (mut after, mut all) = (0_i64, Vec::new());
    loop {
        let page = entries(db, after, 10_000).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        all.extend(page);
    }
    Ok(verify(&all))
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

//! Reading the journal: by filter for `GET /v1/audit`, in pages for the
//! export, and its head.

use platform::{Db, Timestamp, on_pool};

use crate::chain::{AuditEntry, AuditEvent, GENESIS, Head, Record, StateChange};

/// The chain's last entry, `(seq, hash)` (none while the chain is empty).
pub(super) const HEAD: &str = "SELECT seq, hash FROM audit_journal ORDER BY seq DESC LIMIT 1";

/// What the next entry follows: the last entry's `(seq, hash)`, or `(0, GENESIS)`.
pub(super) fn head_or_genesis(last: Option<(i64, String)>) -> (i64, String) {
    last.unwrap_or((0, GENESIS.to_owned()))
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
     external_ref, at, attempt, resource_type, resource_id, state, evidence, prev_hash, hash";

/// Every entry after `after_seq`, in chain order, at most `limit`: the whole
/// journal, every account, for export and verification.
pub async fn entries(db: &Db, after_seq: i64, limit: i64) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let sql = format!("SELECT {ENTRY_COLUMNS} FROM audit_journal WHERE seq > $1 ORDER BY seq LIMIT $2");
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query_as::<_, EntryRow>(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(after_seq)
            .bind(limit)
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(AuditEntry::try_from)
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
        sqlx::query_as::<_, EntryRow>(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(after_seq)
            .bind(filter.operation_id.as_deref())
            .bind(filter.event.map(<&str>::from))
            .bind(filter.since)
            .bind(filter.until)
            .bind(limit)
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(AuditEntry::try_from)
            .collect::<Result<Vec<_>, _>>()?
    }))
}

/// The columns an inbox row and a journal entry share, by name.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct RecordRow {
    account_id: String,
    principal_id: String,
    operation_id: Option<String>,
    idempotency_key: Option<String>,
    fingerprint: Option<String>,
    route: Option<String>,
    event: String,
    external_ref: Option<String>,
    at: Timestamp,
    attempt: Option<i64>,
    resource_type: Option<String>,
    resource_id: Option<String>,
    state: Option<String>,
    evidence: Option<String>,
}

impl TryFrom<RecordRow> for Record {
    type Error = sqlx::Error;

    fn try_from(row: RecordRow) -> Result<Self, sqlx::Error> {
        let change = match (row.resource_type, row.resource_id, row.state) {
            (Some(resource_type), Some(resource_id), Some(state)) => Some(StateChange {
                resource_type,
                resource_id,
                state,
            }),
            _ => None,
        };
        Ok(Record {
            account_id: row.account_id,
            principal_id: row.principal_id,
            operation_id: row.operation_id,
            idempotency_key: row.idempotency_key,
            fingerprint: row.fingerprint,
            route: row.route,
            event: row.event.parse().map_err(|_| unknown_event(&row.event))?,
            external_ref: row.external_ref,
            at: row.at,
            attempt: row.attempt,
            change,
            evidence: row.evidence,
        })
    }
}

/// A journal entry's row: its record, and its place in the chain.
#[derive(Debug, sqlx::FromRow)]
struct EntryRow {
    #[sqlx(flatten)]
    record: RecordRow,
    seq: i64,
    prev_hash: String,
    hash: String,
}

impl TryFrom<EntryRow> for AuditEntry {
    type Error = sqlx::Error;

    fn try_from(row: EntryRow) -> Result<Self, sqlx::Error> {
        Ok(AuditEntry::of(row.record.try_into()?, row.seq, row.prev_hash, row.hash))
    }
}

/// An inbox row: its record, and its place in the inbox.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct InboxRow {
    #[sqlx(flatten)]
    pub record: RecordRow,
    pub id: i64,
}

/// The chain's newest entry in `db`, or `0:GENESIS` while it is empty.
pub async fn head(db: &Db) -> Result<Head, sqlx::Error> {
    let (seq, hash) = head_or_genesis(on_pool!(db.read(), |pool| sqlx::query_as(HEAD)
        .fetch_optional(pool)
        .await?));
    Ok(Head { seq, hash })
}

/// Logs the chain's head `when` (the service starts, stops), and returns
/// it: kept in the log, it is a pin that `audit verify --pin SEQ:HASH` can
/// later check a journal against, and so catch a cut tail.
pub async fn log_head(db: &Db, when: &str) -> Option<Head> {
    match head(db).await {
        Ok(head) => {
            tracing::info!(seq = head.seq, hash = %head.hash, "audit journal head {when}: {head}");
            Some(head)
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not read the audit journal's head {when}");
            None
        }
    }
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

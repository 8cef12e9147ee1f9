//! The row a transition is recorded as: `audit_inbox`, written in the
//! transaction that makes the transition. It is part of the [`Sink`](super::Sink)
//! contract, kept in the core because the core writes it itself: a claim on
//! PostgreSQL inserts its rows in the claim's own statement (one round trip).

use platform::{Tx, on_tx};

use super::Record;

/// Writes `records` as inbox rows in `tx`, so they commit (or not) with
/// what they record; the sink that reads the inbox (the journal) takes them
/// from there.
pub async fn record(tx: &mut Tx, records: &[Record]) -> Result<(), sqlx::Error> {
    // a statement binds a bounded number of parameters
    for chunk in records.chunks(RECORDS_PER_STATEMENT) {
        let sql = format!("{INBOX_INSERT} VALUES {}", placeholders(1, chunk.len(), INBOX_COLUMNS));
        on_tx!(tx, |conn| {
            bind_records!(sqlx::query(sqlx::AssertSqlSafe(sql.as_str())), chunk)
                .execute(conn)
                .await?;
        });
    }
    Ok(())
}

/// Writes many `records` as inbox rows in `tx`, in their order, in one
/// statement whose text never changes: the records travel as one JSON array.
/// Bound a field at a time, as [`record`] binds a transaction's few, a
/// statement of thousands of rows costs SQLite a scan of its parameters for
/// every one it binds; a process that writes the observations it holds
/// (thousands of them) would spend its time there.
pub async fn record_many(tx: &mut Tx, records: &[Record]) -> Result<(), sqlx::Error> {
    const POSTGRES: &str = "INSERT INTO audit_inbox \
         (account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, at, \
          attempt, resource_type, resource_id, state, evidence) \
         SELECT account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, \
                at, attempt, resource_type, resource_id, state, evidence \
         FROM jsonb_to_recordset($1::jsonb) AS r \
             (n bigint, account_id text, principal_id text, operation_id text, idempotency_key text, \
              fingerprint text, route text, event text, external_ref text, at timestamptz, attempt bigint, \
              resource_type text, resource_id text, state text, evidence text) \
         ORDER BY n";
    const SQLITE: &str = "INSERT INTO audit_inbox \
         (account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, at, \
          attempt, resource_type, resource_id, state, evidence) \
         SELECT value->>'account_id', value->>'principal_id', value->>'operation_id', value->>'idempotency_key', \
                value->>'fingerprint', value->>'route', value->>'event', value->>'external_ref', value->>'at', \
                value->>'attempt', value->>'resource_type', value->>'resource_id', value->>'state', \
                value->>'evidence' \
         FROM json_each($1) ORDER BY key";
    if records.is_empty() {
        return Ok(());
    }
    let rows: Vec<serde_json::Value> = records
        .iter()
        .enumerate()
        .map(|(n, r)| {
            serde_json::json!({
                "n": n,
                "account_id": r.account_id,
                "principal_id": r.principal_id,
                "operation_id": r.operation_id,
                "idempotency_key": r.idempotency_key,
                "fingerprint": r.fingerprint,
                "route": r.route,
                "event": r.event.as_str(),
                "external_ref": r.external_ref,
                "at": r.at,
                "attempt": r.attempt,
                "resource_type": r.change.as_ref().map(|c| &c.resource_type),
                "resource_id": r.change.as_ref().map(|c| &c.resource_id),
                "state": r.change.as_ref().map(|c| &c.state),
                "evidence": r.evidence,
            })
        })
        .collect();
    let json = serde_json::to_string(&rows).map_err(|e| sqlx::Error::Encode(e.into()))?;
    tx.insert_json_rows([POSTGRES, SQLITE], json, records.len()).await
}

/// Records per INSERT: SQLite binds at most 32,766 parameters a statement.
const RECORDS_PER_STATEMENT: usize = 1_000;

pub(crate) const INBOX_INSERT: &str = "INSERT INTO audit_inbox \
     (account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, at, \
      attempt, resource_type, resource_id, state, evidence)";

/// Parameters per inbox row.
pub(crate) const INBOX_COLUMNS: usize = 14;

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
                .bind(r.attempt)
                .bind(r.change.as_ref().map(|c| c.resource_type.as_str()))
                .bind(r.change.as_ref().map(|c| c.resource_id.as_str()))
                .bind(r.change.as_ref().map(|c| c.state.as_str()))
                .bind(r.evidence.as_deref());
        }
        query
    }};
}

pub(crate) use bind_records;

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

//! The `audit_inbox` row a transition is recorded as (docs/design.md §8). It
//! is in the core because a claim writes it in its own call.

use platform::{Tx, on_tx};

use super::Record;

/// Writes `records` as inbox rows in `tx`, to commit or roll back with it.
pub async fn record(tx: &mut Tx, records: &[Record]) -> Result<(), sqlx::Error> {
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

/// Records per INSERT: SQLite binds at most 32,766 parameters a statement.
const RECORDS_PER_STATEMENT: usize = 1_000;

pub(crate) const INBOX_INSERT: &str = "INSERT INTO audit_inbox \
     (account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, at, \
      attempt, resource_type, resource_id, state, evidence)";

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
                .bind(r.event.into_str())
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

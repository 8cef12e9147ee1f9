//! How a transition reaches the journal: its records go into `audit_inbox`
//! in the transaction that makes the transition, so they commit (or not)
//! with it; the chainer links them later (docs/design.md §8).

use platform::{Principal, Timestamp, Tx, on_tx};

use super::chain::{AuditEvent, Record, StateChange};

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

/// Records the events of a transition inside the transaction that makes it
/// (the claim, the completion, a decision), so they commit — or not — with
/// what they record. They wait in `audit_inbox` until the [`Journal`](super::Journal)'s
/// chainer links them; no writer waits for another on the chain.
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

/// Records per INSERT: SQLite binds at most 32,766 parameters a statement.
const RECORDS_PER_STATEMENT: usize = 1_000;

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

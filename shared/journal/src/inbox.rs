//! What a service journals itself, in the transaction that makes the change:
//! a state changed with no key, and a resource a worker moved; and the
//! observations the chainer holds past its bound. All are inbox rows, like
//! every transition; the chainer links them later (docs/design.md §8).

use idempotency::transitions::{AuditEvent, Record, StateChange, inbox::record};
use platform::{Principal, Timestamp, Tx, on_tx};

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
        .bind(AuditEvent::StateChanged.into_str())
        .bind(Timestamp::now())
        .bind(state)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(recorded == 1)
}

/// Writes many `records` as inbox rows in `tx`, in their order, in one
/// statement whose text never changes: the records travel as one JSON array.
/// Bound a field at a time, as [`record`] binds a transaction's few, a
/// statement of thousands of rows costs SQLite a scan of its parameters for
/// every one it binds; a process that writes the observations it holds
/// (thousands of them) would spend its time there.
pub(crate) async fn record_many(tx: &mut Tx, records: &[Record]) -> Result<(), sqlx::Error> {
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
                "event": r.event.into_str(),
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

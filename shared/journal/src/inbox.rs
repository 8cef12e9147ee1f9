//! What a service journals itself, in the transaction that makes the change:
//! a state changed with no key, and a resource a worker moved. Both are
//! inbox rows, like every transition; the chainer links them later
//! (docs/design.md §8).

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
        .bind(AuditEvent::StateChanged.as_str())
        .bind(Timestamp::now())
        .bind(state)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(recorded == 1)
}

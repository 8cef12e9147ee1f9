//! Outbox work the service ends itself, in a transaction of its own
//! (docs/design.md §5): an event withdrawn before it was ever sent (a cancel),
//! and work that went on at the external system after it accepted it (a
//! rollout), finished when the service sees it end. Each end is reported to
//! the layer's sink, in that transaction, as the worker's are.

use idempotency::{Idempotency, OperationIdentity, OperationState, transitions::AuditEvent};
use platform::{Timestamp, Tx};

use crate::store;

/// Withdraws an operation's event that was never handed to the external
/// system — a cancel that came before the delivery — in `tx`: the event fails
/// with `reason`, and its operation with it (reported `failed`, by `by`, to
/// the sink of `idempotency`, the service's layer).
/// `false`: a worker has it, or it was sent at least once (even if it is due
/// to be sent again, the external system may have it): it must be cancelled
/// there.
pub async fn withdraw(
    idempotency: &Idempotency,
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    by: &str,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let now = Timestamp::now();
    let Some((idempotency_key, fingerprint, route)) =
        store::withdraw_unsent(tx, account_id, operation_id, reason, now).await?
    else {
        return Ok(false);
    };
    let operation = Ended {
        account_id,
        operation_id,
        idempotency_key,
        fingerprint,
        route,
        external_ref: None,
    };
    operation.end(idempotency, tx, OperationState::Failed, by, now).await?;
    Ok(true)
}

/// Ends an operation whose work went on at the external system after it
/// accepted it ([`Ledger::completes_on_acceptance`](crate::Ledger::completes_on_acceptance)):
/// `completed` or `failed`, reported by `by` to the sink of `idempotency`, in
/// `tx` (the one that records how the work ended in the service's own rows).
/// `false`: it had ended already.
pub async fn finish(
    idempotency: &Idempotency,
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    ended: OperationState,
    by: &str,
) -> Result<bool, sqlx::Error> {
    let Some(((idempotency_key, fingerprint, route), external_ref)) =
        store::delivered_in_progress(tx, account_id, operation_id).await?
    else {
        return Ok(false);
    };
    let operation = Ended {
        account_id,
        operation_id,
        idempotency_key,
        fingerprint,
        route,
        external_ref,
    };
    operation.end(idempotency, tx, ended, by, Timestamp::now()).await?;
    Ok(true)
}

/// An operation whose outbox work is being ended by the service (withdrawn,
/// or finished at the external system).
struct Ended<'a> {
    account_id: &'a str,
    operation_id: &'a str,
    idempotency_key: String,
    fingerprint: String,
    route: String,
    external_ref: Option<String>,
}

impl Ended<'_> {
    async fn end(
        self,
        idempotency: &Idempotency,
        tx: &mut Tx,
        state: OperationState,
        by: &str,
        now: Timestamp,
    ) -> Result<(), sqlx::Error> {
        if !store::settle_external(tx, self.account_id, self.operation_id, state, None, now).await? {
            return Err(sqlx::Error::Protocol(format!(
                "operation {} is not waiting for its outbox work",
                self.operation_id
            )));
        }
        let event = if state == OperationState::Completed {
            AuditEvent::Completed
        } else {
            AuditEvent::Failed
        };
        let identity = OperationIdentity {
            account_id: self.account_id,
            operation_id: self.operation_id,
            idempotency_key: &self.idempotency_key,
            fingerprint: &self.fingerprint,
            route: &self.route,
        };
        let ended = identity.audit(event, by, self.external_ref.as_deref(), now);
        idempotency.transitions().record(tx, &[ended]).await
    }
}

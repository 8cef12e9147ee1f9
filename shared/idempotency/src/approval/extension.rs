//! Approvals as an extension of the layer ([`crate::Extension`]):
//! the approval in an operation's status, the approvals' gauges, and the
//! expiry of approvals past their time.

use platform::{Db, Timestamp, metrics::Metrics, metrics::names};

use crate::{
    layer::Idempotency,
    layer::{Boxed, Extension},
    operation::OperationRecord,
    status::{OperationApproval, OperationView},
};

const APPROVAL_STATES: [&str; 4] = ["pending", "approved", "rejected", "expired"];

/// Approvals bound to the exact operation (docs/contract.md §6), as the layer
/// sees them beside its operations.
#[derive(Debug, Default)]
pub struct Approvals;

impl Extension for Approvals {
    fn describe<'a>(
        &'a self,
        db: &'a Db,
        operation: &'a OperationRecord,
        view: &'a mut OperationView,
    ) -> Boxed<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let Some(id) = &operation.approval_id else {
                return Ok(());
            };
            let approval = super::find(db, &operation.account_id, id).await?;
            view.approval = approval.map(|a| OperationApproval {
                state: a.state(Timestamp::now()),
                approval_id: a.approval_id,
                expires_at: a.expires_at,
                decided_by: a.decided_by,
                decided_at: a.decided_at,
            });
            Ok(())
        })
    }

    fn read_gauges<'a>(
        &'a self,
        db: &'a Db,
        metrics: &'a Metrics,
        now: Timestamp,
    ) -> Boxed<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let approvals = super::count_by_state(db, now).await?;
            crate::gauges::set_each(metrics, names::APPROVALS, &APPROVAL_STATES, &approvals);
            Ok(())
        })
    }

    /// Expires the approvals past their time, as often as the reaper reaps.
    fn keep(&self, idempotency: &Idempotency) -> Option<Boxed<'static, ()>> {
        let idempotency = idempotency.clone();
        Some(Box::pin(async move {
            let mut tick = tokio::time::interval(idempotency.config.reap_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match idempotency.expire_due_approvals().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(expired = n, "approvals expired; their operations are rejected"),
                    Err(e) => tracing::warn!(error = %e, "could not expire approvals; trying again next round"),
                }
            }
        }))
    }
}

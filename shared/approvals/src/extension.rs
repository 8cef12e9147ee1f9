//! Approvals as an extension of the layer ([`idempotency::Extension`]):
//! the approval in an operation's status, the approvals' gauges, and the
//! expiry of approvals past their time.

use idempotency::{
    BoxFuture, Extension, Idempotency, OperationRecord,
    status::{OperationApproval, OperationView},
};
use platform::{Db, Timestamp, metrics::Metrics, metrics::names};

use crate::{Approvals, expire_due, store};

const APPROVAL_STATES: [&str; 4] = ["pending", "approved", "rejected", "expired"];

impl Extension for Approvals {
    fn describe<'a>(
        &'a self,
        db: &'a Db,
        operation: &'a OperationRecord,
        view: &'a mut OperationView,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let Some(id) = &operation.approval_id else {
                return Ok(());
            };
            let approval = store::find(db, &operation.account_id, id).await?;
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
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let approvals = store::count_by_state(db, now).await?;
            platform::metrics::gauges::set_each(metrics, names::APPROVALS, &APPROVAL_STATES, &approvals);
            Ok(())
        })
    }

    /// Expires the approvals past their time, as often as the reaper reaps.
    fn keep(&self, idempotency: &Idempotency) -> Option<BoxFuture<'static, ()>> {
        let idempotency = idempotency.clone();
        Some(Box::pin(async move {
            let mut tick = tokio::time::interval(idempotency.config().reap_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match expire_due(&idempotency).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(expired = n, "approvals expired; their operations are rejected"),
                    Err(e) => tracing::warn!(error = %e, "could not expire approvals; trying again next round"),
                }
            }
        }))
    }
}

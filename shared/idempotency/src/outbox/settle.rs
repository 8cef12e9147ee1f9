//! Writing what an outcome comes to ([`plan`](super::plan)): the event, its
//! operation, the service's rows and the journal in one transaction, under a
//! compare-and-set on the event's lease (docs/design.md §5).

use std::time::Duration;

use platform::Timestamp;

use super::{
    Destination, Outbox, OutboxEvent,
    plan::{Due, Outcome, Plan, plan},
    store,
};
use crate::audit::{self, Record};

impl<D: Destination> Outbox<D> {
    /// Settles `event` with what its delivery or lookup came to, and logs
    /// what became of it.
    pub(super) async fn settle(&self, event: &OutboxEvent, outcome: Outcome) {
        let plan = plan(&outcome, self.destination.completes_on_acceptance(event));
        let written = self.write(event, &plan).await;
        if plan.wake_worker {
            self.idempotency.outbox_wake.notify_one();
        }
        match written {
            Ok(true) if plan.settles.is_some() => log_settled(event, &outcome),
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(event_id = %event.event_id, "the event's lease ran out; its new holder settles it")
            }
            Err(e) => tracing::error!(event_id = %event.event_id, error = %e,
                "could not record how the event ended; it is taken again when its lease ends"),
        }
    }

    /// Writes `plan` in one transaction. `false`: the lease was lost, and
    /// whoever holds the event now settles it.
    async fn write(&self, event: &OutboxEvent, plan: &Plan<'_>) -> Result<bool, sqlx::Error> {
        let wait = match plan.due {
            Due::Now => Duration::ZERO,
            Due::AfterBackoff => self.config.backoff_after(event.deliveries),
            Due::AfterReconcileWait => self.config.reconcile_after,
        };
        let now = Timestamp::now();
        let mut tx = self.idempotency.db.begin().await?;
        if !store::let_go(
            &mut tx,
            event,
            plan.event,
            now.plus(wait),
            plan.external_ref,
            plan.last_error,
            now,
        )
        .await?
        {
            tx.rollback().await?;
            return Ok(false);
        }
        if let Some(settles) = &plan.settles {
            let settled = crate::store::settle_external(
                &mut tx,
                &event.account_id,
                &event.operation_id,
                settles.operation,
                plan.external_ref,
                now,
            )
            .await?;
            if !settled {
                tx.rollback().await?;
                return Err(sqlx::Error::Protocol(format!(
                    "operation {} of event {} is not waiting for its delivery",
                    event.operation_id, event.event_id
                )));
            }
            self.destination.settle(&mut tx, event, settles.business).await?;
            let journaled: Vec<Record> = settles
                .journal
                .iter()
                .map(|&(what, by)| event.audit(what, by, plan.external_ref, now))
                .collect();
            audit::record(&mut tx, &journaled).await?;
        }
        tx.commit().await?;
        Ok(true)
    }
}

/// How a settled event's operation ended; an event only tried again was
/// logged by its holder when it decided so.
fn log_settled(event: &OutboxEvent, outcome: &Outcome) {
    match outcome {
        Outcome::Accepted { external_ref } | Outcome::Found { external_ref } => {
            let reconciled = matches!(outcome, Outcome::Found { .. });
            tracing::info!(event_id = %event.event_id, operation_id = %event.operation_id, %external_ref,
                reconciled, "delivered: the operation is completed")
        }
        Outcome::Refused { reason } => {
            tracing::warn!(event_id = %event.event_id, operation_id = %event.operation_id, %reason,
                "refused by the external system: the operation failed")
        }
        Outcome::AnswerLost { reason } | Outcome::NotAsked { reason, .. } => {
            tracing::warn!(event_id = %event.event_id, operation_id = %event.operation_id, %reason,
                "the answer was lost: the operation is unknown until the reconciler asks")
        }
        Outcome::NotAccepted { .. } | Outcome::Absent => {}
    }
}

//! Writing what an outcome comes to ([`plan`](crate::plan)): the event, its
//! operation, the service's rows and the journal in one transaction, under a
//! compare-and-set on the event's lease (docs/design.md §5).

use std::time::Duration;

use idempotency::{
    status::EventState,
    transitions::{AuditEvent, Record},
};
use platform::{Timestamp, metrics::names};

use crate::{
    Outbox,
    event::{Destination, OutboxEvent},
    plan::{Due, Outcome, Plan, plan},
    store::{self, LetGo},
};

impl<D: Destination> Outbox<D> {
    /// Settles `event` with what its delivery or lookup came to, and logs
    /// what became of it.
    pub(crate) async fn settle(&self, event: &OutboxEvent, outcome: Outcome) {
        let plan = plan(&outcome, self.ledger.completes_on_acceptance(event));
        let written = self.write(event, &plan, outcome.by()).await;
        if plan.wake_worker {
            self.idempotency.work_handed_on().notify_one();
        }
        match written {
            Ok(Some(EventState::Dead)) => self.dead(event, plan.last_error.unwrap_or("")),
            Ok(Some(_)) if plan.settles.is_some() => log_settled(event, &outcome),
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::warn!(event_id = %event.event_id, "the event's lease ran out; its new holder settles it")
            }
            Err(e) => {
                tracing::error!(event_id = %event.event_id, error = %e, "could not record how the event ended");
                self.count_failed_settlement(event, outcome.by()).await;
            }
        }
    }

    /// Writes `plan` in one transaction. `Some(state)`: the event's new state
    /// (`dead` when this was its last allowed failure); `None`: the lease was
    /// lost, and whoever holds the event now settles it.
    /// `by`: the worker or the reconciler, who journals the event's death.
    async fn write(&self, event: &OutboxEvent, plan: &Plan<'_>, by: &str) -> Result<Option<EventState>, sqlx::Error> {
        let wait = match plan.due {
            Due::Now => Duration::ZERO,
            // lookups that fail count too, so an outage is asked about less and less often
            Due::AfterBackoff => self.config.backoff_after(event.deliveries.max(event.failures + 1)),
            Due::AfterReconcileWait => self.config.reconcile_after,
        };
        let (state, failures) = plan.event_after(event.failures, self.config.max_failures);
        let now = Timestamp::now();
        let mut tx = self.idempotency.begin().await?;
        let to = LetGo {
            state,
            failures,
            next_attempt_at: now.plus(wait),
            external_ref: plan.external_ref,
            last_error: plan.last_error,
        };
        if !store::let_go(&mut tx, event, to, now).await? {
            tx.rollback().await?;
            return Ok(None);
        }
        if let Some(settles) = &plan.settles {
            if !store::settle_external(
                &mut tx,
                &event.account_id,
                &event.operation_id,
                settles.operation,
                plan.external_ref,
                now,
            )
            .await?
            {
                tx.rollback().await?;
                return Err(sqlx::Error::Protocol(format!(
                    "operation {} of event {} is not waiting for its delivery",
                    event.operation_id, event.event_id
                )));
            }
            self.ledger.settle(&mut tx, event, settles.business).await?;
        }
        let mut journaled: Vec<Record> = plan
            .settles
            .iter()
            .flat_map(|settles| settles.journal.iter())
            .map(|&(what, by)| event.audit(what, by, plan.external_ref, now))
            .collect();
        if state == EventState::Dead {
            journaled.push(event.audit(AuditEvent::DeadLettered, by, None, now));
        }
        self.idempotency.transitions().record(&mut tx, &journaled).await?;
        tx.commit().await?;
        Ok(Some(state))
    }

    /// Counts a settlement that could not be written as one failure of the
    /// event, which then waits for its lease to end (or is dead). A failure
    /// to count it is logged: the event is taken again all the same.
    async fn count_failed_settlement(&self, event: &OutboxEvent, by: &str) {
        // the database's own words stay in the log: they may name tables and values
        const WHY: &str = "its settlement could not be written (the service's log says why)";
        let counted = async {
            let now = Timestamp::now();
            let mut tx = self.idempotency.begin().await?;
            let dead = store::count_failed_settlement(&mut tx, event, WHY, self.config.max_failures, now).await?;
            if dead == Some(true) {
                let entry = event.audit(AuditEvent::DeadLettered, by, None, now);
                self.idempotency.transitions().record(&mut tx, &[entry]).await?;
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(dead)
        };
        match counted.await {
            Ok(Some(true)) => self.dead(event, WHY),
            Ok(_) => tracing::warn!(event_id = %event.event_id, "it is taken again when its lease ends"),
            Err(e) => tracing::error!(event_id = %event.event_id, error = %e,
                "could not count the failed settlement; the event is taken again when its lease ends"),
        }
    }
}

impl<D: Destination> Outbox<D> {
    /// Counts and logs an event that has just become dead.
    fn dead(&self, event: &OutboxEvent, last_error: &str) {
        self.idempotency.metrics().count(names::OUTBOX_DEAD_LETTERED, &[]);
        log_dead(event, last_error);
    }
}

fn log_dead(event: &OutboxEvent, last_error: &str) {
    tracing::error!(event_id = %event.event_id, operation_id = %event.operation_id, %last_error,
        "the event failed too often and is dead: it is not tried again until an admin sends it again \
         or settles its operation");
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

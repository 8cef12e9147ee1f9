//! Settling an event: what the worker's delivery or the reconciler's lookup
//! came to, written to the event, its operation, the service's rows and the
//! journal in one transaction, under a compare-and-set on the event's lease.

use std::time::Duration;

use platform::Timestamp;

use super::{Destination, EventState, Outbox, OutboxEvent, RECONCILER, Settlement, WORKER, store};
use crate::{
    audit::{self, AuditEvent},
    operation::OperationState,
};

/// How an event ends: what the event, its operation and the journal become.
/// `reconciled`: the reconciler found it out, not the worker.
pub(super) enum Outcome {
    Accepted { external_ref: String, reconciled: bool },
    Refused { reason: String },
    Unknown { reason: String, reconciled: bool },
}

impl<D: Destination> Outbox<D> {
    /// Gives an event back to be tried again after `wait`; its operation does
    /// not change.
    pub(super) async fn reschedule(
        &self,
        event: &OutboxEvent,
        state: EventState,
        wait: Duration,
        reason: &str,
    ) -> Result<bool, sqlx::Error> {
        let now = Timestamp::now();
        let mut tx = self.idempotency.db.begin().await?;
        if !store::release(&mut tx, event, state, now.plus(wait), None, Some(reason), now).await? {
            tx.rollback().await?;
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Settles an event, its operation and the service's business rows in
    /// one transaction, and journals how it ended. `false`: the lease was
    /// lost, and whoever holds the event now settles it.
    pub(super) async fn settle(&self, event: &OutboxEvent, outcome: Outcome) -> Result<bool, sqlx::Error> {
        let now = Timestamp::now();
        // work that goes on at the external system after it accepted keeps its operation in progress
        let completes = self.destination.completes_on_acceptance(event);
        let (event_state, operation_state, external_ref, last_error) = match &outcome {
            Outcome::Accepted { external_ref, .. } => (
                EventState::Delivered,
                if completes {
                    OperationState::Completed
                } else {
                    OperationState::InProgress
                },
                Some(external_ref.as_str()),
                None,
            ),
            Outcome::Refused { reason } => (EventState::Failed, OperationState::Failed, None, Some(reason.as_str())),
            Outcome::Unknown { reason, .. } => (
                EventState::Unknown,
                OperationState::Unknown,
                None,
                Some(reason.as_str()),
            ),
        };
        let (settlement, journaled) = match &outcome {
            Outcome::Accepted {
                external_ref,
                reconciled,
            } => {
                let (found, by) = if *reconciled {
                    (AuditEvent::Reconciled, RECONCILER)
                } else {
                    (AuditEvent::Accepted, WORKER)
                };
                let mut journaled = vec![event.audit(found, by, Some(external_ref), now)];
                if completes {
                    journaled.push(event.audit(AuditEvent::Completed, by, Some(external_ref), now));
                }
                (Settlement::Accepted { external_ref }, journaled)
            }
            Outcome::Refused { reason } => (
                Settlement::Refused { reason },
                vec![event.audit(AuditEvent::Failed, WORKER, None, now)],
            ),
            Outcome::Unknown { reconciled, .. } => (
                Settlement::Unknown,
                vec![event.audit(
                    AuditEvent::Unknown,
                    if *reconciled { RECONCILER } else { WORKER },
                    None,
                    now,
                )],
            ),
        };
        // an unknown outcome is asked about after a while; a settled one is never due again
        let next_attempt_at = now.plus(self.config.reconcile_after);

        let mut tx = self.idempotency.db.begin().await?;
        if !store::release(
            &mut tx,
            event,
            event_state,
            next_attempt_at,
            external_ref,
            last_error,
            now,
        )
        .await?
        {
            tx.rollback().await?;
            return Ok(false);
        }
        let settled = crate::store::settle_external(
            &mut tx,
            &event.account_id,
            &event.operation_id,
            operation_state,
            external_ref,
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
        self.destination.settle(&mut tx, event, settlement).await?;
        audit::record(&mut tx, &journaled).await?;
        tx.commit().await?;
        match &outcome {
            Outcome::Accepted {
                external_ref,
                reconciled,
            } => {
                tracing::info!(event_id = %event.event_id, operation_id = %event.operation_id, %external_ref,
                    reconciled, "delivered: the operation is completed")
            }
            Outcome::Refused { reason } => {
                tracing::warn!(event_id = %event.event_id, operation_id = %event.operation_id, %reason,
                    "refused by the external system: the operation failed")
            }
            Outcome::Unknown { reason, .. } => {
                tracing::warn!(event_id = %event.event_id, operation_id = %event.operation_id, %reason,
                    "the answer was lost: the operation is unknown until the reconciler asks")
            }
        }
        Ok(true)
    }
}

pub(super) fn log_failure(event: &OutboxEvent, settled: Result<bool, sqlx::Error>) {
    match settled {
        Ok(true) => {}
        Ok(false) => tracing::warn!(event_id = %event.event_id, "the event's lease ran out; its new holder settles it"),
        Err(e) => tracing::error!(event_id = %event.event_id, error = %e,
            "could not record how the event ended; it is taken again when its lease ends"),
    }
}

//! The reconciler: takes every event whose fate nobody knows — an answer
//! lost, or a worker that died holding the event — and asks the external
//! system by the key, then by the service's own reference, through
//! [`Destination::look_up`] (docs/contract.md §5, docs/design.md §6).

use idempotency::status::EventState;
use platform::{Timestamp, metrics::names};

use crate::{
    Outbox,
    answer::Lookup,
    event::{Destination, OutboxEvent},
    new_lease_token,
    plan::Outcome,
    store,
};

impl<D: Destination> Outbox<D> {
    /// The reconciler: asks the external system about every event whose fate
    /// is unknown — an answer lost, or a worker that died holding the event.
    /// Returns how many it took.
    pub async fn reconcile_due(&self) -> Result<usize, sqlx::Error> {
        let now = Timestamp::now();
        let token = new_lease_token();
        let mut tx = self.idempotency.begin().await?;
        let events = store::take_due(
            &mut tx,
            &[EventState::Sending, EventState::Unknown],
            false,
            &token,
            now.plus(self.config.lease),
            now,
            self.config.batch,
        )
        .await?;
        tx.commit().await?;
        let taken = events.len();
        futures::future::join_all(events.into_iter().map(|event| self.reconcile(event))).await;
        Ok(taken)
    }

    /// Reconciles due events until the task is aborted, looking every `poll`
    /// when there were none.
    pub(crate) async fn run_reconciler(&self) {
        loop {
            let taken = self.reconcile_due().await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "reconciler: could not take events to reconcile; trying again");
                0
            });
            if taken == 0 {
                tokio::time::sleep(self.config.poll).await;
            }
        }
    }

    async fn reconcile(&self, event: OutboxEvent) {
        let found = tokio::time::timeout(self.config.delivery_timeout, self.destination.look_up(&event))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.config.delivery_timeout)))
            .map(Lookup::checked);
        let outcome = Outcome::looked_up(found, event.state);
        let result = match outcome {
            Outcome::Found { .. } => "found",
            Outcome::Absent => "absent",
            _ => "not_asked",
        };
        self.idempotency
            .metrics()
            .count(names::OUTBOX_RECONCILIATIONS, &[("result", result)]);
        match &outcome {
            Outcome::Absent => tracing::info!(event_id = %event.event_id, operation_id = %event.operation_id,
                "reconciler: the external system has no trace of it; it is sent again with the same key"),
            Outcome::NotAsked { reason, sending: false } => {
                tracing::warn!(event_id = %event.event_id, %reason, "reconciler: could not ask; asking again later")
            }
            _ => {}
        }
        self.settle(&event, outcome).await;
    }
}

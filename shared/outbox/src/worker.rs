//! The worker: takes due `pending` events, sends each through the service's
//! [`Destination`] with its external key, and settles it with the answer
//! (docs/contract.md §5, docs/design.md §5).

use idempotency::{
    status::EventState,
    transitions::{AuditEvent, Record},
};
use platform::{Timestamp, fail_point::fail_point, metrics::names};

use crate::{
    Outbox,
    answer::Delivery,
    event::{Destination, OutboxEvent},
    new_lease_token,
    plan::WORKER,
    store,
};

impl<D: Destination> Outbox<D> {
    /// The worker: sends every pending event that is due, concurrently, and
    /// settles each with its answer. Returns how many it took.
    pub async fn deliver_due(&self) -> Result<usize, sqlx::Error> {
        let now = Timestamp::now();
        let token = new_lease_token();
        let mut tx = self.idempotency.begin().await?;
        let events = store::take_due(
            &mut tx,
            &[EventState::Pending],
            true,
            &token,
            now.plus(self.config.lease),
            now,
            self.config.batch,
        )
        .await?;
        // journaled with the take, so a crash after it still shows the dispatch
        let dispatched: Vec<Record> = events
            .iter()
            .map(|e| e.audit(AuditEvent::Dispatched, WORKER, None, now))
            .collect();
        self.idempotency.transitions().record(&mut tx, &dispatched).await?;
        tx.commit().await?;
        let taken = events.len();
        futures::future::join_all(events.into_iter().map(|event| self.deliver(event))).await;
        Ok(taken)
    }

    /// Delivers due events until the task is aborted; starts at once when an
    /// effect in this process wrote an event, otherwise looks every `poll`.
    pub(crate) async fn run_worker(&self) {
        let wake = self.idempotency.work_handed_on();
        loop {
            let taken = self.deliver_due().await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "outbox: could not take events to deliver; trying again");
                0
            });
            if taken == 0 {
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep(self.config.poll) => {}
                }
            }
        }
    }

    async fn deliver(&self, event: OutboxEvent) {
        fail_point("outbox::before_delivery").await;
        let delivery = tokio::time::timeout(self.config.delivery_timeout, self.destination.deliver(&event))
            .await
            .unwrap_or_else(|_| Delivery::AnswerLost {
                reason: format!("no answer within {:?}", self.config.delivery_timeout),
            })
            .checked();
        fail_point("outbox::after_delivery").await;
        self.idempotency
            .metrics()
            .count(names::OUTBOX_DELIVERIES, &[("result", delivery.result())]);
        if let Delivery::NotAccepted { reason } = &delivery {
            tracing::warn!(event_id = %event.event_id, operation_id = %event.operation_id, %reason,
                "not accepted; it is sent again later with the same key");
        }
        self.settle(&event, delivery.into()).await;
    }
}

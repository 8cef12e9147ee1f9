//! The outbox as an extension of the layer ([`idempotency::Extension`]):
//! its event's state in an operation's status, the outbox's gauges, and the
//! operations it leaves for a person; and the service's [`Ledger`] and
//! [`Witness`], which the layer carries for the outbox and for the settling
//! routes.

use std::sync::Arc;

use idempotency::{
    BoxFuture, Extension, OperationRecord,
    status::{NeedsAPerson, OperationView},
};
use platform::{Db, Timestamp, metrics::Metrics, metrics::names};

use crate::{
    event::{Ledger, Witness},
    status,
};

const OUTBOX_STATES: [&str; 4] = ["pending", "sending", "unknown", "dead"];

/// The outbox's events (docs/contract.md §5), as the layer sees them beside
/// its operations, with what the service gives for them: the [`Ledger`] of
/// its rows and the [`Witness`] a person's resolution is checked with. A
/// service whose work leaves the process adds it to its layer
/// (`Idempotency::with_extension(Events::new(ledger, witness))`); its
/// [`Outbox`](crate::Outbox) and the settling routes find it there
/// (`Idempotency::extension::<Events>()`).
#[derive(Debug, Clone)]
pub struct Events {
    ledger: Arc<dyn Ledger>,
    witness: Arc<dyn Witness>,
}

impl Events {
    /// `ledger` writes how each event ended in the service's rows, for the
    /// worker, the reconciler and a person settling by hand alike; `witness`
    /// is the external system a person's resolution is checked with (the
    /// outbox's [`Destination`](crate::Destination), asked as the reconciler asks).
    pub fn new(ledger: impl Ledger, witness: impl Witness) -> Self {
        Events {
            ledger: Arc::new(ledger),
            witness: Arc::new(witness),
        }
    }

    pub(crate) fn ledger(&self) -> Arc<dyn Ledger> {
        self.ledger.clone()
    }

    pub(crate) fn witness(&self) -> &dyn Witness {
        self.witness.as_ref()
    }
}

impl Extension for Events {
    fn describe<'a>(
        &'a self,
        db: &'a Db,
        operation: &'a OperationRecord,
        view: &'a mut OperationView,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            if let Some(delivery) = status::delivery_of(db, &operation.account_id, &operation.operation_id).await? {
                view.outbox = Some(delivery.state);
                view.last_error = delivery.last_error;
            }
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
            let events = platform::metrics::gauges::counts(
                db,
                "SELECT state, COUNT(*) FROM idempotency_outbox \
                 WHERE state IN ('pending', 'sending', 'unknown', 'dead') GROUP BY state",
            )
            .await?;
            platform::metrics::gauges::set_each(metrics, names::OUTBOX_EVENTS, &OUTBOX_STATES, &events);
            let oldest_pending = platform::metrics::gauges::oldest(
                db,
                "SELECT MIN(created_at) FROM idempotency_outbox WHERE state = 'pending'",
            )
            .await?;
            metrics.set(
                names::OUTBOX_OLDEST_PENDING,
                &[],
                platform::metrics::gauges::age(oldest_pending, now),
            );
            Ok(())
        })
    }

    fn needing_a_person<'a>(
        &'a self,
        db: &'a Db,
        account_id: &'a str,
        which: NeedsAPerson,
        after_seq: i64,
        limit: i64,
    ) -> Option<BoxFuture<'a, Result<Vec<(i64, String)>, sqlx::Error>>> {
        Some(Box::pin(status::needing_a_person(
            db, account_id, which, after_seq, limit,
        )))
    }
}

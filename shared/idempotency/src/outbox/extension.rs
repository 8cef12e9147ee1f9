//! The outbox as an extension of the layer ([`crate::Extension`]):
//! its event's state in an operation's status, the outbox's gauges, and the
//! operations it leaves for a person.

use platform::{Db, Timestamp, metrics::Metrics, metrics::names};

use super::status;
use crate::{
    gauges,
    layer::{Boxed, Extension},
    operation::OperationRecord,
    status::{NeedsAPerson, OperationView},
};

const OUTBOX_STATES: [&str; 4] = ["pending", "sending", "unknown", "dead"];

/// The outbox's events (docs/contract.md §5), as the layer sees them beside
/// its operations.
#[derive(Debug, Default)]
pub struct Events;

impl Extension for Events {
    fn describe<'a>(
        &'a self,
        db: &'a Db,
        operation: &'a OperationRecord,
        view: &'a mut OperationView,
    ) -> Boxed<'a, Result<(), sqlx::Error>> {
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
    ) -> Boxed<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let events = gauges::counts(
                db,
                "SELECT state, COUNT(*) FROM idempotency_outbox \
                 WHERE state IN ('pending', 'sending', 'unknown', 'dead') GROUP BY state",
            )
            .await?;
            gauges::set_each(metrics, names::OUTBOX_EVENTS, &OUTBOX_STATES, &events);
            let oldest_pending = gauges::oldest(
                db,
                "SELECT MIN(created_at) FROM idempotency_outbox WHERE state = 'pending'",
            )
            .await?;
            metrics.set(names::OUTBOX_OLDEST_PENDING, &[], gauges::age(oldest_pending, now));
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
    ) -> Option<Boxed<'a, Result<Vec<(i64, String)>, sqlx::Error>>> {
        Some(Box::pin(status::needing_a_person(
            db, account_id, which, after_seq, limit,
        )))
    }
}

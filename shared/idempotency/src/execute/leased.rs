//! The leased claim mode ([`crate::ClaimMode::Leased`]): the claim commits on its own, then the
//! call-out, if any, and the effect run under its lease (`run.rs`; docs/design.md §3).

use axum::response::Response;
use platform::{ApiError, Tx, fail_point::fail_point, metrics::names};

use super::{Attempt, Effect, taken::Resolution};
use crate::{layer::Idempotency, operation::OperationIdentity, store, transitions::AuditEvent};

impl Idempotency {
    /// Claims under a lease, then calls out and runs the effect under it.
    pub(super) async fn execute_leased<T, W, F>(&self, attempt: &Attempt<'_>, call_out: W, effect: F) -> Response
    where
        W: AsyncFnOnce(&OperationIdentity<'_>) -> Result<T, ApiError>,
        F: AsyncFnOnce(&mut Tx, &OperationIdentity<'_>, T) -> Result<Effect, ApiError>,
    {
        match self.claim_or_resolve(attempt).await {
            Ok(Resolution::Run(operation)) => {
                attempt.record_operation(&operation.operation_id);
                fail_point("idempotency::after_claim").await;
                self.run(attempt, *operation, call_out, effect).await
            }
            Ok(Resolution::Answer(response)) => response,
            Ok(Resolution::Vanished) => {
                let vanished = ApiError::internal("the operation kept disappearing while it was claimed");
                self.server_error_unclaimed(attempt, vanished).await
            }
            Err(error) => self.server_error_unclaimed(attempt, error).await,
        }
    }

    /// Claims under a lease, in a transaction of its own; or answers as a duplicate.
    async fn claim_or_resolve(&self, attempt: &Attempt<'_>) -> Result<Resolution, ApiError> {
        // Bounded: each round either claims, resolves, or sees the row vanish.
        for _ in 0..3 {
            let new = attempt.new_operation(self.config.lease);
            let mut tx = self.begin().await?;
            let started = std::time::Instant::now();
            let claimed = store::claim(&mut tx, &new).await?;
            self.metrics
                .observe(names::CLAIM_DURATION, &[("mode", "leased")], started.elapsed());
            if let Some(claimed) = claimed {
                let journaled = [
                    new.audit(AuditEvent::Attempted, attempt.started),
                    new.audit(AuditEvent::Claimed, new.now),
                ];
                self.transitions.record(&mut tx, &journaled).await?;
                tx.commit().await?;
                return Ok(Resolution::Run(Box::new(claimed)));
            }
            tx.rollback().await?;
            match self.find_and_resolve(attempt, true).await? {
                Resolution::Vanished => continue,
                decision => return Ok(decision),
            }
        }
        Ok(Resolution::Vanished)
    }
}

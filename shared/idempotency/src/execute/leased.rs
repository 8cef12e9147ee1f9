//! The leased claim mode ([`crate::ClaimMode::Leased`]): the claim commits on
//! its own, holding a lease; the route's call-out, if it has one, and the
//! effect run under it (docs/design.md §3; docs/contract.md §5).

use axum::response::{IntoResponse, Response};
use platform::metrics::names;
use platform::{ApiError, Timestamp, Tx};

use super::{
    Attempt, Effect,
    conclude::{Claim, Concluded},
    taken::Resolution,
};
use crate::{
    fail_point::fail_point,
    fingerprint::Fingerprint,
    gate::Refusal,
    layer::Idempotency,
    operation::{OperationRecord, OperationState},
    store,
    transitions::AuditEvent,
};

impl Idempotency {
    /// [`ClaimMode::Leased`](crate::ClaimMode::Leased): the claim commits on its own, then this attempt
    /// calls out (if the route does) and runs the effect under its lease.
    pub(super) async fn execute_leased<T, W, F>(
        &self,
        attempt: &Attempt<'_>,
        fingerprint: &Fingerprint,
        call_out: W,
        effect: F,
    ) -> Response
    where
        W: AsyncFnOnce(&str) -> Result<T, ApiError>,
        F: AsyncFnOnce(&mut Tx, &str, T) -> Result<Effect, ApiError>,
    {
        match self.claim_or_resolve(attempt, fingerprint).await {
            Ok(Resolution::Run(operation)) => {
                attempt.record_operation(&operation.operation_id, fingerprint);
                fail_point("idempotency::after_claim").await;
                self.run(attempt, *operation, call_out, effect).await
            }
            Ok(Resolution::Answer(response)) => response,
            Ok(Resolution::Vanished) => {
                ApiError::internal("the operation kept disappearing while it was claimed").into_response()
            }
            Err(error) => {
                self.transitions
                    .observe(
                        &self.db,
                        attempt.audit(AuditEvent::Attempted, None, fingerprint, attempt.started),
                    )
                    .await;
                error.into_response()
            }
        }
    }

    /// [`ClaimMode::Leased`](crate::ClaimMode::Leased): claim under a lease in a transaction of its own.
    async fn claim_or_resolve(&self, attempt: &Attempt<'_>, fingerprint: &Fingerprint) -> Result<Resolution, ApiError> {
        // Bounded: each round either claims, resolves, or sees the row vanish.
        for _ in 0..3 {
            let new = attempt.new_operation(fingerprint, self.config.lease);
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
            let Some(existing) = self
                .find_and_count(&attempt.principal.account_id, &attempt.headers.key)
                .await?
            else {
                continue;
            };
            match self.resolve(attempt, existing, fingerprint, true).await? {
                Resolution::Vanished => continue,
                decision => return Ok(decision),
            }
        }
        Ok(Resolution::Vanished)
    }

    /// Runs the effect of an operation this attempt holds the lease of: first
    /// its call-out, if the route has one, outside any transaction; then the
    /// effect with what the call-out said. An operation that waited at the
    /// layer's gate runs only if the gate still lets it (its approval still
    /// allows it, and what its summary promised still holds), asked in the
    /// effect's own transaction (docs/contract.md §6).
    pub(super) async fn run<T, W, F>(
        &self,
        attempt: &Attempt<'_>,
        operation: OperationRecord,
        call_out: W,
        effect: F,
    ) -> Response
    where
        W: AsyncFnOnce(&str) -> Result<T, ApiError>,
        F: AsyncFnOnce(&mut Tx, &str, T) -> Result<Effect, ApiError>,
    {
        let token = operation.lease_token.clone().unwrap_or_default();
        let claim = Claim::Leased {
            operation: &operation,
            token: &token,
        };
        match self
            .run_under_lease(attempt, &claim, &operation, call_out, effect)
            .await
        {
            Concluded::Answer(response) => response,
            // our lease ran out and another attempt took over: its run is the one that counts
            Concluded::Lost => self.answer_current(attempt, &operation).await,
        }
    }

    /// The run itself, up to its conclusion; [`Self::run`] answers a lost
    /// lease.
    async fn run_under_lease<T, W, F>(
        &self,
        attempt: &Attempt<'_>,
        claim: &Claim<'_>,
        operation: &OperationRecord,
        call_out: W,
        effect: F,
    ) -> Concluded
    where
        W: AsyncFnOnce(&str) -> Result<T, ApiError>,
        F: AsyncFnOnce(&mut Tx, &str, T) -> Result<Effect, ApiError>,
    {
        let operation_id = operation.operation_id.as_str();
        // the claim has committed: only now may the operation reach another system
        let said = match call_out(operation_id).await {
            Ok(said) => said,
            Err(error) => return self.conclude_failed(attempt, claim, error).await,
        };
        let mut tx = match self.begin().await {
            Ok(tx) => tx,
            Err(e) => return Concluded::Answer(self.give_back(attempt, claim, e.into()).await),
        };
        if operation.approval_id.is_some() {
            match self.ask_gate(&mut tx, operation, attempt).await {
                Ok(None) => {}
                Ok(Some(refusal)) => {
                    let _ = tx.rollback().await;
                    return self.refuse(attempt, claim, &refusal).await;
                }
                Err(error) => {
                    let _ = tx.rollback().await;
                    return Concluded::Answer(self.give_back(attempt, claim, error).await);
                }
            }
        }
        let ran = effect(&mut tx, operation_id, said).await;
        // a promise the effect found broken in its own transaction refuses the operation as the gate's check would
        if let (Err(error), Some(_)) = (&ran, &operation.approval_id)
            && let Some(refusal) = self.gate().ok().and_then(|gate| gate.refusal(error, operation))
        {
            let _ = tx.rollback().await;
            return self.refuse(attempt, claim, &refusal).await;
        }
        self.conclude(attempt, claim, tx, ran).await
    }

    /// Why the layer's gate does not let `operation`, which waited at it, run
    /// after all, if it does not: asked in `tx`, the effect's transaction.
    async fn ask_gate(
        &self,
        tx: &mut Tx,
        operation: &OperationRecord,
        attempt: &Attempt<'_>,
    ) -> Result<Option<Refusal>, ApiError> {
        let asked = attempt.approval.as_deref();
        self.gate()?.check(tx, operation, asked, Timestamp::now()).await
    }

    /// Ends an operation its gate does not let run: `rejected`, with the
    /// refusal as its answer to every later attempt, journaled as its event.
    async fn refuse(&self, attempt: &Attempt<'_>, claim: &Claim<'_>, refusal: &Refusal) -> Concluded {
        self.store_final(
            attempt,
            claim,
            &refusal.answer,
            OperationState::Rejected,
            refusal.event,
            "rejected",
        )
        .await
    }
}

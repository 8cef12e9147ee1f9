//! [`ClaimMode::Leased`](crate::ClaimMode): the claim commits on its own,
//! holding a lease; the effect runs under it, after the route's call-out if it
//! has one, and completes the operation by compare-and-set on the lease token
//! (docs/design.md §3; docs/contract.md §5).

use axum::response::{IntoResponse, Response};
use platform::{ApiError, Timestamp, Tx, telemetry};

use super::{
    Attempt, Effect, fail_point,
    responses::{in_progress, problem_response, stored_response, with_operation_headers, with_retry_after},
    taken::Decision,
};
use crate::{
    Idempotency,
    approval::{self, ApprovalState, ExecutionCheck, refusal},
    audit::{self, AuditEvent, Record},
    fingerprint::Fingerprint,
    operation::{OperationRecord, OperationState},
    store::{self, Completion},
};

impl Idempotency {
    /// [`ClaimMode::Leased`]: the claim commits on its own, then this attempt
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
        match self.claim_or_decide(attempt, fingerprint).await {
            Ok(Decision::Run(operation)) => {
                attempt.record_operation(&operation.operation_id, fingerprint);
                fail_point("idempotency::after_claim").await;
                self.run(attempt, *operation, call_out, effect).await
            }
            Ok(Decision::Answer(response)) => response,
            Ok(Decision::Vanished) => {
                ApiError::internal("the operation kept disappearing while it was claimed").into_response()
            }
            Err(error) => {
                self.journal
                    .observe([attempt.audit(AuditEvent::Attempted, None, fingerprint, attempt.started)]);
                error.into_response()
            }
        }
    }

    /// [`ClaimMode::Leased`]: claim under a lease in a transaction of its own.
    pub(super) async fn claim_or_decide(
        &self,
        attempt: &Attempt<'_>,
        fingerprint: &Fingerprint,
    ) -> Result<Decision, ApiError> {
        // Bounded: each round either claims, decides, or saw the row vanish.
        for _ in 0..3 {
            let new = attempt.new_operation(fingerprint, self.config.lease);
            let mut tx = self.db.begin().await?;
            if let Some(claimed) = store::claim(&mut tx, &new).await? {
                let journaled = [
                    new.audit(AuditEvent::Attempted, attempt.started),
                    new.audit(AuditEvent::Claimed, new.now),
                ];
                audit::record(&mut tx, &journaled).await?;
                tx.commit().await?;
                return Ok(Decision::Run(Box::new(claimed)));
            }
            tx.rollback().await?;
            let Some(existing) = self
                .find_and_count(&attempt.principal.account_id, &attempt.headers.key)
                .await?
            else {
                continue;
            };
            match self.decide(attempt, existing, fingerprint, true).await? {
                Decision::Vanished => continue,
                decision => return Ok(decision),
            }
        }
        Ok(Decision::Vanished)
    }

    /// Runs the effect of an operation this attempt holds the lease of: first
    /// its call-out, if the route has one, outside any transaction; then the
    /// effect with what the call-out said. An operation bound to an approval
    /// runs only if the approval still allows it, checked in the effect's own
    /// transaction.
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
        let by = attempt.principal.principal_id.as_str();
        let (account_id, key, operation_id) = (&operation.account_id, &operation.key, &operation.operation_id);
        let journaled = |event: AuditEvent, at: Timestamp| [operation.audit(event, by, at)];
        let give_back = async |error: ApiError| {
            let freed = async {
                let mut tx = self.db.begin().await?;
                if store::release(&mut tx, &operation, &token).await? {
                    audit::record(&mut tx, &journaled(AuditEvent::Released, Timestamp::now())).await?;
                }
                tx.commit().await
            };
            if let Err(e) = freed.await {
                tracing::error!(%operation_id, error = %e, "could not free the key after a server error; it frees when the lease ends");
            }
            telemetry::record_outcome("server_error");
            with_operation_headers(error.into_response(), operation_id, false)
        };
        // a final business failure is stored and replayed; a server error frees the key
        let failed = async |error: ApiError| {
            if !error.is_final() {
                return give_back(error).await;
            }
            let response = problem_response(&error);
            let completion = Completion::failed(&response);
            match self
                .complete_alone(
                    &operation,
                    &token,
                    &completion,
                    &journaled(AuditEvent::Failed, completion.now),
                )
                .await
            {
                Ok(true) => {
                    telemetry::record_outcome("failed");
                    self.remember(account_id, key, operation_id, &operation.fingerprint, &completion);
                    with_retry_after(stored_response(&response, operation_id, false), &error)
                }
                Ok(false) => self.answer_current(attempt, &operation).await,
                Err(e) => give_back(e.into()).await,
            }
        };

        // the claim has committed: only now may the operation reach another system
        let said = match call_out(operation_id).await {
            Ok(said) => said,
            Err(error) => return failed(error).await,
        };
        let mut tx = match self.db.begin().await {
            Ok(tx) => tx,
            Err(e) => return give_back(e.into()).await,
        };
        if let Some(approval_id) = &operation.approval_id {
            let check = approval::check_for_execution(
                &mut tx,
                approval_id,
                operation_id,
                &operation.fingerprint,
                Timestamp::now(),
            )
            .await;
            match check {
                Ok(ExecutionCheck::Allowed) => {}
                Ok(refused) => {
                    let _ = tx.rollback().await;
                    let (state, event) = match refused {
                        ExecutionCheck::Expired => (ApprovalState::Expired, AuditEvent::Expired),
                        _ => (ApprovalState::Rejected, AuditEvent::Rejected),
                    };
                    let response = problem_response(&refusal(state, operation_id, approval_id));
                    let completion = Completion {
                        state: OperationState::Rejected,
                        ..Completion::failed(&response)
                    };
                    return match self
                        .complete_alone(&operation, &token, &completion, &journaled(event, completion.now))
                        .await
                    {
                        Ok(true) => {
                            telemetry::record_outcome("rejected");
                            self.remember(account_id, key, operation_id, &operation.fingerprint, &completion);
                            stored_response(&response, operation_id, false)
                        }
                        Ok(false) => self.answer_current(attempt, &operation).await,
                        Err(e) => give_back(e.into()).await,
                    };
                }
                Err(e) => {
                    let _ = tx.rollback().await;
                    return give_back(e.into()).await;
                }
            }
        }
        match effect(&mut tx, operation_id, said).await {
            Ok(done) => {
                let completion = done.completion();
                match store::complete(&mut tx, account_id, key, &token, &completion).await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Our lease ran out and another attempt took over: its run is the one that counts.
                        let _ = tx.rollback().await;
                        return self.answer_current(attempt, &operation).await;
                    }
                    Err(e) => {
                        let _ = tx.rollback().await;
                        return give_back(e.into()).await;
                    }
                }
                let recorded = async {
                    self.hand_to_outbox(&mut tx, operation.event_of(), &done, completion.now)
                        .await?;
                    if completion.state == OperationState::Completed {
                        audit::record(&mut tx, &journaled(AuditEvent::Completed, completion.now)).await?;
                    }
                    Ok::<_, sqlx::Error>(())
                };
                if let Err(e) = recorded.await {
                    let _ = tx.rollback().await;
                    return give_back(e.into()).await;
                }
                fail_point("idempotency::before_commit").await;
                if let Err(e) = tx.commit().await {
                    return give_back(e.into()).await;
                }
                self.wake_outbox(&done);
                telemetry::record_outcome("created");
                self.remember(account_id, key, operation_id, &operation.fingerprint, &completion);
                stored_response(&done.response, operation_id, false)
            }
            Err(error) => {
                let _ = tx.rollback().await;
                failed(error).await
            }
        }
    }

    /// Completes an operation this attempt holds, with no effect to commit
    /// beside it (a final failure, a refused approval), and journals it.
    /// `false`: the lease was lost.
    pub(super) async fn complete_alone(
        &self,
        operation: &OperationRecord,
        token: &str,
        completion: &Completion<'_>,
        journaled: &[Record],
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.db.begin().await?;
        if !store::complete(&mut tx, &operation.account_id, &operation.key, token, completion).await? {
            tx.rollback().await?;
            return Ok(false);
        }
        audit::record(&mut tx, journaled).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// After losing the lease: answer as a duplicate would.
    pub(super) async fn answer_current(&self, attempt: &Attempt<'_>, operation: &OperationRecord) -> Response {
        match store::find_by_key(&self.db, &operation.account_id, operation.key.as_str()).await {
            Ok(Some(current)) => match self.decide(attempt, current, &operation.fingerprint, false).await {
                Ok(Decision::Answer(response)) => response,
                Ok(_) => in_progress(operation),
                Err(error) => error.into_response(),
            },
            Ok(None) => in_progress(operation),
            Err(e) => ApiError::from(e).into_response(),
        }
    }
}

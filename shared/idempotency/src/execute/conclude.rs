//! How a run ends (step 5 of [`super`]), recorded at one exit the same way in both claim modes
//! (docs/design.md §2, §3).

use axum::response::{IntoResponse, Response};
use platform::metrics::names;
use platform::{ApiError, Timestamp, Tx, fail_point::fail_point, telemetry};

use super::{Attempt, Effect};
use crate::{
    layer::Idempotency,
    operation::{OperationIdentity, OperationRecord, OperationState, StoredResponse},
    responses::{commit_failed, problem_response, stored_response, with_operation_headers, with_retry_after},
    store::{self, Completion, NewOperation},
    transitions::AuditEvent,
};

/// How the attempt running the effect holds its operation: what its ending is written to.
pub(super) enum Claim<'a> {
    /// Nothing is claimed yet: the claim is inserted with the answer, and journals itself with it.
    InTransaction(&'a NewOperation<'a>),
    /// The claim has committed; its ending is a compare-and-set on the lease token.
    Leased {
        operation: &'a OperationRecord,
        token: &'a str,
    },
}

/// Where a run ended.
pub(super) enum Concluded {
    /// Recorded, or given back: answer this.
    Answer(Response),
    /// Another attempt holds the key and nothing of this run was written: answer as a duplicate would.
    Lost,
}

impl Claim<'_> {
    /// The operation the claim holds, or will once its insert commits.
    fn identity(&self) -> OperationIdentity<'_> {
        match self {
            Claim::InTransaction(new) => new.identity(),
            Claim::Leased { operation, .. } => operation.identity(),
        }
    }

    /// Writes the operation's ending in `tx`. `false`: another attempt holds the key, nothing was
    /// written, and `tx` must be rolled back.
    async fn end(
        &self,
        tx: &mut Tx,
        completion: &Completion<'_>,
        attempt: &Attempt<'_>,
        layer: &Idempotency,
    ) -> Result<bool, sqlx::Error> {
        match self {
            Claim::InTransaction(new) => {
                let started = std::time::Instant::now();
                let claimed =
                    store::claim_finished(tx, new, completion, attempt.started, layer.transitions.as_ref()).await;
                layer
                    .metrics
                    .observe(names::CLAIM_DURATION, &[("mode", "transaction")], started.elapsed());
                claimed
            }
            Claim::Leased { operation, token } => {
                store::complete(tx, &operation.account_id, &operation.key, token, completion).await
            }
        }
    }

    /// Reports `event` beside the ending; an in-transaction claim's insert carried its records already.
    async fn journal(
        &self,
        tx: &mut Tx,
        event: AuditEvent,
        attempt: &Attempt<'_>,
        at: Timestamp,
        layer: &Idempotency,
    ) -> Result<(), sqlx::Error> {
        match self {
            Claim::InTransaction(_) => Ok(()),
            Claim::Leased { operation, .. } => {
                let journaled = [operation.audit(event, &attempt.principal.principal_id, at)];
                layer.transitions.record(tx, &journaled).await
            }
        }
    }
}

impl Idempotency {
    pub(super) async fn conclude(
        &self,
        attempt: &Attempt<'_>,
        claim: &Claim<'_>,
        tx: Tx,
        ran: Result<Effect, ApiError>,
    ) -> Concluded {
        match ran {
            Ok(done) => self.commit_effect(attempt, claim, tx, done).await,
            Err(error) => {
                let _ = tx.rollback().await;
                self.conclude_failed(attempt, claim, error).await
            }
        }
    }

    /// Commits the effect with the operation's ending and its handed-on work, then answers.
    async fn commit_effect(&self, attempt: &Attempt<'_>, claim: &Claim<'_>, mut tx: Tx, done: Effect) -> Concluded {
        let operation_id = claim.identity().operation_id;
        let completion = done.completion();
        let recorded = async {
            if !claim.end(&mut tx, &completion, attempt, self).await? {
                return Ok(false);
            }
            if let Some(work) = &done.handoff {
                work.write(&mut tx, claim.identity(), completion.now).await?;
            }
            if completion.state == OperationState::Completed {
                let at = completion.now;
                claim.journal(&mut tx, AuditEvent::Completed, attempt, at, self).await?;
            }
            Ok::<_, sqlx::Error>(true)
        };
        match recorded.await {
            Ok(true) => {}
            Ok(false) => {
                // the key was taken (PostgreSQL waited for its holder's commit), or our lease was taken over
                let _ = tx.rollback().await;
                return Concluded::Lost;
            }
            Err(e) => {
                let _ = tx.rollback().await;
                return Concluded::Answer(self.give_back(attempt, claim, e.into()).await);
            }
        }
        if let Claim::InTransaction(_) = claim {
            // in this mode the claim takes hold only at the commit: that is where both points are
            fail_point("idempotency::after_claim").await;
        }
        fail_point("idempotency::before_commit").await;
        if let Err(e) = tx.commit().await {
            return Concluded::Answer(match claim {
                // the claim went with the commit: a retry finds out whether it happened
                Claim::InTransaction(_) => commit_failed(e),
                // the claim stays ours until given back; that frees nothing if the completion committed
                Claim::Leased { .. } => self.give_back(attempt, claim, e.into()).await,
            });
        }
        if done.handoff.is_some() {
            // the outbox's worker takes it now, not at its next poll
            self.work_handed_on.notify_one();
        }
        attempt.record_operation(operation_id);
        telemetry::record_outcome("created");
        self.remember(attempt, operation_id, completion.state, &done.response, completion.now);
        Concluded::Answer(stored_response(&done.response, operation_id, false))
    }

    /// Ends a run whose effect or call-out failed: a final business failure is stored; a server error frees the key.
    pub(super) async fn conclude_failed(&self, attempt: &Attempt<'_>, claim: &Claim<'_>, error: ApiError) -> Concluded {
        if error.is_final() {
            return self
                .store_final(attempt, claim, &error, OperationState::Failed, AuditEvent::Failed)
                .await;
        }
        if let Claim::InTransaction(_) = claim
            && let Some(response) = self.answer_if_taken(attempt).await
        {
            return Concluded::Answer(response);
        }
        Concluded::Answer(self.give_back(attempt, claim, error).await)
    }

    /// Stores `error` (a final business failure, a refusal) as the answer, in a transaction of its own.
    pub(super) async fn store_final(
        &self,
        attempt: &Attempt<'_>,
        claim: &Claim<'_>,
        error: &ApiError,
        state: OperationState,
        event: AuditEvent,
    ) -> Concluded {
        let operation_id = claim.identity().operation_id;
        let response = problem_response(error);
        let completion = Completion {
            state,
            ..Completion::failed(&response)
        };
        let stored = async {
            let mut tx = self.begin().await?;
            if !claim.end(&mut tx, &completion, attempt, self).await? {
                tx.rollback().await?;
                return Ok(false);
            }
            claim.journal(&mut tx, event, attempt, completion.now, self).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(true)
        };
        match stored.await {
            Ok(true) => {
                attempt.record_operation(operation_id);
                telemetry::record_outcome(state.into_str());
                self.remember(attempt, operation_id, state, &response, completion.now);
                Concluded::Answer(with_retry_after(stored_response(&response, operation_id, false), error))
            }
            Ok(false) => Concluded::Lost,
            Err(e) => Concluded::Answer(self.give_back(attempt, claim, e.into()).await),
        }
    }

    /// After a server error the key is free again: a leased claim is given back, journaled `released`.
    pub(super) async fn give_back(&self, attempt: &Attempt<'_>, claim: &Claim<'_>, error: ApiError) -> Response {
        let Claim::Leased { operation, token } = claim else {
            return self.server_error_unclaimed(attempt, error).await;
        };
        let operation_id = &operation.operation_id;
        let freed = async {
            let mut tx = self.begin().await?;
            if store::give_back(&mut tx, operation, token).await? {
                claim
                    .journal(&mut tx, AuditEvent::Released, attempt, Timestamp::now(), self)
                    .await?;
            }
            tx.commit().await
        };
        if let Err(e) = freed.await {
            tracing::error!(%operation_id, error = %e, "could not free the key after a server error; it frees when the lease ends");
        }
        telemetry::record_outcome("server_error");
        with_operation_headers(error.into_response(), operation_id, false)
    }

    /// Keeps a finished operation's answer for replays from memory while no outage is seen after
    /// `attempt` began; an unfinished one is not kept, as its answer may still change.
    pub(super) fn remember(
        &self,
        attempt: &Attempt<'_>,
        operation_id: &str,
        state: OperationState,
        answer: &StoredResponse,
        finished: Timestamp,
    ) {
        self.replay_cache.put(
            &attempt.principal.account_id,
            attempt.headers.key.as_str(),
            operation_id,
            &attempt.fingerprint,
            state,
            answer,
            finished,
            attempt.outages_seen,
        );
    }
}

//! [`ClaimMode::InTransaction`](crate::ClaimMode): the effect runs, then the
//! claim is inserted with its answer in the same transaction, so the claim, the
//! effect and the stored answer commit together or not at all (docs/design.md §2).

use axum::response::Response;
use platform::{ApiError, Timestamp, Tx, telemetry};

use super::{
    Attempt, Effect, fail_point, nothing_to_call,
    responses::{commit_failed, problem_response, stored_response, with_retry_after},
    taken::Decision,
};
use crate::{
    Idempotency,
    fingerprint::Fingerprint,
    store::{self, Completion, NewOperation},
};

impl Idempotency {
    /// [`ClaimMode::InTransaction`]: the attempt runs its effect and then
    /// claims the key *with its answer* in the same transaction, so the claim,
    /// the effect and the stored answer become visible together or not at all.
    /// An attempt whose key turns out to be taken rolls its effect back and
    /// answers as a duplicate; no read is spent on the first attempt's path.
    pub(super) async fn execute_in_transaction<F>(
        &self,
        attempt: &Attempt<'_>,
        fingerprint: &Fingerprint,
        effect: F,
    ) -> Response
    where
        F: AsyncFnOnce(&mut Tx, &str) -> Result<Effect, ApiError> + Clone,
    {
        let (principal, key) = (attempt.principal, &attempt.headers.key);
        // The lease fields are not used: a claim that finishes in its own
        // transaction is never seen running.
        let new = attempt.new_operation(fingerprint, self.config.lease);
        let operation_id = new.operation_id.as_str();
        // A transaction never outlives the lease: a hung effect would hold its
        // locks (on SQLite, the one writer) for every other request.
        let attempt_in_transaction = async {
            let mut tx = match self.db.begin().await {
                Ok(tx) => tx,
                Err(e) => return self.server_error_unclaimed(attempt, fingerprint, e.into()),
            };
            // A duplicate that waited for the write lock while the first attempt
            // committed finds its answer here, and never starts the effect.
            if let Some(answer) = self.replay_cache.get(&principal.account_id, key.as_str()) {
                let _ = tx.rollback().await;
                return self.replay_cached(attempt, &answer, fingerprint);
            }
            // a clone: the effect runs again if this attempt ends up taking over a dead holder's lease
            match effect.clone()(&mut tx, operation_id).await {
                Ok(done) => {
                    let completion = done.completion();
                    match store::claim_finished(&mut tx, &new, &completion, attempt.started).await {
                        Ok(true) => {}
                        Ok(false) => {
                            // The key was taken (PostgreSQL waited for its holder to commit): ours is undone.
                            let _ = tx.rollback().await;
                            return self
                                .answer_taken_key(attempt, fingerprint, nothing_to_call, without_call_out!(effect))
                                .await;
                        }
                        Err(e) => {
                            let _ = tx.rollback().await;
                            return self.server_error_unclaimed(attempt, fingerprint, e.into());
                        }
                    }
                    if let Err(e) = self
                        .hand_to_outbox(&mut tx, new.event_of(), &done, completion.now)
                        .await
                    {
                        let _ = tx.rollback().await;
                        return self.server_error_unclaimed(attempt, fingerprint, e.into());
                    }
                    fail_point("idempotency::after_claim").await;
                    fail_point("idempotency::before_commit").await;
                    if let Err(e) = tx.commit().await {
                        return commit_failed(e);
                    }
                    self.wake_outbox(&done);
                    attempt.record_operation(operation_id, fingerprint);
                    telemetry::record_outcome("created");
                    self.remember(&principal.account_id, key, operation_id, fingerprint, &completion);
                    stored_response(&done.response, operation_id, false)
                }
                Err(error) if error.is_final() => {
                    let _ = tx.rollback().await;
                    let response = problem_response(&error);
                    let completion = Completion::failed(&response);
                    match self.claim_finished_alone(&new, &completion, attempt.started).await {
                        Ok(true) => {
                            attempt.record_operation(operation_id, fingerprint);
                            telemetry::record_outcome("failed");
                            self.remember(&principal.account_id, key, operation_id, fingerprint, &completion);
                            with_retry_after(stored_response(&response, operation_id, false), &error)
                        }
                        Ok(false) => {
                            self.answer_taken_key(attempt, fingerprint, nothing_to_call, without_call_out!(effect))
                                .await
                        }
                        Err(e) => self.server_error_unclaimed(attempt, fingerprint, e.into()),
                    }
                }
                Err(error) => {
                    let _ = tx.rollback().await;
                    // A duplicate's effect may fail because the first attempt's
                    // committed effect is in its way: if the key is taken, answer as
                    // a duplicate. Otherwise nothing was claimed, and a retry starts afresh.
                    if let Ok(Some(existing)) = self.find_and_count(&principal.account_id, key).await
                        && let Ok(Decision::Answer(response)) = self.decide(attempt, existing, fingerprint, false).await
                    {
                        return response;
                    }
                    self.server_error_unclaimed(attempt, fingerprint, error)
                }
            }
        };
        match tokio::time::timeout(self.config.lease, attempt_in_transaction).await {
            Ok(response) => response,
            Err(_) => self.server_error_unclaimed(
                attempt,
                fingerprint,
                ApiError::internal("the effect's transaction outlived the lease").with_detail(
                    "the operation took too long and was rolled back; nothing was committed. Retry with the same key",
                ),
            ),
        }
    }

    /// Claims a key with a finished answer and journals it, in a transaction
    /// of its own: a first attempt whose effect failed (and was rolled back)
    /// with a final business failure.
    pub(super) async fn claim_finished_alone(
        &self,
        new: &NewOperation<'_>,
        completion: &Completion<'_>,
        attempted_at: Timestamp,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.db.begin().await?;
        if !store::claim_finished(&mut tx, new, completion, attempted_at).await? {
            tx.rollback().await?;
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }
}

//! The in-transaction claim mode ([`crate::ClaimMode::InTransaction`]): the effect runs, then the
//! claim is inserted with its answer in the same transaction (docs/design.md §2).

use axum::response::Response;
use platform::{ApiError, Tx};

use super::{
    Attempt, Effect,
    conclude::{Claim, Concluded},
    nothing_to_call,
};
use crate::{layer::Idempotency, operation::OperationIdentity};

impl Idempotency {
    /// The claim, the effect and the stored answer become visible together or not at all.
    pub(super) async fn execute_in_transaction<F>(&self, attempt: &Attempt<'_>, effect: F) -> Response
    where
        F: AsyncFnOnce(&mut Tx, &OperationIdentity<'_>) -> Result<Effect, ApiError> + Clone,
    {
        // the lease fields go unused: a claim that finishes in its own transaction is never seen running
        let new = attempt.new_operation(self.config.lease);
        let claim = Claim::InTransaction(&new);
        // outside the lease's bound: the wait for a connection has its own, and a 503 here claimed nothing
        let mut tx = match self.begin().await {
            Ok(tx) => tx,
            Err(e) => return self.give_back(attempt, &claim, e.into()).await,
        };
        // no transaction outlives the lease: a hung effect would hold its locks (on SQLite, the one writer)
        let attempt_in_transaction = async {
            // a duplicate that waited for the writer while the first attempt committed is answered here
            if let Some(answer) = self.replay_cache.get(new.account_id, new.key.as_str()) {
                let _ = tx.rollback().await;
                return self.replay_cached(attempt, &answer).await;
            }
            // a clone: the effect runs again if this attempt ends up taking over a dead holder's lease
            let ran = effect.clone()(&mut tx, &new.identity()).await;
            match self.conclude(attempt, &claim, tx, ran).await {
                Concluded::Answer(response) => response,
                // boxed, as it may run the effect under a lease: unboxed, every create's future would be that large
                Concluded::Lost => {
                    Box::pin(self.answer_taken_key(attempt, nothing_to_call, without_call_out!(effect))).await
                }
            }
        };
        // boxed: the attempt's future is as large as every query it may make, and is moved otherwise
        match tokio::time::timeout(self.config.lease, Box::pin(attempt_in_transaction)).await {
            Ok(response) => response,
            Err(_) => {
                self.server_error_unclaimed(
                    attempt,
                    ApiError::internal("the effect's transaction outlived the lease").with_detail(
                        "the operation took too long and was rolled back; nothing was committed. Retry with the same key",
                    ),
                )
                .await
            }
        }
    }
}

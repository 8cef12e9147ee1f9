//! Running an operation this attempt holds under a lease (its own claim, a dead holder's, an
//! approved operation's): the call-out, the gate's last word, the effect (docs/design.md §3, §7).

use axum::response::Response;
use platform::{ApiError, Timestamp, Tx};

use super::{
    Attempt, Effect,
    conclude::{Claim, Concluded},
};
use crate::{
    gate::Refusal,
    layer::Idempotency,
    operation::{OperationIdentity, OperationRecord, OperationState},
};

impl Idempotency {
    /// Runs an operation this attempt holds the lease of: its call-out outside any transaction, then the
    /// effect; one that waited at the gate runs only if the gate, asked in the effect's transaction, lets it.
    pub(super) async fn run<T, W, F>(
        &self,
        attempt: &Attempt<'_>,
        operation: OperationRecord,
        call_out: W,
        effect: F,
    ) -> Response
    where
        W: AsyncFnOnce(&OperationIdentity<'_>) -> Result<T, ApiError>,
        F: AsyncFnOnce(&mut Tx, &OperationIdentity<'_>, T) -> Result<Effect, ApiError>,
    {
        let token = operation.lease_token.clone().unwrap_or_default();
        let claim = Claim::Leased {
            operation: &operation,
            token: &token,
        };
        let (claim, operation) = (&claim, &operation);
        let concluded = async {
            let identity = operation.identity();
            // the claim has committed: only now may the operation reach another system
            let said = match call_out(&identity).await {
                Ok(said) => said,
                Err(error) => return self.conclude_failed(attempt, claim, error).await,
            };
            let mut tx = match self.begin().await {
                Ok(tx) => tx,
                Err(e) => return Concluded::Answer(self.give_back(attempt, claim, e.into()).await),
            };
            if operation.approval_id.is_some() {
                // the gate again, in the effect's transaction: a decision may have changed since
                let asked = attempt.approval.as_deref();
                let checked = async { self.gate()?.check(&mut tx, operation, asked, Timestamp::now()).await };
                match checked.await {
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
            let ran = effect(&mut tx, &identity, said).await;
            // a promise the effect found broken in its own transaction refuses the operation as the gate's check would
            if let (Err(error), Some(_)) = (&ran, &operation.approval_id)
                && let Some(refusal) = self.gate().ok().and_then(|gate| gate.refusal(error, operation))
            {
                let _ = tx.rollback().await;
                return self.refuse(attempt, claim, &refusal).await;
            }
            self.conclude(attempt, claim, tx, ran).await
        };
        match concluded.await {
            Concluded::Answer(response) => response,
            // our lease ran out and another attempt took over: its run is the one that counts
            Concluded::Lost => self.answer_current(attempt, operation).await,
        }
    }

    /// Ends an operation its gate does not let run: `rejected`, the refusal its answer for good.
    async fn refuse(&self, attempt: &Attempt<'_>, claim: &Claim<'_>, refusal: &Refusal) -> Concluded {
        self.store_final(attempt, claim, &refusal.answer, OperationState::Rejected, refusal.event)
            .await
    }
}

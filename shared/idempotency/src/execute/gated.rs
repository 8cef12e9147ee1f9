//! A route whose policy wants a person: the first attempt claims the key as `awaiting_approval`,
//! with what the gate writes and answers, in one transaction (docs/design.md §7).

use axum::response::Response;
use platform::{ApiError, Tx, telemetry};

use super::{Attempt, Effect, nothing_to_call};
use crate::responses::stored_response;
use crate::{
    gate::{Request, Waiting},
    layer::Idempotency,
    operation::OperationIdentity,
    store,
    transitions::AuditEvent,
};

impl Idempotency {
    /// Claims the key as `awaiting_approval` for `asked`; a retry is answered by [`Self::resolve`].
    pub(super) async fn request_approval<F>(&self, attempt: &Attempt<'_>, asked: &dyn Request, effect: F) -> Response
    where
        F: AsyncFnOnce(&mut Tx, &OperationIdentity<'_>) -> Result<Effect, ApiError> + Clone,
    {
        let new = attempt.new_operation(self.config.lease);
        let journaled = [
            new.audit(AuditEvent::Attempted, attempt.started),
            new.audit(AuditEvent::Claimed, new.now),
            new.audit(AuditEvent::ApprovalRequested, new.now),
        ];
        let claimed = async {
            let gate = self.gate()?;
            let waiting = Waiting {
                operation: new.identity(),
                requested_by: &attempt.principal.principal_id,
                now: new.now,
                until: new.now.plus(self.config.approval_ttl),
            };
            let requested = gate.request(&waiting, asked)?;
            let mut tx = self.begin().await?;
            if !store::claim_awaiting_approval(&mut tx, &new, &requested.answer, &requested.id).await? {
                tx.rollback().await?;
                return Ok(None);
            }
            gate.write(&mut tx, &waiting, asked, &requested).await?;
            self.transitions.record(&mut tx, &journaled).await?;
            tx.commit().await?;
            Ok::<_, ApiError>(Some(requested.answer))
        };
        match claimed.await {
            Ok(Some(answer)) => {
                attempt.record_operation(&new.operation_id);
                telemetry::record_outcome("awaiting_approval");
                stored_response(&answer, &new.operation_id, false)
            }
            Ok(None) => {
                self.answer_taken_key(attempt, nothing_to_call, without_call_out!(effect))
                    .await
            }
            Err(error) => self.server_error_unclaimed(attempt, error).await,
        }
    }
}

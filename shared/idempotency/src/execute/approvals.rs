//! A route whose policy wants a human: the first attempt claims the key as
//! `awaiting_approval`, with its approval and its 202 (docs/contract.md §6;
//! docs/design.md §7).

use axum::{http::StatusCode, response::Response};
use platform::{ApiError, Tx, telemetry};

use super::{Attempt, Effect, effect::json_response, nothing_to_call};
use crate::responses::stored_response;
use crate::{
    approval::{self, ApprovalRecord, ApprovalRequested, ApprovalSummary, new_approval_id},
    fingerprint::Fingerprint,
    layer::Idempotency,
    operation::{OperationState, status_url},
    store,
    transitions::AuditEvent,
};

impl Idempotency {
    /// A route whose policy wants a human: the attempt claims the key as
    /// `awaiting_approval`, with the approval record and its 202 answer, in
    /// one transaction. A retry finds the operation and is answered by
    /// [`Self::resolve`]: the same 202 while it waits, the run once approved.
    pub(super) async fn request_approval<F>(
        &self,
        attempt: &Attempt<'_>,
        fingerprint: &Fingerprint,
        summary: &ApprovalSummary,
        effect: F,
    ) -> Response
    where
        F: AsyncFnOnce(&mut Tx, &str) -> Result<Effect, ApiError> + Clone,
    {
        let new = attempt.new_operation(fingerprint, self.config.lease);
        let approval = ApprovalRecord {
            seq: 0,
            approval_id: new_approval_id(),
            account_id: attempt.principal.account_id.clone(),
            operation_id: new.operation_id.clone(),
            idempotency_key: attempt.headers.key.as_str().to_owned(),
            route: attempt.route.to_owned(),
            fingerprint: fingerprint.clone(),
            summary: summary.clone(),
            requested_by: attempt.principal.principal_id.clone(),
            created_at: new.now,
            expires_at: new.now.plus(self.config.approval_ttl),
            decision: None,
            decided_by: None,
            decided_at: None,
        };
        let mut answer = json_response(
            StatusCode::ACCEPTED,
            &ApprovalRequested {
                approval_id: approval.approval_id.clone(),
                operation_id: new.operation_id.clone(),
                idempotency_key: approval.idempotency_key.clone(),
                fingerprint: fingerprint.as_str().to_owned(),
                state: OperationState::AwaitingApproval,
                summary: summary.clone(),
                expires_at: approval.expires_at,
                status_url: status_url(&new.operation_id),
                approval_url: approval.url(),
            },
        );
        answer.location = Some(status_url(&new.operation_id));
        let journaled = [
            new.audit(AuditEvent::Attempted, attempt.started),
            new.audit(AuditEvent::Claimed, new.now),
            new.audit(AuditEvent::ApprovalRequested, new.now),
        ];
        let claimed = async {
            let mut tx = self.begin().await?;
            if !store::claim_awaiting_approval(&mut tx, &new, &answer, &approval.approval_id).await? {
                tx.rollback().await?;
                return Ok(false);
            }
            approval::insert(&mut tx, &approval).await?;
            self.transitions.record(&mut tx, &journaled).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(true)
        };
        match claimed.await {
            Ok(true) => {
                attempt.record_operation(&new.operation_id, fingerprint);
                telemetry::record_outcome("awaiting_approval");
                stored_response(&answer, &new.operation_id, false)
            }
            Ok(false) => {
                self.answer_taken_key(attempt, fingerprint, nothing_to_call, without_call_out!(effect))
                    .await
            }
            Err(e) => self.server_error_unclaimed(attempt, fingerprint, e.into()).await,
        }
    }
}

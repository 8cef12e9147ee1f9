//! Approvals as the core's gate: the approval written beside the claim that
//! makes an operation wait, the state the verdict reads, the check in the
//! effect's transaction, and the end of one that ran out
//! (docs/contract.md §6; docs/design.md §7).

use axum::http::StatusCode;
use idempotency::{
    BoxFuture, Fingerprint, OperationRecord, OperationState, StoredResponse,
    gate::{self, ApprovalState, Gate, Refusal, Request, Requested, Waiting},
    operation::status_url,
    transitions::{AuditEvent, Record},
};
use platform::{ApiError, Db, Timestamp, Tx};

use crate::{
    ApprovalRecord, ApprovalRequested, ApprovalSummary, Approvals, approval_url, decide, new_approval_id, refusal,
    store::{self, ExecutionCheck},
    view::{is_stale, refused_operation},
};

impl Gate for Approvals {
    fn request(&self, waiting: &Waiting<'_>, asked: &dyn Request) -> Result<Requested, ApiError> {
        let summary = summary_of(asked)?;
        let of = waiting.operation;
        let approval_id = new_approval_id();
        let body = ApprovalRequested {
            approval_url: approval_url(&approval_id),
            approval_id,
            operation_id: of.operation_id.to_owned(),
            idempotency_key: of.idempotency_key.to_owned(),
            fingerprint: of.fingerprint.to_owned(),
            state: OperationState::AwaitingApproval,
            summary: summary.clone(),
            expires_at: waiting.until,
            status_url: status_url(of.operation_id),
        };
        let answer = StoredResponse {
            status: StatusCode::ACCEPTED,
            content_type: "application/json".into(),
            location: Some(status_url(of.operation_id)),
            body: serde_json::to_vec(&body).map_err(|e| ApiError::internal(e.to_string()))?,
        };
        Ok(Requested {
            id: body.approval_id,
            answer,
        })
    }

    fn write<'a>(
        &'a self,
        tx: &'a mut Tx,
        waiting: &'a Waiting<'a>,
        asked: &'a dyn Request,
        requested: &'a Requested,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let of = waiting.operation;
            let approval = ApprovalRecord {
                seq: 0,
                approval_id: requested.id.clone(),
                account_id: of.account_id.to_owned(),
                operation_id: of.operation_id.to_owned(),
                idempotency_key: of.idempotency_key.to_owned(),
                route: of.route.to_owned(),
                fingerprint: Fingerprint::from_stored(of.fingerprint.to_owned()),
                summary: summary_of(asked)?.clone(),
                requested_by: waiting.requested_by.to_owned(),
                created_at: waiting.now,
                expires_at: waiting.until,
                decision: None,
                decided_by: None,
                decided_at: None,
            };
            Ok(store::insert(tx, &approval).await?)
        })
    }

    fn state<'a>(
        &'a self,
        db: &'a Db,
        operation: &'a OperationRecord,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<ApprovalState, ApiError>> {
        Box::pin(async move {
            let approval = approval_of(db, operation).await?;
            Ok(approval.state(now))
        })
    }

    fn check<'a>(
        &'a self,
        tx: &'a mut Tx,
        operation: &'a OperationRecord,
        asked: Option<&'a dyn Request>,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Refusal>, ApiError>> {
        Box::pin(async move {
            let approval_id = operation.approval_id.as_deref().unwrap_or_default();
            let summary = asked.map(summary_of).transpose()?;
            let operation_id = operation.operation_id.as_str();
            let check = store::check_for_execution(
                tx,
                &operation.account_id,
                approval_id,
                operation_id,
                &operation.fingerprint,
                summary,
                now,
            )
            .await?;
            Ok(match check {
                ExecutionCheck::Allowed => None,
                ExecutionCheck::Refused => Some(Refusal {
                    answer: refusal(ApprovalState::Rejected, operation_id, approval_id),
                    event: AuditEvent::Rejected,
                }),
                ExecutionCheck::Expired => Some(Refusal {
                    answer: refusal(ApprovalState::Expired, operation_id, approval_id),
                    event: AuditEvent::Expired,
                }),
                ExecutionCheck::Stale(what) => Some(Refusal {
                    answer: refused_operation(crate::stale(what), operation_id, approval_id),
                    event: AuditEvent::Stale,
                }),
            })
        })
    }

    fn refusal(&self, error: &ApiError, operation: &OperationRecord) -> Option<Refusal> {
        let approval_id = operation.approval_id.as_deref()?;
        is_stale(error).then(|| Refusal {
            answer: refused_operation(error.clone(), &operation.operation_id, approval_id),
            event: AuditEvent::Stale,
        })
    }

    fn expire<'a>(
        &'a self,
        tx: &'a mut Tx,
        operation: &'a OperationRecord,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, ApiError>> {
        Box::pin(async move {
            let missing = || ApiError::internal("an operation awaiting approval has no approval");
            let approval_id = operation.approval_id.as_deref().ok_or_else(missing)?;
            let approval = store::find_in(tx, &operation.account_id, approval_id)
                .await?
                .ok_or_else(missing)?;
            Ok(decide::end_expired(tx, &approval, now).await?)
        })
    }
}

/// The summary a route's policy gave, which is all approvals are asked with.
fn summary_of(asked: &dyn Request) -> Result<&ApprovalSummary, ApiError> {
    gate::read::<ApprovalSummary>(asked).ok_or_else(|| {
        ApiError::internal("the route asked for an approval with something other than an `ApprovalSummary`")
    })
}

/// The approval of an operation that waits for one.
async fn approval_of(db: &Db, operation: &OperationRecord) -> Result<ApprovalRecord, ApiError> {
    let missing = || ApiError::internal("an operation awaiting approval has no approval");
    let approval_id = operation.approval_id.as_deref().ok_or_else(missing)?;
    store::find(db, &operation.account_id, approval_id)
        .await?
        .ok_or_else(missing)
}

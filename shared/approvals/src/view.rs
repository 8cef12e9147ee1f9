//! What an approval answers: the 202 approval request stored for the
//! operation and replayed to its retries, the approval as approvers see it,
//! and the refusal an operation keeps once its approval is rejected or
//! expires, or what it promised no longer holds.

use axum::http::StatusCode;
use platform::{ApiError, Timestamp};
use serde::Serialize;

use idempotency::{OperationState, gate::ApprovalState, operation::status_url};

use crate::{ApprovalRecord, ApprovalSummary};

/// The 202 answer of an operation that waits for a human: stored, and
/// replayed unchanged to every matching retry while it waits.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApprovalRequested {
    pub approval_id: String,
    pub operation_id: String,
    pub idempotency_key: String,
    /// The fingerprint an approver must echo with the decision.
    pub fingerprint: String,
    /// `awaiting_approval`
    pub state: OperationState,
    pub summary: ApprovalSummary,
    pub expires_at: Timestamp,
    /// The operation: poll it to learn the decision, then retry with the same key and body.
    pub status_url: String,
    pub approval_url: String,
}

/// The 202 of an operation that the policy may give to a human: the accepted
/// resource, or the approval request. It names the two shapes for the OpenAPI
/// document; handlers build either one directly.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum AcceptedOrAwaitingApproval<T: utoipa::ToSchema> {
    Accepted(T),
    AwaitingApproval(Box<ApprovalRequested>),
}

/// An approval as approvers (and the operation status) see it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApprovalView {
    #[schema(example = "apr_0193a1b2c3d4e5f60718293a4b5c6d7e")]
    pub id: String,
    pub approval_id: String,
    pub operation_id: String,
    pub idempotency_key: String,
    pub route: String,
    pub fingerprint: String,
    pub summary: ApprovalSummary,
    pub requested_by: String,
    pub state: ApprovalState,
    pub expires_at: Timestamp,
    pub decided_by: Option<String>,
    pub decided_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub url: String,
    pub status_url: String,
}

impl ApprovalView {
    pub fn of(record: ApprovalRecord, now: Timestamp) -> Self {
        ApprovalView {
            id: record.approval_id.clone(),
            state: record.state(now),
            url: record.url(),
            status_url: status_url(&record.operation_id),
            updated_at: record.decided_at.unwrap_or(record.created_at),
            approval_id: record.approval_id,
            operation_id: record.operation_id,
            idempotency_key: record.idempotency_key,
            route: record.route,
            fingerprint: record.fingerprint.as_str().to_owned(),
            summary: record.summary,
            requested_by: record.requested_by,
            expires_at: record.expires_at,
            decided_by: record.decided_by,
            decided_at: record.decided_at,
            created_at: record.created_at,
        }
    }
}

/// The code of the refusal of an approved run whose summary no longer holds.
const STALE: &str = "approval_stale";

/// What the approver was promised no longer holds (docs/contract.md §6):
/// `what` says what changed. An effect answers this from its own transaction
/// when it finds a promise broken there (the release a deployment replaces);
/// the executor then stores it, as the refusal of an approval, as the
/// operation's answer, `rejected`.
pub fn stale(what: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        STALE,
        "Approval stale",
        format!(
            "{what}: what the approver was promised no longer holds, so this operation will never run. A new intention needs a new key and a new approval"
        ),
    )
}

/// Whether an effect found what its approval promised broken.
pub(crate) fn is_stale(error: &ApiError) -> bool {
    error.code() == STALE
}

/// The answer stored for an operation whose approval was refused or ran out.
pub fn refusal(state: ApprovalState, operation_id: &str, approval_id: &str) -> ApiError {
    let error = match state {
        ApprovalState::Rejected => ApiError::new(
            StatusCode::CONFLICT,
            "approval_rejected",
            "Approval rejected",
            "a human rejected this operation; it will never run. A new intention needs a new key",
        ),
        _ => ApiError::new(
            StatusCode::CONFLICT,
            "approval_expired",
            "Approval expired",
            "this operation was not approved and run before its approval expired; it will never run. A new attempt needs a new key",
        ),
    };
    refused_operation(error, operation_id, approval_id)
}

/// Why an operation bound to an approval will never run (a rejection, an
/// expiry, a broken promise), as the answer stored for it: naming the
/// operation, its approval, and its state, `rejected`.
pub(crate) fn refused_operation(why: ApiError, operation_id: &str, approval_id: &str) -> ApiError {
    why.with("operation_id", operation_id)
        .with("approval_id", approval_id)
        .with("state", OperationState::Rejected)
        .with("status_url", status_url(operation_id))
}

//! The routes every service mounts from this crate: the operation status
//! resource (docs/contract.md §4) — the answer for an agent that timed out and
//! does not know what happened —, and approvals and their decisions (§6).
//! What an admin does about an operation the outbox cannot settle (§5) is the
//! `outbox` crate's, and the audit journal's routes (§8) are the `journal` crate's.
//!
//! Each resource has its file: `operations`, `approvals`. This one
//! holds what they share: the router a service merges, the rule of who may
//! read approvals and the journal, and the OpenAPI document of them all.

mod approvals;
mod operations;

use axum::{
    Router,
    extract::FromRef,
    routing::{get, post},
};
use platform::{ApiError, Authenticator, Principal, Role};

use crate::{
    approval::{ApprovalRequested, ApprovalState, ApprovalSummary, ApprovalView, Decision},
    layer::Idempotency,
    operation::OperationState,
    operation::ResourceRef,
};

pub use crate::status::{NeedsAPerson, OperationApproval, OperationView};
pub use approvals::{ApprovalList, ApprovalQuery, DECISION_ROUTE, DecisionBody, decide, get_approval, list_approvals};
pub use operations::{OperationList, OperationQuery, find_operation_by_key, get_operation};

/// The operation status and approvals.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Idempotency: FromRef<S>,
    Authenticator: FromRef<S>,
{
    Router::new()
        .route("/v1/operations", get(find_operation_by_key))
        .route("/v1/operations/{operation_id}", get(get_operation))
        .route("/v1/approvals", get(list_approvals))
        .route("/v1/approvals/{approval_id}", get(get_approval))
        .route(DECISION_ROUTE, post(decide))
        .route("/metrics", get(metrics))
}

/// `GET /metrics`: the service's registry in Prometheus's text format, its
/// gauges read from the database first unless they are fresh. No key: it
/// names no account, key or fingerprint. Gauges that could not be read in
/// time keep their last values, and the rest is served all the same.
async fn metrics(axum::extract::State(idempotency): axum::extract::State<Idempotency>) -> axum::response::Response {
    if let Err(e) = crate::gauges::refresh_if_stale(&idempotency).await {
        tracing::warn!(error = %e, "metrics: could not read the gauges from the database");
    }
    platform::metrics::exposition(idempotency.metrics().render())
}

/// Approvals are for the humans who decide (`approver`) and for `admin`;
/// an agent learns its own operation's approval from the operation status.
pub fn may_read_approvals(principal: &Principal) -> Result<(), ApiError> {
    match principal.role {
        Role::Approver | Role::Admin => Ok(()),
        Role::Agent => Err(ApiError::forbidden(
            "approvals and the audit journal are for approvers and admins; an agent reads its operation's approval from its status_url",
        )),
    }
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(
        operations::get_operation,
        operations::find_operation_by_key,
        approvals::list_approvals,
        approvals::get_approval,
        approvals::decide
    ),
    components(schemas(
        OperationView,
        OperationList,
        OperationState,
        OperationApproval,
        operations::UnknownState,
        operations::DeadEvent,
        crate::status::EventState,
        ResourceRef,
        ApprovalView,
        ApprovalList,
        ApprovalState,
        ApprovalSummary,
        ApprovalRequested,
        DecisionBody,
        Decision
    ))
)]
pub struct OperationsApi;

//! Approvals and their decisions (docs/contract.md §6): the list and one
//! approval, for approvers and admins, and the decision, which a key makes an
//! operation like any other; the router a service merges, and their OpenAPI
//! document.

use axum::{
    Json, Router,
    extract::{FromRef, State},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use idempotency::{Idempotency, OptionalIdempotencyHeaders, gate::ApprovalState};
use platform::{
    ApiError, ApiJson, ApiPath, ApiQuery, Authenticator, Principal, Timestamp,
    page::{Page, PageRequest},
};
use serde::{Deserialize, Serialize};

use crate::{ApprovalRequested, ApprovalSummary, ApprovalView, Decision, store};

/// The list, one approval, and the decision.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Idempotency: FromRef<S>,
    Authenticator: FromRef<S>,
{
    Router::new()
        .route("/v1/approvals", get(list_approvals))
        .route("/v1/approvals/{approval_id}", get(get_approval))
        .route(DECISION_ROUTE, post(decide))
}

/// The approvals routes and what they answer, merged into a service's
/// OpenAPI document after the core's.
#[derive(utoipa::OpenApi)]
#[openapi(
    paths(list_approvals, get_approval, decide),
    components(schemas(
        ApprovalView,
        ApprovalList,
        ApprovalState,
        ApprovalSummary,
        ApprovalRequested,
        DecisionBody,
        Decision
    ))
)]
pub struct ApprovalsApi;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ApprovalQuery {
    /// `pending`, `approved`, `rejected` or `expired`; all when absent.
    pub state: Option<ApprovalState>,
    /// 1–200, default 50.
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// The account's approvals in creation order, and how many there are:
/// `?state=pending` is what waits for a human.
#[utoipa::path(
    get,
    path = "/v1/approvals",
    tag = "approvals",
    params(ApprovalQuery),
    responses(
        (status = 200, description = "`{data, next_cursor}` of approvals", body = ApprovalList),
        (status = 403, description = "Not an approver or admin", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_approvals(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    ApiQuery(query): ApiQuery<ApprovalQuery>,
) -> Result<Json<ApprovalList>, ApiError> {
    principal.may_read_approvals()?;
    let page = PageRequest::parse(query.limit, query.cursor.as_deref())?;
    let now = Timestamp::now();
    let rows = store::list(
        idempotency.db(),
        &principal.account_id,
        query.state,
        now,
        page.after_seq,
        page.fetch_limit(),
    )
    .await?;
    let total = store::count(idempotency.db(), &principal.account_id, query.state, now).await?;
    let page = Page::from_rows(
        rows.into_iter().map(|a| (a.seq, ApprovalView::of(a, now))).collect(),
        page,
    );
    Ok(Json(ApprovalList {
        data: page.data,
        next_cursor: page.next_cursor,
        total,
    }))
}

/// `{data, next_cursor, total}` of approvals.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApprovalList {
    pub data: Vec<ApprovalView>,
    pub next_cursor: Option<String>,
    /// How many of the account's approvals are in the `state` asked for, on every page: what a human has to get through.
    pub total: i64,
}

#[utoipa::path(
    get,
    path = "/v1/approvals/{approval_id}",
    tag = "approvals",
    params(("approval_id" = String, Path)),
    responses(
        (status = 200, body = ApprovalView),
        (status = 403, body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_approval(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    ApiPath(approval_id): ApiPath<String>,
) -> Result<Json<ApprovalView>, ApiError> {
    principal.may_read_approvals()?;
    store::find(idempotency.db(), &principal.account_id, &approval_id)
        .await?
        .map(|a| Json(ApprovalView::of(a, Timestamp::now())))
        .ok_or_else(|| ApiError::not_found(format!("approval `{approval_id}`")))
}

/// An approver's decision, bound to the fingerprint they were shown.
#[derive(Debug, Deserialize, validator::Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    pub decision: Decision,
    /// The operation's fingerprint, as the approver saw it.
    pub fingerprint: String,
}

/// The route of a decision, as the operation of a decision sent with a key names it.
pub const DECISION_ROUTE: &str = "/v1/approvals/{approval_id}/decision";

/// What a decision sent with a key is an operation of: this decision on this
/// approval, about the fingerprint the approver saw.
#[derive(Debug, Serialize)]
struct DecideApproval<'a> {
    approval_id: &'a str,
    decision: Decision,
    fingerprint: &'a str,
}

/// Approve or reject one waiting operation. Role `approver`, same account,
/// never the principal that requested it; `fingerprint` must be the operation's.
///
/// Repeating it needs no key: the approver who decided gets the decision
/// again, any other decision is 409 `invalid_state`. With a key it is an
/// operation like any other: its answer is stored and replayed to a retry
/// with that key, and the key sent with another decision is 422.
#[utoipa::path(
    post,
    path = "/v1/approvals/{approval_id}/decision",
    tag = "approvals",
    params(
        ("approval_id" = String, Path),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: honoured when sent"),
    ),
    request_body = DecisionBody,
    responses(
        (status = 200, description = "Decided. An approved operation runs on the agent's next retry with the same key", body = ApprovalView),
        (status = 400, description = "`idempotency_key_invalid`", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an approver, or the requester", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such approval in this account", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`approval_fingerprint_mismatch`, `approval_expired`, `invalid_state` (already decided otherwise), or `request_in_progress` (with a key)", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 422, description = "`idempotency_key_reused`: the key was sent with another decision", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn decide(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    OptionalIdempotencyHeaders(key): OptionalIdempotencyHeaders,
    ApiPath(approval_id): ApiPath<String>,
    ApiJson(body): ApiJson<DecisionBody>,
) -> Response {
    if let Err(refused) = crate::may_decide(&principal) {
        return refused.into_response();
    }
    let command = DecideApproval {
        approval_id: &approval_id,
        decision: body.decision,
        fingerprint: &body.fingerprint,
    };
    // repeating it is safe: the same approver gets the same decision
    idempotency
        .execute_with_optional_key(DECISION_ROUTE, &principal, key, &command, async || {
            crate::decide(&idempotency, &principal, &approval_id, body.decision, &body.fingerprint).await
        })
        .await
}

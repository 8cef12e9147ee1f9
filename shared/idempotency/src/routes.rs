//! The routes every service mounts from this crate: the operation status
//! resource (docs/contract.md §4) — the answer for an agent that timed out and
//! does not know what happened —, approvals and their decisions (§6), and the
//! audit journal (§8).

use axum::{
    Json, Router,
    extract::{FromRef, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use platform::{
    ApiError, ApiJson, ApiPath, ApiQuery, Authenticator, Principal, Role, Timestamp,
    page::{Page, PageRequest},
};
use serde::{Deserialize, Serialize};

use crate::{
    Attempt, Effect, Idempotency, IdempotencyKey, OperationRecord, OperationState, OptionalIdempotencyHeaders,
    ResourceRef,
    approval::{self, ApprovalRequested, ApprovalState, ApprovalSummary, ApprovalView, Decision},
    audit::{self, AuditEntry, AuditEvent, AuditFilter, Head},
    store,
};

/// An operation as its caller may see it: never the stored request or answer body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OperationView {
    #[schema(example = "op_0193a1b2c3d4e5f60718293a4b5c6d7e")]
    pub operation_id: String,
    pub idempotency_key: String,
    #[schema(example = "POST")]
    pub method: String,
    #[schema(example = "/v1/tickets")]
    pub route: String,
    /// hex SHA-256 of the canonical validated command (docs/contract.md §2)
    pub fingerprint: String,
    pub state: OperationState,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// How many requests carried the key.
    pub attempts: i32,
    /// What the operation made or acted on, once known.
    pub resource: Option<ResourceRef>,
    /// The status of the stored answer every retry gets: once finished, or
    /// once work that goes on after the answer (an outbox delivery) was
    /// handed its 202, while that work runs and whatever its outcome.
    pub response_status: Option<u16>,
    /// The approval that applies, if any: its id, state, expiry and decision.
    pub approval: Option<OperationApproval>,
    /// The external system's reference, when one was involved.
    pub external_ref: Option<String>,
}

impl From<OperationRecord> for OperationView {
    fn from(op: OperationRecord) -> Self {
        // the answer is stored for good once the operation is finished, or once its work
        // went on after it: an operation in progress that no attempt holds (an outbox
        // delivers its work), or whose outcome is unknown
        let answered = op.state.is_finished()
            || op.state == OperationState::Unknown
            || (op.state == OperationState::InProgress && op.lease_token.is_none());
        OperationView {
            operation_id: op.operation_id,
            idempotency_key: op.key.as_str().to_owned(),
            method: op.method,
            route: op.route,
            fingerprint: op.fingerprint.as_str().to_owned(),
            state: op.state,
            created_at: op.created_at,
            updated_at: op.updated_at,
            attempts: op.attempts,
            resource: op.resource,
            response_status: op.response.filter(|_| answered).map(|r| r.status.as_u16()),
            approval: None,
            external_ref: op.external_ref,
        }
    }
}

/// What an operation's caller may know of its approval (never who else is waiting).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OperationApproval {
    pub approval_id: String,
    pub state: ApprovalState,
    pub expires_at: Timestamp,
    pub decided_by: Option<String>,
    pub decided_at: Option<Timestamp>,
}

impl OperationView {
    /// The view of `operation`, with its approval read if it has one.
    async fn read(idempotency: &Idempotency, operation: OperationRecord) -> Result<Self, ApiError> {
        let approval = match &operation.approval_id {
            Some(id) => approval::find(&idempotency.db, &operation.account_id, id).await?,
            None => None,
        };
        let mut view = OperationView::from(operation);
        view.approval = approval.map(|a| OperationApproval {
            state: a.state(Timestamp::now()),
            approval_id: a.approval_id,
            expires_at: a.expires_at,
            decided_by: a.decided_by,
            decided_at: a.decided_at,
        });
        Ok(view)
    }
}

/// `{data, next_cursor}` (docs/contract.md §10).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OperationList {
    pub data: Vec<OperationView>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OperationQuery {
    /// The key as the `Idempotency-Key` header carried it — a bare token or
    /// an RFC 8941 sf-string (`"k"`), read the same way — percent-encoded
    /// (`%22k%22` for `"k"`; `%20`, `%25`, `%26`, `%2B`, `%23` wherever those
    /// characters occur). An invalid key is 400 `idempotency_key_invalid`. Required.
    pub idempotency_key: String,
    /// 1–200, default 50 (a key names at most one operation).
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// `GET /v1/operations/{operation_id}` and `GET /v1/operations?idempotency_key=`.
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
        .route("/v1/audit", get(read_audit))
        .route("/v1/audit/head", get(read_audit_head))
}

/// Approvals are for the humans who decide (`approver`) and for `admin`;
/// an agent learns its own operation's approval from the operation status.
fn may_read_approvals(principal: &Principal) -> Result<(), ApiError> {
    match principal.role {
        Role::Approver | Role::Admin => Ok(()),
        Role::Agent => Err(ApiError::forbidden(
            "approvals and the audit journal are for approvers and admins; an agent reads its operation's approval from its status_url",
        )),
    }
}

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
    may_read_approvals(&principal)?;
    let page = PageRequest::parse(query.limit, query.cursor.as_deref())?;
    let now = Timestamp::now();
    let rows = approval::list(
        &idempotency.db,
        &principal.account_id,
        query.state,
        now,
        page.after_seq,
        page.fetch_limit(),
    )
    .await?;
    let total = approval::count(&idempotency.db, &principal.account_id, query.state, now).await?;
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
    may_read_approvals(&principal)?;
    approval::find(&idempotency.db, &principal.account_id, &approval_id)
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
    if let Err(refused) = approval::may_decide(&principal) {
        return refused.into_response();
    }
    let decide = async || {
        idempotency
            .decide_approval(&principal, &approval_id, body.decision, &body.fingerprint)
            .await
    };
    let Some(key) = key else {
        return match decide().await {
            Ok(view) => Json(view).into_response(),
            Err(error) => error.into_response(),
        };
    };
    let command = DecideApproval {
        approval_id: &approval_id,
        decision: body.decision,
        fingerprint: &body.fingerprint,
    };
    // The decision makes its own writes once the key is claimed, as a call-out
    // does: repeating it is safe (the same approver gets the same decision).
    idempotency
        .execute_calling_out(
            Attempt::post(DECISION_ROUTE, &principal, key),
            &command,
            async |_| decide().await,
            async |_, _, view: ApprovalView| Ok(Effect::json(StatusCode::OK, &view)),
        )
        .await
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    pub operation_id: Option<String>,
    pub event: Option<AuditEvent>,
    /// RFC 3339: entries at or after.
    pub since: Option<Timestamp>,
    /// RFC 3339: entries before.
    pub until: Option<Timestamp>,
    /// 1–200, default 50.
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// `{data, next_cursor}` of journal entries, in chain order.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AuditList {
    pub data: Vec<AuditEntry>,
    pub next_cursor: Option<String>,
}

/// The account's audit journal entries, in chain order (docs/contract.md §8).
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "audit",
    params(AuditQuery),
    responses(
        (status = 200, body = AuditList),
        (status = 403, description = "Agents may not read the journal", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn read_audit(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Json<AuditList>, ApiError> {
    may_read_approvals(&principal)?;
    let page = PageRequest::parse(query.limit, query.cursor.as_deref())?;
    // what was recorded or observed until now is in the chain before it is read
    idempotency.flush_journal().await;
    let filter = AuditFilter {
        operation_id: query.operation_id,
        event: query.event,
        since: query.since,
        until: query.until,
    };
    let rows = audit::find(
        &idempotency.db,
        &principal.account_id,
        &filter,
        page.after_seq,
        page.fetch_limit(),
    )
    .await?;
    let page = Page::from_rows(rows.into_iter().map(|e| (e.seq, e)).collect(), page);
    Ok(Json(AuditList {
        data: page.data,
        next_cursor: page.next_cursor,
    }))
}

/// The head of the service's audit chain — `{seq, hash}` of its newest
/// entry, `{0, GENESIS}` while it is empty — for an operator to pin and later
/// check a journal against (`audit verify --pin SEQ:HASH`), which catches a
/// cut tail. The chain is one per service database, not per account, so the
/// head is the service's: it reveals only a number and a hash, nothing of any
/// entry, and the number only how many entries the service has journaled.
/// Read by approvers and admins, like the journal.
#[utoipa::path(
    get,
    path = "/v1/audit/head",
    tag = "audit",
    responses(
        (status = 200, body = Head),
        (status = 403, description = "Agents may not read the journal", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn read_audit_head(
    State(idempotency): State<Idempotency>,
    principal: Principal,
) -> Result<Json<Head>, ApiError> {
    may_read_approvals(&principal)?;
    // what was recorded or observed until now is in the chain the head ends
    idempotency.flush_journal().await;
    Ok(Json(audit::head(&idempotency.db).await?))
}

/// Read one of the caller's operations.
#[utoipa::path(
    get,
    path = "/v1/operations/{operation_id}",
    tag = "operations",
    params(("operation_id" = String, Path, description = "The `op_…` id from the `Operation-Id` header")),
    responses(
        (status = 200, description = "The operation", body = OperationView),
        (status = 404, description = "No such operation in this account", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_operation(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    ApiPath(operation_id): ApiPath<String>,
) -> Result<Json<OperationView>, ApiError> {
    idempotency.flush_attempts().await;
    let operation = store::find_by_id(&idempotency.db, &principal.account_id, &operation_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("operation `{operation_id}`")))?;
    Ok(Json(OperationView::read(&idempotency, operation).await?))
}

/// Find the caller's operation by the key it was sent with: after a timeout,
/// an empty list means the server never claimed the key.
///
/// `idempotency_key` is read as the `Idempotency-Key` header is (a bare token
/// or a quoted sf-string, the same rules and errors) and must be
/// percent-encoded in the query: `?idempotency_key=%22k%22` for the header
/// `Idempotency-Key: "k"`.
#[utoipa::path(
    get,
    path = "/v1/operations",
    tag = "operations",
    params(OperationQuery),
    responses(
        (status = 200, description = "The operation with this key, if there is one", body = OperationList),
        (status = 400, description = "No key (`invalid_request`) or an invalid one (`idempotency_key_invalid`)", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn find_operation_by_key(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    ApiQuery(query): ApiQuery<OperationQuery>,
) -> Result<Json<OperationList>, ApiError> {
    PageRequest::parse(query.limit, query.cursor.as_deref())?;
    idempotency.flush_attempts().await;
    // read as the header is: a quoted key names the same operation as its bare form
    let key =
        IdempotencyKey::parse(&query.idempotency_key).map_err(|e| ApiError::idempotency_key_invalid(e.to_string()))?;
    let data = match store::find_by_key(&idempotency.db, &principal.account_id, key.as_str()).await? {
        Some(operation) => vec![OperationView::read(&idempotency, operation).await?],
        None => Vec::new(),
    };
    Ok(Json(OperationList {
        data,
        next_cursor: None,
    }))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(
        get_operation,
        find_operation_by_key,
        list_approvals,
        get_approval,
        decide,
        read_audit,
        read_audit_head
    ),
    components(schemas(
        OperationView,
        OperationList,
        OperationState,
        OperationApproval,
        ResourceRef,
        ApprovalView,
        ApprovalList,
        ApprovalState,
        ApprovalSummary,
        ApprovalRequested,
        DecisionBody,
        Decision,
        AuditEntry,
        AuditEvent,
        AuditList,
        Head
    ))
)]
pub struct OperationsApi;

//! The operation status resource (CONTRACT §4), mountable by every service:
//! the answer for an agent that timed out and does not know what happened.

use axum::{
    Json, Router,
    extract::{FromRef, State},
    routing::get,
};
use platform::{ApiError, ApiPath, ApiQuery, Authenticator, Principal, Timestamp, page::PageRequest};
use serde::{Deserialize, Serialize};

use crate::{Idempotency, IdempotencyKey, OperationRecord, OperationState, ResourceRef, store};

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
    /// hex SHA-256 of the canonical validated command (CONTRACT §2)
    pub fingerprint: String,
    pub state: OperationState,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// How many requests carried the key.
    pub attempts: i32,
    /// What the operation made or acted on, once known.
    pub resource: Option<ResourceRef>,
    /// The status of the stored answer, once finished.
    pub response_status: Option<u16>,
    /// The approval that applies, if any.
    pub approval: Option<serde_json::Value>,
    /// The external system's reference, when one was involved.
    pub external_ref: Option<String>,
}

impl From<OperationRecord> for OperationView {
    fn from(op: OperationRecord) -> Self {
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
            response_status: op.response.map(|r| r.status.as_u16()),
            approval: None,
            external_ref: op.external_ref,
        }
    }
}

/// `{data, next_cursor}` (CONTRACT §10).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OperationList {
    pub data: Vec<OperationView>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OperationQuery {
    /// The key the operation was sent with, after unquoting: the key itself,
    /// URL-encoded, never the quoted header form.
    pub idempotency_key: Option<String>,
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
    store::find_by_id(&idempotency.db, &principal.account_id, &operation_id)
        .await?
        .map(|op| Json(op.into()))
        .ok_or_else(|| ApiError::not_found(format!("operation `{operation_id}`")))
}

/// Find the caller's operation by the key it was sent with: after a timeout,
/// an empty list means the server never claimed the key.
#[utoipa::path(
    get,
    path = "/v1/operations",
    tag = "operations",
    params(OperationQuery),
    responses(
        (status = 200, description = "The operation with this key, if there is one", body = OperationList),
        (status = 400, description = "No or an invalid key", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn find_operation_by_key(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    ApiQuery(query): ApiQuery<OperationQuery>,
) -> Result<Json<OperationList>, ApiError> {
    PageRequest::parse(query.limit, query.cursor.as_deref())?;
    let key = query
        .idempotency_key
        .ok_or_else(|| ApiError::invalid_field("idempotency_key", "is required"))?;
    idempotency.flush_attempts().await;
    let key = IdempotencyKey::parse_unquoted(key).map_err(|e| ApiError::idempotency_key_invalid(e.to_string()))?;
    let data = store::find_by_key(&idempotency.db, &principal.account_id, key.as_str())
        .await?
        .map(OperationView::from)
        .into_iter()
        .collect();
    Ok(Json(OperationList {
        data,
        next_cursor: None,
    }))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(get_operation, find_operation_by_key),
    components(schemas(OperationView, OperationList, OperationState, ResourceRef))
)]
pub struct OperationsApi;

//! The answers an attempt gives, stored or refused (docs/contract.md §3, §11).

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use platform::{ApiError, error::PROBLEM_JSON};

use crate::operation::{OperationRecord, OperationState, StoredResponse, status_url};

/// The header naming the operation an answer belongs to.
pub const OPERATION_ID: &str = "operation-id";
/// The header telling a replayed answer (`true`) from a first one (`false`).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// A commit whose outcome the server cannot know: a retry with the same key
/// finds out, a replay if it committed.
pub(crate) fn commit_failed(error: sqlx::Error) -> Response {
    if platform::error::database_unreachable(&error) {
        return ApiError::database_unavailable(format!("commit: {error}")).into_response();
    }
    ApiError::internal(format!("commit: {error}"))
        .with_detail("the server could not confirm the commit; retry with the same key: if it committed, the retry replays its answer")
        .into_response()
}

/// 422: the key names another request; only the operation's id and state are told.
pub(crate) fn key_reused(operation_id: &str, state: OperationState) -> Response {
    let error = ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
        "Idempotency-Key reused with a different request",
        "this key already names an operation with a different request; a new intention needs a new key",
    )
    .with("operation_id", operation_id)
    .with("state", state);
    with_operation_headers(error.into_response(), operation_id, false)
}

/// A final business failure, as it is stored and replayed.
pub fn problem_response(error: &ApiError) -> StoredResponse {
    StoredResponse {
        status: error.status(),
        content_type: PROBLEM_JSON.into(),
        location: None,
        body: error.to_problem_json(),
    }
}

pub(crate) fn in_progress(operation: &OperationRecord) -> Response {
    let error = ApiError::new(
        StatusCode::CONFLICT,
        "request_in_progress",
        "Request in progress",
        "an earlier attempt with this key is still running; retry with the same key after `Retry-After` seconds, or poll `status_url`",
    )
    .with("operation_id", &operation.operation_id)
    .with("state", operation.state)
    .with("status_url", status_url(&operation.operation_id))
    // until the lease ends, at least 1
    .with_retry_after(operation.locked_until.map_or(0, |until| until.seconds_from_now()).max(1));
    with_operation_headers(error.into_response(), &operation.operation_id, false)
}

/// 409: an external effect may have happened, and there is no answer to replay.
pub(crate) fn outcome_unknown(operation: &OperationRecord) -> Response {
    let error = ApiError::new(
        StatusCode::CONFLICT,
        "operation_outcome_unknown",
        "Outcome unknown",
        "an external effect of this operation may or may not have happened; it is not executed again. Poll `status_url`",
    )
    .with("operation_id", &operation.operation_id)
    .with("state", OperationState::Unknown)
    .with("status_url", status_url(&operation.operation_id));
    with_operation_headers(error.into_response(), &operation.operation_id, false)
}

/// The stored answer, byte for byte, with the operation's headers.
pub fn stored_response(stored: &StoredResponse, operation_id: &str, replayed: bool) -> Response {
    with_operation_headers(stored_response_without_operation(stored), operation_id, replayed)
}

pub(crate) fn stored_response_without_operation(stored: &StoredResponse) -> Response {
    let mut response = (stored.status, stored.body.clone()).into_response();
    let headers = response.headers_mut();
    if let Ok(content_type) = HeaderValue::from_str(&stored.content_type) {
        headers.insert(header::CONTENT_TYPE, content_type);
    }
    if let Some(location) = stored.location.as_deref().and_then(|l| HeaderValue::from_str(l).ok()) {
        headers.insert(header::LOCATION, location);
    }
    response
}

pub(crate) fn with_operation_headers(mut response: Response, operation_id: &str, replayed: bool) -> Response {
    let headers = response.headers_mut();
    if let Ok(id) = HeaderValue::from_str(operation_id) {
        headers.insert(OPERATION_ID, id);
    }
    headers.insert(
        IDEMPOTENT_REPLAYED,
        HeaderValue::from_static(if replayed { "true" } else { "false" }),
    );
    response
}

pub(crate) fn with_retry_after(mut response: Response, error: &ApiError) -> Response {
    if let Some(seconds) = error.retry_after() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

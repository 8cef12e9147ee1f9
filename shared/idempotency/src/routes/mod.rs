//! The routes every service mounts from this crate: the operation status
//! (docs/contract.md §4) and `/metrics`. The extensions' are in their crates.

mod operations;

use axum::{Router, extract::FromRef, routing::get};
use platform::Authenticator;

use crate::{layer::Idempotency, operation::OperationState, operation::ResourceRef, status::ApprovalState};

pub use crate::status::{NeedsAPerson, OperationApproval, OperationView};
pub use operations::{OperationList, OperationQuery, find_operation_by_key, get_operation};

/// The operation status, and the service's metrics.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Idempotency: FromRef<S>,
    Authenticator: FromRef<S>,
{
    Router::new()
        .route("/v1/operations", get(find_operation_by_key))
        .route("/v1/operations/{operation_id}", get(get_operation))
        .route("/metrics", get(metrics))
}

/// `GET /metrics`, with no key: it names no account (docs/metrics.md). Gauges
/// not read in time keep their last values; the rest is served all the same.
async fn metrics(axum::extract::State(idempotency): axum::extract::State<Idempotency>) -> axum::response::Response {
    if let Err(e) = crate::gauges::refresh_if_stale(&idempotency).await {
        tracing::warn!(error = %e, "metrics: could not read the gauges from the database");
    }
    platform::metrics::exposition(idempotency.metrics().render())
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(operations::get_operation, operations::find_operation_by_key),
    components(schemas(
        OperationView,
        OperationList,
        OperationState,
        OperationApproval,
        ApprovalState,
        operations::UnknownState,
        operations::DeadEvent,
        crate::status::EventState,
        ResourceRef
    ))
)]
pub struct OperationsApi;

//! The audit journal (docs/contract.md §8): the account's entries in chain
//! order, and the head of the service's chain for an operator to pin.

use axum::{
    Json, Router,
    extract::{FromRef, State},
    routing::get,
};
use idempotency::Idempotency;
use platform::{
    ApiError, ApiQuery, Principal, Timestamp,
    page::{Page, PageRequest},
};
use serde::{Deserialize, Serialize};

use crate::{AuditEntry, AuditEvent, AuditFilter, Head, Journal};

/// The journal's routes, which a service merges beside the core's.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Idempotency: FromRef<S>,
    platform::Authenticator: FromRef<S>,
{
    Router::new()
        .route("/v1/audit", get(read_audit))
        .route("/v1/audit/head", get(read_audit_head))
}

/// The journal's routes in the service's OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(
    paths(read_audit, read_audit_head),
    components(schemas(AuditEntry, AuditEvent, AuditList, Head))
)]
pub struct JournalApi;

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
    principal.may_read_approvals()?;
    let page = PageRequest::parse(query.limit, query.cursor.as_deref())?;
    // what was recorded or observed until now is in the chain before it is read
    idempotency.flush_journal().await;
    let filter = AuditFilter {
        operation_id: query.operation_id,
        event: query.event,
        since: query.since,
        until: query.until,
    };
    let rows = crate::find(
        idempotency.db(),
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
/// Read by approvers and admins, like the journal. A journal cut under the
/// running service does not take it back: the process answers the entry it
/// last linked until the journal holds it again.
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
    principal.may_read_approvals()?;
    // what was recorded or observed until now is in the chain the head ends
    idempotency.flush_journal().await;
    let in_database = crate::head(idempotency.db()).await?;
    // never behind what this process linked: a journal cut under it is verified against that
    Ok(Json(match idempotency.sink::<Journal>() {
        Some(journal) => journal.published_head(in_database),
        None => in_database,
    }))
}

//! The operation status resource (docs/contract.md §4), by id or by key.

use axum::{Json, extract::State};
use platform::{
    ApiError, ApiPath, ApiQuery, Principal, Role,
    page::{Page, PageRequest},
};
use serde::{Deserialize, Serialize};

use crate::{
    key::IdempotencyKey,
    layer::Idempotency,
    operation::{OperationRecord, OperationState},
    status::{EventState, NeedsAPerson, OperationView},
    store,
};

impl OperationView {
    /// The view of `operation`, with what each extension adds to it.
    pub async fn read(idempotency: &Idempotency, operation: OperationRecord) -> Result<Self, ApiError> {
        let mut view = OperationView::from(&operation);
        for extension in idempotency.extensions() {
            extension.describe(&idempotency.db, &operation, &mut view).await?;
        }
        Ok(view)
    }
}

/// `{data, next_cursor}` (docs/contract.md §10).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OperationList {
    pub data: Vec<OperationView>,
    pub next_cursor: Option<String>,
}

/// The lookup's query: a key, or none for the operations that need a person.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OperationQuery {
    /// The key as the `Idempotency-Key` header carried it, bare or an RFC 8941
    /// sf-string, percent-encoded: `%22k%22` for `"k"`; `%20`, `%25`, `%26`,
    /// `%2B`, `%23` wherever those characters occur. An invalid key is 400
    /// `idempotency_key_invalid`.
    pub idempotency_key: Option<String>,
    /// Only operations whose outcome is unknown (`POST …/resolution` settles them).
    pub state: Option<UnknownState>,
    /// Only operations whose outbox event is dead (`POST …/redelivery` sends it again).
    pub outbox: Option<DeadEvent>,
    /// 1–200, default 50 (a key names at most one operation).
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// The one operation state the lookup filters on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UnknownState {
    Unknown,
}

/// The one outbox state the lookup filters on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeadEvent {
    Dead,
}

enum Listing {
    Key(IdempotencyKey),
    NeedingAPerson(NeedsAPerson),
}

impl OperationQuery {
    fn listing(&self, principal: &Principal) -> Result<Listing, ApiError> {
        if let Some(key) = &self.idempotency_key {
            let key = IdempotencyKey::parse(key).map_err(|e| ApiError::idempotency_key_invalid(e.to_string()))?;
            return Ok(Listing::Key(key));
        }
        if principal.role == Role::Agent {
            return Err(ApiError::forbidden(
                "the operations that need a person are for approvers and admins; an agent asks for its own by `idempotency_key`",
            ));
        }
        Ok(Listing::NeedingAPerson(NeedsAPerson {
            unknown: self.state.is_some(),
            dead: self.outbox.is_some(),
        }))
    }

    /// Whether `view` passes the filters given with a key.
    fn admits(&self, view: &OperationView) -> bool {
        (self.state.is_none() || view.state == OperationState::Unknown)
            && (self.outbox.is_none() || view.outbox == Some(EventState::Dead))
    }
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
/// an empty list means the server never claimed the key. A service knows only
/// the keys sent to it. Without a key, for an `approver` or `admin`, the
/// account's operations that need a person (outcome unknown, or outbox event
/// dead), oldest first.
#[utoipa::path(
    get,
    path = "/v1/operations",
    tag = "operations",
    params(OperationQuery),
    responses(
        (status = 200, description = "The operation with this key, if there is one; or a page of those that need a person", body = OperationList),
        (status = 400, description = "An invalid key (`idempotency_key_invalid`)", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 403, description = "No key, from an agent: the operations that need a person are for approvers and admins", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn find_operation_by_key(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    ApiQuery(query): ApiQuery<OperationQuery>,
) -> Result<Json<OperationList>, ApiError> {
    let page = PageRequest::parse(query.limit, query.cursor.as_deref())?;
    let listing = query.listing(&principal)?;
    idempotency.flush_attempts().await;
    let which = match listing {
        Listing::Key(key) => {
            let mut data = Vec::new();
            if let Some(operation) = store::find_by_key(&idempotency.db, &principal.account_id, key.as_str()).await? {
                data.push(OperationView::read(&idempotency, operation).await?);
            }
            data.retain(|view| query.admits(view));
            return Ok(Json(OperationList {
                data,
                next_cursor: None,
            }));
        }
        Listing::NeedingAPerson(which) => which,
    };
    // the extension whose work can leave an operation for a person lists them (the outbox)
    let listed = idempotency.extensions().find_map(|extension| {
        extension.needing_a_person(
            &idempotency.db,
            &principal.account_id,
            which,
            page.after_seq,
            page.fetch_limit(),
        )
    });
    let mut ids = match listed {
        Some(listing) => listing.await?,
        None => Vec::new(),
    };
    let more = ids.len() as i64 > page.limit;
    ids.truncate(page.limit as usize);
    let next_cursor = more
        .then(|| ids.last().map(|(seq, _)| Page::<()>::cursor_after(*seq)))
        .flatten();
    let mut data = Vec::with_capacity(ids.len());
    for (_, operation_id) in ids {
        // never reaped while unknown or waiting on its event; a missing one is simply not shown
        if let Some(operation) = store::find_by_id(&idempotency.db, &principal.account_id, &operation_id).await? {
            data.push(OperationView::read(&idempotency, operation).await?);
        }
    }
    Ok(Json(OperationList { data, next_cursor }))
}

//! The operation status resource (docs/contract.md §4): by id, or by the key
//! it was sent with — the answer for an agent that timed out and does not
//! know what happened. Never the stored request or answer body.

use axum::{Json, extract::State};
use platform::{
    ApiError, ApiPath, ApiQuery, Principal, Timestamp,
    page::{Page, PageRequest},
};
use serde::{Deserialize, Serialize};

use super::may_read_approvals;
use crate::{
    Idempotency, IdempotencyKey, OperationRecord, OperationState, ResourceRef,
    approval::{self, ApprovalState},
    outbox::{self, NeedsAPerson},
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
    /// Where its outbox event is, when its work left the process: `pending`,
    /// `sending`, `unknown`, `delivered`, `failed`, or `dead` (failed too
    /// often: no longer tried until an admin sends it again, the operation's
    /// `state` left as it was).
    #[schema(example = "dead")]
    pub outbox: Option<String>,
    /// Why the event's last delivery or lookup came to nothing, if it did.
    pub last_error: Option<String>,
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
            outbox: None,
            last_error: None,
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
    /// The view of `operation`, with its approval and its outbox event read
    /// if it has them.
    pub(crate) async fn read(idempotency: &Idempotency, operation: OperationRecord) -> Result<Self, ApiError> {
        let approval = match &operation.approval_id {
            Some(id) => approval::find(&idempotency.db, &operation.account_id, id).await?,
            None => None,
        };
        let delivery = outbox::delivery_of(&idempotency.db, &operation.account_id, &operation.operation_id).await?;
        let mut view = OperationView::from(operation);
        if let Some(delivery) = delivery {
            view.outbox = Some(delivery.state.as_str().to_owned());
            view.last_error = delivery.last_error;
        }
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

/// Exactly one of `idempotency_key`, `state` and `outbox`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OperationQuery {
    /// The key as the `Idempotency-Key` header carried it — a bare token or
    /// an RFC 8941 sf-string (`"k"`), read the same way — percent-encoded
    /// (`%22k%22` for `"k"`; `%20`, `%25`, `%26`, `%2B`, `%23` wherever those
    /// characters occur). An invalid key is 400 `idempotency_key_invalid`.
    pub idempotency_key: Option<String>,
    /// `unknown`: the operations a person may have to settle
    /// (`POST …/resolution`). For an `approver` or `admin`.
    #[param(example = "unknown")]
    pub state: Option<String>,
    /// `dead`: the operations whose outbox event is dead, which an `admin`
    /// may send again (`POST …/redelivery`). For an `approver` or `admin`.
    #[param(example = "dead")]
    pub outbox: Option<String>,
    /// 1–200, default 50 (a key names at most one operation).
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// What a list of operations is of.
enum Listing {
    Key(IdempotencyKey),
    NeedingAPerson(NeedsAPerson),
}

impl OperationQuery {
    fn listing(&self, principal: &Principal) -> Result<Listing, ApiError> {
        let one_of = "give exactly one of `idempotency_key`, `state=unknown` and `outbox=dead`";
        let which = match (&self.idempotency_key, self.state.as_deref(), self.outbox.as_deref()) {
            (Some(key), None, None) => {
                // read as the header is: a quoted key names the same operation as its bare form
                let key = IdempotencyKey::parse(key).map_err(|e| ApiError::idempotency_key_invalid(e.to_string()))?;
                return Ok(Listing::Key(key));
            }
            (None, Some("unknown"), None) => NeedsAPerson::Unknown,
            (None, Some(_), None) => return Err(ApiError::invalid_field("state", "must be `unknown`")),
            (None, None, Some("dead")) => NeedsAPerson::DeadEvent,
            (None, None, Some(_)) => return Err(ApiError::invalid_field("outbox", "must be `dead`")),
            (None, None, None) => {
                return Err(ApiError::invalid_field(
                    "idempotency_key",
                    format!("is required: {one_of}"),
                ));
            }
            _ => return Err(ApiError::invalid_request(one_of, Vec::new())),
        };
        may_read_approvals(principal)?;
        Ok(Listing::NeedingAPerson(which))
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
/// an empty list means the server never claimed the key. Or, for an
/// `approver` or `admin`, list the account's operations that need a person:
/// `state=unknown` or `outbox=dead`, oldest first.
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
        (status = 200, description = "The operation with this key, if there is one; or a page of those that need a person", body = OperationList),
        (status = 400, description = "Not exactly one of the filters (`invalid_request`), or an invalid key (`idempotency_key_invalid`)", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`state` or `outbox` asked by an agent", body = platform::error::Problem, content_type = "application/problem+json"),
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
            let data = match store::find_by_key(&idempotency.db, &principal.account_id, key.as_str()).await? {
                Some(operation) => vec![OperationView::read(&idempotency, operation).await?],
                None => Vec::new(),
            };
            return Ok(Json(OperationList {
                data,
                next_cursor: None,
            }));
        }
        Listing::NeedingAPerson(which) => which,
    };
    let ids = outbox::needing_a_person(
        &idempotency.db,
        &principal.account_id,
        which,
        page.after_seq,
        page.fetch_limit(),
    )
    .await?;
    let mut rows = Vec::with_capacity(ids.len());
    for (seq, operation_id) in ids {
        // settled or reaped since the list was read: left out
        if let Some(operation) = store::find_by_id(&idempotency.db, &principal.account_id, &operation_id).await? {
            rows.push((seq, OperationView::read(&idempotency, operation).await?));
        }
    }
    let page = Page::from_rows(rows, page);
    Ok(Json(OperationList {
        data: page.data,
        next_cursor: page.next_cursor,
    }))
}

//! What an `admin` does about an operation the outbox cannot settle by
//! itself (docs/contract.md §5): settle one whose outcome is unknown with
//! the evidence they found, or send a dead event again.

use axum::{Json, extract::State};
use platform::{ApiError, ApiJson, ApiPath, Principal, Role};
use serde::Deserialize;
use validator::{Validate, ValidationError};

use super::operations::OperationView;
use crate::{
    Idempotency,
    outbox::{self, ByHandError, Resolution, Resolved},
    store,
};

/// How the work ended at the external system, as a person found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResolutionOutcome {
    /// It took effect there: settled as the reconciler settles what it finds.
    Completed,
    /// It did not take effect: settled as a refusal.
    Failed,
}

#[derive(Debug, Deserialize, Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolutionBody {
    pub outcome: ResolutionOutcome,
    /// What the person saw, in their words; journaled with the resolution.
    #[validate(
        length(max = 2000, message = "must be at most 2000 characters"),
        custom(function = not_blank)
    )]
    #[schema(example = "no charge under this key in the provider's dashboard")]
    pub evidence: String,
    /// The external system's reference for the work (the charge, the
    /// rollout). Required with `completed`: the service's rows record it, as
    /// they record what the reconciler finds.
    #[validate(
        length(max = 200, message = "must be at most 200 characters"),
        custom(function = not_blank)
    )]
    pub external_ref: Option<String>,
}

fn not_blank(value: &str) -> Result<(), ValidationError> {
    if value.trim().is_empty() {
        return Err(ValidationError::new("blank").with_message("must not be blank".into()));
    }
    Ok(())
}

impl TryFrom<ResolutionBody> for Resolution {
    type Error = ApiError;

    fn try_from(body: ResolutionBody) -> Result<Self, ApiError> {
        let outcome = match (body.outcome, body.external_ref) {
            (ResolutionOutcome::Completed, Some(external_ref)) => Resolved::Completed { external_ref },
            (ResolutionOutcome::Completed, None) => {
                return Err(ApiError::invalid_field(
                    "external_ref",
                    "is required with `completed`: the external system's reference for the work",
                ));
            }
            (ResolutionOutcome::Failed, None) => Resolved::Failed,
            (ResolutionOutcome::Failed, Some(_)) => {
                return Err(ApiError::invalid_field(
                    "external_ref",
                    "goes only with `completed`: work that failed has no reference",
                ));
            }
        };
        Ok(Resolution {
            outcome,
            evidence: body.evidence,
        })
    }
}

/// Only an `admin` settles by hand, decided before any lookup.
fn may_settle(principal: &Principal) -> Result<(), ApiError> {
    match principal.role {
        Role::Admin => Ok(()),
        Role::Agent | Role::Approver => Err(ApiError::forbidden(
            "only an admin of the account settles an operation by hand or sends a dead event again",
        )),
    }
}

fn refusal(error: ByHandError, operation_id: &str, wanted: &str) -> ApiError {
    match error {
        ByHandError::NotFound => ApiError::not_found(format!("operation `{operation_id}`")),
        ByHandError::InvalidState(state, event) => {
            let mut problem = ApiError::invalid_state(format!(
                "operation `{operation_id}` is `{}`{}: {wanted}",
                state.as_str(),
                event
                    .map(|e| format!(", its outbox event `{}`", e.as_str()))
                    .unwrap_or_default()
            ))
            .with("state", state);
            if let Some(event) = event {
                problem = problem.with("outbox", event.as_str());
            }
            problem
        }
        ByHandError::Database(e) => e.into(),
    }
}

/// The operation as it is now.
async fn view(idempotency: &Idempotency, principal: &Principal, operation_id: &str) -> Result<OperationView, ApiError> {
    let operation = store::find_by_id(&idempotency.db, &principal.account_id, operation_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("operation `{operation_id}`")))?;
    OperationView::read(idempotency, operation).await
}

/// Settle an operation whose outcome is unknown, as a person found it at the
/// external system. Role `admin`, same account. A compare-and-set from
/// `unknown`: the operation's event, the service's rows (as the reconciler
/// writes what it finds) and the journal (`resolved` by the admin, with the
/// evidence, then the outcome) in one transaction. The operation's stored
/// answer stays, replayed to every later attempt with its key.
#[utoipa::path(
    post,
    path = "/v1/operations/{operation_id}/resolution",
    tag = "operations",
    params(("operation_id" = String, Path)),
    request_body = ResolutionBody,
    responses(
        (status = 200, description = "Settled: the operation as it is now", body = OperationView),
        (status = 400, description = "`invalid_request`: no evidence, or `external_ref` missing with `completed`", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such operation in this account", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`invalid_state`: the operation is not `unknown` (its `state` is given)", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn resolve_operation(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    ApiPath(operation_id): ApiPath<String>,
    ApiJson(body): ApiJson<ResolutionBody>,
) -> Result<Json<OperationView>, ApiError> {
    may_settle(&principal)?;
    let resolution = Resolution::try_from(body)?;
    outbox::resolve(&idempotency, &principal, &operation_id, &resolution)
        .await
        .map_err(|e| {
            refusal(
                e,
                &operation_id,
                "only an operation whose outcome is unknown is settled by hand",
            )
        })?;
    Ok(Json(view(&idempotency, &principal, &operation_id).await?))
}

/// Send an operation's dead outbox event again. Role `admin`, same account.
/// The event goes back to the reconciler with its failures forgiven: it asks
/// the external system first, and sends it again with the same key only if
/// there is no trace of it there.
#[utoipa::path(
    post,
    path = "/v1/operations/{operation_id}/redelivery",
    tag = "operations",
    params(("operation_id" = String, Path)),
    responses(
        (status = 200, description = "Given back: the operation as it is now", body = OperationView),
        (status = 403, description = "Not an admin", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such operation in this account", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`invalid_state`: the operation has no dead event (its `state` and `outbox` are given)", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn redeliver_operation(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    ApiPath(operation_id): ApiPath<String>,
) -> Result<Json<OperationView>, ApiError> {
    may_settle(&principal)?;
    outbox::redeliver(&idempotency, &principal, &operation_id)
        .await
        .map_err(|e| refusal(e, &operation_id, "only a dead event is sent again"))?;
    Ok(Json(view(&idempotency, &principal, &operation_id).await?))
}

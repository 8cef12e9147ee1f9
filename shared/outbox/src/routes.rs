//! What an `admin` does about an operation the outbox cannot settle by
//! itself (docs/contract.md §5): settle one whose outcome is unknown with
//! the evidence they found, or send a dead event again. A service merges
//! [`routes`] beside the core's, and [`SettlingApi`] into its OpenAPI document.

use axum::{
    Router,
    extract::{FromRef, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
};
use idempotency::{
    Idempotency, OperationState, OptionalIdempotencyHeaders, status::OperationView, store as operations,
};
use platform::{ApiError, ApiJson, ApiPath, Authenticator, Principal, Role};
use serde::{Deserialize, Serialize};
use validator::{Validate, ValidationError, ValidationErrors};

use crate::{
    answer::is_external_id,
    by_hand::{self, ByHandError},
    resolution::{Resolution, Resolved},
};

/// Settling by hand: an unknown operation's resolution and a dead event's redelivery.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Idempotency: FromRef<S>,
    Authenticator: FromRef<S>,
{
    Router::new()
        .route(RESOLUTION_ROUTE, post(resolve_operation))
        .route(REDELIVERY_ROUTE, post(redeliver_operation))
}

/// The settling routes' part of a service's OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(resolve_operation, redeliver_operation), components(schemas(ResolutionBody)))]
pub struct SettlingApi;

/// How the work ended at the external system, as a person found it, and
/// what they saw. What they say is checked with the external system where it
/// can be (docs/contract.md §5): a reference must be what it holds for this
/// operation, and `failed` needs it to hold nothing under the operation's key.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResolutionBody {
    /// It took effect there: with the external system's reference for it,
    /// which the external system must confirm is this operation's (then the
    /// service's rows record it, as they record what the reconciler finds);
    /// or with none, when the external system cannot be asked for good (then
    /// the operation ends `completed`, and no row keeps an external id).
    // each text has a character that is not a space, and none is NUL
    Completed {
        /// What the person saw, in their words; journaled with the resolution.
        #[schema(
            min_length = 1,
            max_length = 2000,
            pattern = r"^[^\u0000]*[^\s\u0000\u0085][^\u0000]*$",
            example = "ch_1 is this capture's charge in the provider's dashboard"
        )]
        evidence: String,
        /// The external system's id for the work (the charge, the rollout):
        /// letters, digits, `_` and `-`.
        #[serde(default)]
        #[schema(min_length = 1, max_length = 200, pattern = r"^[A-Za-z0-9_-]+$")]
        external_ref: Option<String>,
    },
    /// It did not take effect: settled as failed, once the external system
    /// answers that it holds nothing under the operation's key.
    Failed {
        /// What the person saw, in their words; journaled with the resolution.
        #[schema(
            min_length = 1,
            max_length = 2000,
            pattern = r"^[^\u0000]*[^\s\u0000\u0085][^\u0000]*$",
            example = "no charge under this key in the provider's dashboard"
        )]
        evidence: String,
        /// An id the person found there (a declined charge, a support
        /// case), of the same form: journaled with the resolution, and kept
        /// by no row, since nothing at the external system confirms it.
        #[serde(default)]
        #[schema(min_length = 1, max_length = 200, pattern = r"^[A-Za-z0-9_-]+$")]
        external_ref: Option<String>,
    },
}

impl Validate for ResolutionBody {
    fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errors = ValidationErrors::new();
        let (ResolutionBody::Completed { evidence, external_ref } | ResolutionBody::Failed { evidence, external_ref }) =
            self;
        if let Err(e) = text(evidence, 2000) {
            errors.add("evidence", e);
        }
        if let Some(Err(e)) = external_ref.as_deref().map(external_id) {
            errors.add("external_ref", e);
        }
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }
}

/// Words a person wrote: not blank, at most `max` characters.
fn text(value: &str, max: usize) -> Result<(), ValidationError> {
    // blank as the schema's pattern has it: ECMAScript's `\s` and U+0085, which are Rust's whitespace and U+FEFF
    if value.chars().all(|c| c.is_whitespace() || c == '\u{feff}') {
        return Err(ValidationError::new("blank").with_message("must not be blank".into()));
    }
    if value.chars().count() > max {
        return Err(ValidationError::new("length").with_message(format!("must be at most {max} characters").into()));
    }
    Ok(())
}

/// An external system's id, as a person copies it: 1 to 200 letters,
/// digits, `_` and `-`. Ids are data, never paths: one with a `/`, a `.`, a
/// `%`, a `?` or a space is refused here, before anything is asked.
fn external_id(value: &str) -> Result<(), ValidationError> {
    if is_external_id(value) {
        Ok(())
    } else {
        Err(ValidationError::new("external_id")
            .with_message("must be 1 to 200 letters, digits, `_` and `-` (the external system's id)".into()))
    }
}

impl From<&ResolutionBody> for Resolution {
    fn from(body: &ResolutionBody) -> Self {
        match body.clone() {
            ResolutionBody::Completed { evidence, external_ref } => Resolution {
                outcome: Resolved::Completed { external_ref },
                evidence,
            },
            ResolutionBody::Failed { evidence, external_ref } => Resolution {
                outcome: Resolved::Failed { external_ref },
                evidence,
            },
        }
    }
}

pub const RESOLUTION_ROUTE: &str = "/v1/operations/{operation_id}/resolution";
pub const REDELIVERY_ROUTE: &str = "/v1/operations/{operation_id}/redelivery";

/// What a resolution or a redelivery sent with a key is an operation of.
#[derive(Debug, Serialize)]
struct Settle<'a> {
    operation_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    resolution: Option<&'a ResolutionBody>,
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

/// When to ask again after the external system could not be asked, in seconds.
const EXTERNAL_SYSTEM_RETRY_AFTER: u64 = 5;

fn refusal(error: ByHandError, operation_id: &str, wanted: &str) -> ApiError {
    match error {
        ByHandError::NotFound => ApiError::not_found(format!("operation `{operation_id}`")),
        ByHandError::InvalidState(state, event) => {
            let mut problem = ApiError::invalid_state(format!(
                "operation `{operation_id}` is `{}`{}: {wanted}",
                state.into_str(),
                event
                    .map(|e| format!(", its outbox event `{}`", e.into_str()))
                    .unwrap_or_default()
            ))
            .with("state", state);
            if let Some(event) = event {
                problem = problem.with("outbox", event.into_str());
            }
            problem
        }
        ByHandError::Held(until) => ApiError::invalid_state(format!(
            "a worker or the reconciler is hearing from the external system about operation `{operation_id}` right now: \
             look at its status, and send this again if it is still unknown"
        ))
        .with("state", OperationState::Unknown)
        .with_retry_after(until.seconds_from_now().max(1)),
        ByHandError::ExternalRefMismatch(Some(external_ref)) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "external_ref_mismatch",
            "External reference not this operation's",
            format!(
                "the external system does not hold `{external_ref}` as operation `{operation_id}`'s work \
                 (under its key or reference, of its amount and currency, or its release and target): \
                 nothing was written, and the refusal is journaled"
            ),
        )
        .with("external_ref", external_ref),
        ByHandError::ExternalRefMismatch(None) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "external_ref_mismatch",
            "The external system holds no work of this operation",
            format!(
                "the external system answers that it holds no work of operation `{operation_id}` (under its key \
                 or reference): it did not take effect there. Nothing was written, and the refusal is journaled; \
                 settle it `failed`, or `completed` with the reference the external system holds"
            ),
        ),
        ByHandError::ExternalOutcomeExists(Some(external_ref)) => ApiError::new(
            StatusCode::CONFLICT,
            "external_outcome_exists",
            "The external system holds the operation's work",
            format!(
                "the external system holds `{external_ref}` for operation `{operation_id}`: it took effect. \
                 Nothing was written; settle it `completed` with that reference"
            ),
        )
        .with("external_ref", external_ref),
        ByHandError::ExternalOutcomeExists(None) => ApiError::new(
            StatusCode::CONFLICT,
            "external_outcome_exists",
            "The external system holds something under the operation's key",
            format!(
                "the external system holds something under operation `{operation_id}`'s key or reference that \
                 is not its work: nothing was written. Look there: it is not the external system's word that \
                 nothing happened"
            ),
        ),
        ByHandError::ExternalSystemUnavailable(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "external_system_unavailable",
            "External system unavailable",
            format!(
                "the external system could not be asked about operation `{operation_id}`, and what cannot be \
                 checked is not written: nothing was. Send it again later"
            ),
        )
        .with_retry_after(EXTERNAL_SYSTEM_RETRY_AFTER),
        ByHandError::Database(e) => e.into(),
    }
}

/// The operation as it is now.
async fn view(idempotency: &Idempotency, principal: &Principal, operation_id: &str) -> Result<OperationView, ApiError> {
    let operation = operations::find_by_id(idempotency.db(), &principal.account_id, operation_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("operation `{operation_id}`")))?;
    OperationView::read(idempotency, operation).await
}

/// Settle an operation whose outcome is unknown, as a person found it at the
/// external system. Role `admin`, same account. What they say is checked
/// with the external system first: `completed` with an `external_ref` only if
/// it holds that reference as this operation's work, `failed` only if it
/// holds nothing under the operation's key. Then a compare-and-set from
/// `unknown`: the operation's event, the service's rows (as the reconciler
/// writes what it finds) and the journal (`resolved` by the admin, with the
/// evidence, then the outcome) in one transaction. The operation's stored
/// answer stays, replayed to every later attempt with its key.
///
/// Repeating it needs no key: sent again once it went through, it is 409
/// naming the state it left. With a key its answer is stored and replayed.
#[utoipa::path(
    post,
    path = "/v1/operations/{operation_id}/resolution",
    tag = "operations",
    params(
        ("operation_id" = String, Path),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: honoured when sent"),
    ),
    request_body = ResolutionBody,
    responses(
        (status = 200, description = "Settled: the operation as it is now", body = OperationView),
        (status = 400, description = "`invalid_request`: no evidence, or an `external_ref` that is not of an id's form; `idempotency_key_invalid`", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such operation in this account", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`invalid_state`: the operation is not `unknown` (its `state` is given), or a worker holds its event right now (with `Retry-After`); `external_outcome_exists`: `failed`, while the external system holds something under the operation's key (`external_ref` names it when it is the operation's work); `request_in_progress` (with a key)", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 422, description = "`external_ref_mismatch`: the external system does not hold `external_ref` as this operation's work (the refusal is journaled); `idempotency_key_reused`: the key was sent with another resolution", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 503, description = "`external_system_unavailable`: the external system could not be asked; nothing was written (with `Retry-After`)", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn resolve_operation(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    OptionalIdempotencyHeaders(key): OptionalIdempotencyHeaders,
    ApiPath(operation_id): ApiPath<String>,
    ApiJson(body): ApiJson<ResolutionBody>,
) -> Response {
    if let Err(refused) = may_settle(&principal) {
        return refused.into_response();
    }
    let command = Settle {
        operation_id: &operation_id,
        resolution: Some(&body),
    };
    idempotency
        .execute_with_optional_key(RESOLUTION_ROUTE, &principal, key, &command, async || {
            by_hand::resolve(&idempotency, &principal, &operation_id, &Resolution::from(&body))
                .await
                .map_err(|e| {
                    refusal(
                        e,
                        &operation_id,
                        "only an operation whose outcome is unknown is settled by hand",
                    )
                })?;
            view(&idempotency, &principal, &operation_id).await
        })
        .await
}

/// Send an operation's dead outbox event again. Role `admin`, same account.
/// The event goes back to the reconciler with its failures forgiven: it asks
/// the external system first, and sends it again with the same key only if
/// there is no trace of it there.
///
/// Repeating it needs no key: sent again while the event is on its way, it
/// changes nothing and answers 200. With a key its answer is stored and
/// replayed.
#[utoipa::path(
    post,
    path = "/v1/operations/{operation_id}/redelivery",
    tag = "operations",
    params(
        ("operation_id" = String, Path),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: honoured when sent"),
    ),
    responses(
        (status = 200, description = "Given back, or on its way already: the operation as it is now", body = OperationView),
        (status = 400, description = "`idempotency_key_invalid`", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such operation in this account", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`invalid_state`: the operation's event is settled, or it has none (its `state` and `outbox` are given); `request_in_progress` (with a key)", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 422, description = "`idempotency_key_reused`: the key was sent with another request", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn redeliver_operation(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    OptionalIdempotencyHeaders(key): OptionalIdempotencyHeaders,
    ApiPath(operation_id): ApiPath<String>,
) -> Response {
    if let Err(refused) = may_settle(&principal) {
        return refused.into_response();
    }
    let command = Settle {
        operation_id: &operation_id,
        resolution: None,
    };
    idempotency
        .execute_with_optional_key(REDELIVERY_ROUTE, &principal, key, &command, async || {
            by_hand::redeliver(&idempotency, &principal, &operation_id)
                .await
                .map_err(|e| refusal(e, &operation_id, "only a dead event is sent again"))?;
            view(&idempotency, &principal, &operation_id).await
        })
        .await
}

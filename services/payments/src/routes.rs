//! The payments API (docs/contract.md §7 Payments). Each handler reads:
//! authenticate, parse into a validated command (amounts into minor units),
//! hand the command and its business write to the idempotency layer, answer
//! what it answers.
//!
//! Every POST has [the shape of a route](idempotency#how-a-route-is-shaped):
//! parse → read-only lookups → `execute` with a closure doing every write → answer.

use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use idempotency::{Attempt, Effect, IdempotencyHeaders, OptionalIdempotencyHeaders};
use platform::{
    ApiError, ApiJson, ApiPath, ApiQuery, Principal,
    page::{Page, PageRequest},
};
use serde::Deserialize;

use crate::{
    App,
    domain::{
        CancelIntent, Capture, CaptureBody, CaptureIntent, CreateIntent, CreateIntentBody, PaymentIntent, Refund,
        RefundBody, RefundPayment,
    },
    provider::{self, ChargeOrder, RefundOrder},
    store,
};

pub const CREATE_INTENT: &str = "/v1/payment_intents";
pub const CANCEL_INTENT: &str = "/v1/payment_intents/{intent_id}/cancel";
pub const CAPTURE_INTENT: &str = "/v1/payment_intents/{intent_id}/capture";
pub const REFUND_INTENT: &str = "/v1/payment_intents/{intent_id}/refunds";

pub fn router() -> Router<App> {
    Router::new()
        .route(CREATE_INTENT, post(create_intent).get(list_intents))
        .route("/v1/payment_intents/{intent_id}", get(get_intent))
        .route(CANCEL_INTENT, post(cancel_intent))
        .route(CAPTURE_INTENT, post(capture_intent))
        .route("/v1/payment_intents/{intent_id}/captures", get(list_captures))
        .route(REFUND_INTENT, post(refund_intent).get(list_refunds))
        .route("/v1/captures/{capture_id}", get(get_capture))
        .route("/v1/refunds/{refund_id}", get(get_refund))
}

/// Create an intent to take an amount for an order. No money moves.
#[utoipa::path(
    post,
    path = "/v1/payment_intents",
    tag = "payments",
    request_body = CreateIntentBody,
    params(("Idempotency-Key" = String, Header, description = "Made once per intended payment; the same on every retry")),
    responses(
        (status = 201, description = "Created, in `requires_capture`", body = PaymentIntent),
        (status = 400, description = "Invalid body or amount (a JSON number, too many decimals, zero, negative, unknown currency); nothing was claimed", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`order_already_has_payment`: the order has a live intent, named by `payment_intent_id`", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 422, description = "`idempotency_key_reused`", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn create_intent(
    State(app): State<App>,
    principal: Principal,
    key: IdempotencyHeaders,
    ApiJson(body): ApiJson<CreateIntentBody>,
) -> Response {
    let command = match CreateIntent::try_from(body) {
        Ok(command) => command,
        Err(invalid) => return invalid.into_response(),
    };
    app.idempotency
        .execute(
            Attempt::post(CREATE_INTENT, &principal, key),
            &command,
            async |tx, _| {
                let intent = store::create_intent(tx, &principal.account_id, &command).await?;
                let (id, url) = (intent.id.clone(), intent.url());
                Ok(Effect::json(StatusCode::CREATED, &intent).with_resource("payment_intent", &id, url))
            },
        )
        .await
}

/// Cancel an intent before any capture; the order is free for a new intent.
/// A cancel declares the end state, so it needs no key (docs/contract.md §1):
/// cancelling what is already cancelled answers 200, unchanged. With a key,
/// it is an operation like any other, replayed to its retries.
#[utoipa::path(
    post,
    path = "/v1/payment_intents/{intent_id}/cancel",
    tag = "payments",
    params(
        ("intent_id" = String, Path),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: honoured when sent"),
    ),
    responses(
        (status = 200, description = "Cancelled (now, or already)", body = PaymentIntent),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`invalid_state`: past `requires_capture`", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn cancel_intent(
    State(app): State<App>,
    principal: Principal,
    OptionalIdempotencyHeaders(key): OptionalIdempotencyHeaders,
    ApiPath(intent_id): ApiPath<String>,
) -> Response {
    let command = CancelIntent { intent_id };
    let Some(key) = key else {
        return match cancel_without_key(&app, &principal, &command).await {
            Ok(intent) => Json(intent).into_response(),
            Err(error) => error.into_response(),
        };
    };
    app.idempotency
        .execute(
            Attempt::post(CANCEL_INTENT, &principal, key),
            &command,
            async |tx, _| {
                let (intent, _) = store::cancel_intent(tx, &principal.account_id, &command.intent_id).await?;
                let (id, url) = (intent.id.clone(), intent.url());
                Ok(Effect::json(StatusCode::OK, &intent).with_resource("payment_intent", &id, url))
            },
        )
        .await
}

/// A cancel with no key: its own transaction, nothing stored for replay.
/// The cancel is journaled (`state_changed`) in it; a cancel of what was
/// cancelled already journals nothing.
async fn cancel_without_key(
    app: &App,
    principal: &Principal,
    command: &CancelIntent,
) -> Result<PaymentIntent, ApiError> {
    let mut tx = app.db.begin().await?;
    let (intent, cancelled) = store::cancel_intent(&mut tx, &principal.account_id, &command.intent_id).await?;
    if cancelled {
        let change = journal::StateChange::new("payment_intent", &intent.id, intent.state.as_str());
        journal::record_state_change(&mut tx, principal, CANCEL_INTENT, change).await?;
    }
    tx.commit().await?;
    Ok(intent)
}

/// The intent a capture or refund names, read before anything is claimed:
/// its currency says what the amount means. 404 claims nothing.
async fn intent_named(app: &App, principal: &Principal, intent_id: &str) -> Result<PaymentIntent, ApiError> {
    store::get_intent(&app.db, &principal.account_id, intent_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("payment intent `{intent_id}`")))
}

/// Capture an intent: the provider charges the amount (all of it, or less —
/// the rest is released). The answer is 202 with the capture in `processing`;
/// the charge goes to the provider through the outbox, with an idempotency key
/// derived from this operation's id, and the capture (and the operation
/// status) show how it ends. At or above the approval threshold, a human
/// approves this exact capture first.
#[utoipa::path(
    post,
    path = "/v1/payment_intents/{intent_id}/capture",
    tag = "payments",
    request_body = CaptureBody,
    params(
        ("intent_id" = String, Path),
        ("Idempotency-Key" = String, Header, description = "Made once per intended capture; the same on every retry"),
    ),
    responses(
        (status = 202, description = "Accepted: the capture, `processing`; or, at or above the threshold, the approval request", body = approvals::AcceptedOrAwaitingApproval<Capture>),
        (status = 400, description = "Invalid amount (more than the intent's, too many decimals…); nothing was claimed", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`invalid_state`: the intent is not in `requires_capture`; `approval_rejected`, `approval_expired` or `approval_stale`: a capture given to a human that will never run (its payee, amount and account cannot change, so it is stale only when the policy no longer gives it to a human as it did)", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 422, description = "`idempotency_key_reused`", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn capture_intent(
    State(app): State<App>,
    principal: Principal,
    key: IdempotencyHeaders,
    ApiPath(intent_id): ApiPath<String>,
    ApiJson(body): ApiJson<CaptureBody>,
) -> Response {
    let (intent, command) = match intent_named(&app, &principal, &intent_id).await.and_then(|intent| {
        let command = CaptureIntent::parse(&intent, body)?;
        Ok((intent, command))
    }) {
        Ok(parsed) => parsed,
        Err(invalid) => return invalid.into_response(),
    };
    let approval = app.policy.approval_for(&principal.account_id, &intent, &command);
    app.idempotency
        .execute(
            Attempt::post(CAPTURE_INTENT, &principal, key).approval(approval),
            &command,
            async |tx, operation| {
                let capture = store::begin_capture(tx, operation, &command).await?;
                let charge = ChargeOrder {
                    capture_id: capture.id.clone(),
                    amount_minor: capture.amount_minor,
                    currency: capture.currency.clone(),
                    payee_account: intent.payee.account.clone(),
                };
                Ok(Effect::json(StatusCode::ACCEPTED, &capture)
                    .with_resource("capture", &capture.id, capture.url())
                    .with_handoff(outbox::Event::new(provider::CAPTURE, &charge)))
            },
        )
        .await
}

/// Refund part or all of a captured payment. Each refund instruction is its
/// own operation with its own key: a second refund is a new key, never a
/// retry. The refunds of a capture never add up to more than it captured
/// (409 `refund_exceeds_captured`), which the database decides under races.
#[utoipa::path(
    post,
    path = "/v1/payment_intents/{intent_id}/refunds",
    tag = "payments",
    request_body = RefundBody,
    params(
        ("intent_id" = String, Path),
        ("Idempotency-Key" = String, Header, description = "Made once per refund instruction; the same on every retry"),
    ),
    responses(
        (status = 202, description = "Accepted: the refund, `processing`", body = Refund),
        (status = 400, description = "Invalid amount; nothing was claimed", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`refund_exceeds_captured`, or `invalid_state`: no succeeded capture", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 422, description = "`idempotency_key_reused`", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn refund_intent(
    State(app): State<App>,
    principal: Principal,
    key: IdempotencyHeaders,
    ApiPath(intent_id): ApiPath<String>,
    ApiJson(body): ApiJson<RefundBody>,
) -> Response {
    let command = match intent_named(&app, &principal, &intent_id)
        .await
        .and_then(|intent| RefundPayment::parse(&intent, body))
    {
        Ok(command) => command,
        Err(invalid) => return invalid.into_response(),
    };
    app.idempotency
        .execute(
            Attempt::post(REFUND_INTENT, &principal, key),
            &command,
            async |tx, operation| {
                let (refund, charge_id) = store::begin_refund(tx, operation, &command).await?;
                let order = RefundOrder {
                    refund_id: refund.id.clone(),
                    charge_id,
                    amount_minor: refund.amount_minor,
                };
                Ok(Effect::json(StatusCode::ACCEPTED, &refund)
                    .with_resource("refund", &refund.id, refund.url())
                    .with_handoff(outbox::Event::new(provider::REFUND, &order)))
            },
        )
        .await
}

#[utoipa::path(
    get,
    path = "/v1/captures/{capture_id}",
    tag = "payments",
    params(("capture_id" = String, Path)),
    responses(
        (status = 200, body = Capture),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_capture(
    State(app): State<App>,
    principal: Principal,
    ApiPath(capture_id): ApiPath<String>,
) -> Result<Json<Capture>, ApiError> {
    store::get_capture(&app.db, &principal.account_id, &capture_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("capture `{capture_id}`")))
}

/// An intent's captures: at most one.
#[utoipa::path(
    get,
    path = "/v1/payment_intents/{intent_id}/captures",
    tag = "payments",
    params(("intent_id" = String, Path), PageQuery),
    responses(
        (status = 200, body = Page<Capture>),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_captures(
    State(app): State<App>,
    principal: Principal,
    ApiPath(intent_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<Json<Page<Capture>>, ApiError> {
    let page = PageRequest::parse(query.limit, query.cursor.as_deref())?;
    let intent = intent_named(&app, &principal, &intent_id).await?;
    Ok(Json(
        store::list_captures(&app.db, &principal.account_id, &intent.id, page).await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/refunds/{refund_id}",
    tag = "payments",
    params(("refund_id" = String, Path)),
    responses(
        (status = 200, body = Refund),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_refund(
    State(app): State<App>,
    principal: Principal,
    ApiPath(refund_id): ApiPath<String>,
) -> Result<Json<Refund>, ApiError> {
    store::get_refund(&app.db, &principal.account_id, &refund_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("refund `{refund_id}`")))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// 1–200, default 50.
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// An intent's refunds, in creation order.
#[utoipa::path(
    get,
    path = "/v1/payment_intents/{intent_id}/refunds",
    tag = "payments",
    params(("intent_id" = String, Path), PageQuery),
    responses(
        (status = 200, body = Page<Refund>),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_refunds(
    State(app): State<App>,
    principal: Principal,
    ApiPath(intent_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<Json<Page<Refund>>, ApiError> {
    let page = PageRequest::parse(query.limit, query.cursor.as_deref())?;
    let intent = intent_named(&app, &principal, &intent_id).await?;
    Ok(Json(
        store::list_refunds(&app.db, &principal.account_id, &intent.id, page).await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/payment_intents/{intent_id}",
    tag = "payments",
    params(("intent_id" = String, Path)),
    responses(
        (status = 200, body = PaymentIntent),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_intent(
    State(app): State<App>,
    principal: Principal,
    ApiPath(intent_id): ApiPath<String>,
) -> Result<Json<PaymentIntent>, ApiError> {
    store::get_intent(&app.db, &principal.account_id, &intent_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("payment intent `{intent_id}`")))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct IntentQuery {
    pub order_id: Option<String>,
    /// 1–200, default 50.
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// The account's intents in creation order; `?order_id=` for one order's.
#[utoipa::path(
    get,
    path = "/v1/payment_intents",
    tag = "payments",
    params(IntentQuery),
    responses((status = 200, body = Page<PaymentIntent>)),
    security(("bearer" = []))
)]
pub async fn list_intents(
    State(app): State<App>,
    principal: Principal,
    ApiQuery(query): ApiQuery<IntentQuery>,
) -> Result<Json<Page<PaymentIntent>>, ApiError> {
    let page = PageRequest::parse(query.limit, query.cursor.as_deref())?;
    Ok(Json(
        store::list_intents(&app.db, &principal.account_id, query.order_id.as_deref(), page).await?,
    ))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(
        create_intent,
        cancel_intent,
        get_intent,
        list_intents,
        capture_intent,
        refund_intent,
        get_capture,
        list_captures,
        get_refund,
        list_refunds
    ),
    components(schemas(
        PaymentIntent,
        CreateIntentBody,
        Capture,
        CaptureBody,
        Refund,
        RefundBody,
        crate::domain::TransferState,
        crate::domain::PayeeBody,
        crate::domain::IntentState,
        crate::money::AmountText
    ))
)]
pub struct PaymentsApi;

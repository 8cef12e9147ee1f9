//! The payments API (CONTRACT §7 Payments). Each handler reads: authenticate,
//! parse into a validated command (amounts into minor units), hand the
//! command and its business write to the idempotency layer, answer what it
//! answers.

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
    domain::{CancelIntent, CreateIntent, CreateIntentBody, PaymentIntent},
    store,
};

pub const CREATE_INTENT: &str = "/v1/payment_intents";
pub const CANCEL_INTENT: &str = "/v1/payment_intents/{intent_id}/cancel";

pub fn router() -> Router<App> {
    Router::new()
        .route(CREATE_INTENT, post(create_intent).get(list_intents))
        .route("/v1/payment_intents/{intent_id}", get(get_intent))
        .route(CANCEL_INTENT, post(cancel_intent))
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
        .execute(Attempt::post(CREATE_INTENT, &principal, key), &command, async |tx| {
            let intent = store::create_intent(tx, &principal.account_id, &command).await?;
            let (id, url) = (intent.id.clone(), intent.url());
            Ok(Effect::json(StatusCode::CREATED, &intent).with_resource("payment_intent", &id, url))
        })
        .await
}

/// Cancel an intent before any capture; the order is free for a new intent.
/// A cancel declares the end state, so it needs no key (CONTRACT §1):
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
        .execute(Attempt::post(CANCEL_INTENT, &principal, key), &command, async |tx| {
            let intent = store::cancel_intent(tx, &principal.account_id, &command.intent_id).await?;
            let (id, url) = (intent.id.clone(), intent.url());
            Ok(Effect::json(StatusCode::OK, &intent).with_resource("payment_intent", &id, url))
        })
        .await
}

/// A cancel with no key: its own transaction, nothing stored for replay.
async fn cancel_without_key(
    app: &App,
    principal: &Principal,
    command: &CancelIntent,
) -> Result<PaymentIntent, ApiError> {
    let mut tx = app.db.begin().await?;
    let intent = store::cancel_intent(&mut tx, &principal.account_id, &command.intent_id).await?;
    tx.commit().await?;
    Ok(intent)
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
    let rows = store::list_intents(
        &app.db,
        &principal.account_id,
        query.order_id.as_deref(),
        page.after_seq,
        page.fetch_limit(),
    )
    .await?;
    Ok(Json(Page::from_rows(rows, page)))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(create_intent, cancel_intent, get_intent, list_intents),
    components(schemas(
        PaymentIntent,
        CreateIntentBody,
        crate::domain::PayeeBody,
        crate::domain::IntentState,
        crate::money::AmountText
    ))
)]
pub struct PaymentsApi;

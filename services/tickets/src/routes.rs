//! The tickets API (docs/contract.md §7 Tickets). Each handler reads:
//! authenticate, parse into a validated command, hand the command and its
//! business write to the idempotency layer, answer what it answers.
//!
//! Every POST has [the shape of a route](idempotency#how-a-route-is-shaped):
//! parse → read-only lookups → `execute` with a closure doing every write → answer.

use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    response::Response,
    routing::{get, post, put},
};
use idempotency::{Attempt, Effect, IdempotencyHeaders};
use platform::{
    ApiError, ApiJson, ApiPath, ApiQuery, Principal,
    page::{Page, PageRequest},
};
use serde::Deserialize;

use crate::{
    App,
    domain::{
        AddComment, AddCommentBody, Comment, CreateTicket, CreateTicketBody, SetStatusBody, Ticket, TicketCreated,
        TicketStatus, TicketStatusChanged,
    },
    store::{self, TicketFilter},
};

pub const CREATE_TICKET: &str = "/v1/tickets";
pub const ADD_COMMENT: &str = "/v1/tickets/{ticket_id}/comments";
pub const SET_STATUS: &str = "/v1/tickets/{ticket_id}/status";

pub fn router() -> Router<App> {
    Router::new()
        .route(CREATE_TICKET, post(create_ticket).get(list_tickets))
        .route("/v1/tickets/{ticket_id}", get(get_ticket))
        .route(ADD_COMMENT, post(add_comment).get(list_comments))
        .route("/v1/tickets/{ticket_id}/comments/{comment_id}", get(get_comment))
        .route(SET_STATUS, put(set_status))
}

/// Create a ticket — or, when its `source_event_id` already has one, answer
/// that ticket with 200 `matched_existing`.
#[utoipa::path(
    post,
    path = "/v1/tickets",
    tag = "tickets",
    request_body = CreateTicketBody,
    params(
        ("Idempotency-Key" = String, Header, description = "Made once per intended ticket; the same on every retry"),
        ("Prefer" = Option<String>, Header, description = "`wait=N` (N ≤ 10): a duplicate that finds the operation running waits for its answer"),
    ),
    responses(
        (status = 201, description = "Created (`outcome: created`); `Idempotent-Replayed: true` on a replay", body = TicketCreated),
        (status = 200, description = "The ticket its source event already has (`outcome: matched_existing`)", body = TicketCreated),
        (status = 202, description = "The tickets policy wants a human first: the approval request. Retry with the same key once approved", body = approvals::ApprovalRequested),
        (status = 400, description = "Invalid body or key; nothing was claimed", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`request_in_progress`: an attempt with this key is running; `approval_rejected`, `approval_expired` or `approval_stale` (the policy no longer gives the request to a human as it did): an operation given to a human that will never run", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 422, description = "`idempotency_key_reused`: the key names a different request", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn create_ticket(
    State(app): State<App>,
    principal: Principal,
    key: IdempotencyHeaders,
    ApiJson(body): ApiJson<CreateTicketBody>,
) -> Response {
    create(&app, &principal, key, CreateTicket::from(body)).await
}

/// The create itself, below HTTP: what the handler runs once the request is
/// parsed (and what the benchmark runs with no HTTP at all).
pub async fn create(app: &App, principal: &Principal, key: IdempotencyHeaders, command: CreateTicket) -> Response {
    app.idempotency
        .execute(
            Attempt::post(CREATE_TICKET, principal, key).approval(app.policy.approval_for(&command)),
            &command,
            async |tx, _| {
                let (ticket, outcome) = store::create_ticket(tx, &principal.account_id, &command).await?;
                let (id, url) = (ticket.id.clone(), ticket.url());
                Ok(
                    Effect::json(outcome.status(), &TicketCreated { ticket, outcome })
                        .with_resource("ticket", &id, url),
                )
            },
        )
        .await
}

#[utoipa::path(
    get,
    path = "/v1/tickets/{ticket_id}",
    tag = "tickets",
    params(("ticket_id" = String, Path)),
    responses(
        (status = 200, body = Ticket),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_ticket(
    State(app): State<App>,
    principal: Principal,
    ApiPath(ticket_id): ApiPath<String>,
) -> Result<Json<Ticket>, ApiError> {
    store::get_ticket(&app.db, &principal.account_id, &ticket_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("ticket `{ticket_id}`")))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TicketQuery {
    pub project: Option<String>,
    pub source_event_id: Option<String>,
    pub status: Option<TicketStatus>,
    /// 1–200, default 50.
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// List the account's tickets in creation order.
#[utoipa::path(
    get,
    path = "/v1/tickets",
    tag = "tickets",
    params(TicketQuery),
    responses((status = 200, body = Page<Ticket>)),
    security(("bearer" = []))
)]
pub async fn list_tickets(
    State(app): State<App>,
    principal: Principal,
    ApiQuery(query): ApiQuery<TicketQuery>,
) -> Result<Json<Page<Ticket>>, ApiError> {
    let page = PageRequest::parse(query.limit, query.cursor.as_deref())?;
    let filter = TicketFilter {
        project: query.project.as_deref(),
        source_event_id: query.source_event_id.as_deref(),
        status: query.status,
    };
    Ok(Json(
        store::list_tickets(&app.db, &principal.account_id, &filter, page).await?,
    ))
}

/// Add a comment: every comment is its own operation, with its own key.
#[utoipa::path(
    post,
    path = "/v1/tickets/{ticket_id}/comments",
    tag = "tickets",
    request_body = AddCommentBody,
    params(
        ("ticket_id" = String, Path),
        ("Idempotency-Key" = String, Header, description = "Made once per intended comment"),
    ),
    responses(
        (status = 201, body = Comment),
        (status = 404, description = "No such ticket (stored and replayed like any answer)", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn add_comment(
    State(app): State<App>,
    principal: Principal,
    key: IdempotencyHeaders,
    ApiPath(ticket_id): ApiPath<String>,
    ApiJson(body): ApiJson<AddCommentBody>,
) -> Response {
    let command = AddComment {
        ticket_id,
        body: body.body,
    };
    app.idempotency
        .execute(Attempt::post(ADD_COMMENT, &principal, key), &command, async |tx, _| {
            let comment = store::add_comment(tx, &principal.account_id, &principal.principal_id, &command).await?;
            let (id, url) = (comment.id.clone(), comment.url());
            Ok(Effect::json(StatusCode::CREATED, &comment).with_resource("comment", &id, url))
        })
        .await
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

#[utoipa::path(
    get,
    path = "/v1/tickets/{ticket_id}/comments",
    tag = "tickets",
    params(("ticket_id" = String, Path), PageQuery),
    responses((status = 200, body = Page<Comment>), (status = 404, body = platform::error::Problem, content_type = "application/problem+json")),
    security(("bearer" = []))
)]
pub async fn list_comments(
    State(app): State<App>,
    principal: Principal,
    ApiPath(ticket_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<Json<Page<Comment>>, ApiError> {
    let page = PageRequest::parse(query.limit, query.cursor.as_deref())?;
    if store::get_ticket(&app.db, &principal.account_id, &ticket_id)
        .await?
        .is_none()
    {
        return Err(ApiError::not_found(format!("ticket `{ticket_id}`")));
    }
    Ok(Json(
        store::list_comments(&app.db, &principal.account_id, &ticket_id, page).await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/tickets/{ticket_id}/comments/{comment_id}",
    tag = "tickets",
    params(("ticket_id" = String, Path), ("comment_id" = String, Path)),
    responses((status = 200, body = Comment), (status = 404, body = platform::error::Problem, content_type = "application/problem+json")),
    security(("bearer" = []))
)]
pub async fn get_comment(
    State(app): State<App>,
    principal: Principal,
    ApiPath((ticket_id, comment_id)): ApiPath<(String, String)>,
) -> Result<Json<Comment>, ApiError> {
    store::get_comment(&app.db, &principal.account_id, &ticket_id, &comment_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("comment `{comment_id}`")))
}

/// Declare the ticket's status. Idempotent by its nature: asking for the
/// status the ticket already has is a no-op (200, `changed: false`), so this
/// PUT needs no key. `closed` is final. A change is journaled
/// (`state_changed`, with the new status); a no-op journals nothing.
#[utoipa::path(
    put,
    path = "/v1/tickets/{ticket_id}/status",
    tag = "tickets",
    request_body = SetStatusBody,
    params(("ticket_id" = String, Path)),
    responses(
        (status = 200, body = TicketStatusChanged),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`version_mismatch` (stale `expected_version`) or `invalid_state` (closed: `ticket_status` names it)", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn set_status(
    State(app): State<App>,
    principal: Principal,
    ApiPath(ticket_id): ApiPath<String>,
    ApiJson(body): ApiJson<SetStatusBody>,
) -> Result<Json<TicketStatusChanged>, ApiError> {
    let mut tx = app.db.begin().await?;
    let (ticket, changed) = store::set_status(
        &mut tx,
        &principal.account_id,
        &ticket_id,
        body.status,
        body.expected_version,
    )
    .await?;
    if changed {
        let change = journal::StateChange::new("ticket", &ticket.id, ticket.status.as_str());
        journal::record_state_change(&mut tx, &principal, SET_STATUS, change).await?;
    }
    tx.commit().await?;
    Ok(Json(TicketStatusChanged { ticket, changed }))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    info(description = "Tickets that an agent can create, comment on and resolve, retrying safely."),
    paths(
        create_ticket,
        get_ticket,
        list_tickets,
        add_comment,
        list_comments,
        get_comment,
        set_status
    ),
    components(schemas(platform::error::Problem, platform::FieldError))
)]
pub struct TicketsApi;

//! The smallest app that takes the `idempotency` crate: `POST /v1/notes`
//! makes a note, and a retry of it never makes a second one; the operation
//! status route tells a caller that timed out what became of its request.
//! docs/adopt.md walks through it, step by step.

use axum::{
    Json, Router,
    extract::{FromRef, State},
    http::StatusCode,
    response::Response,
    routing::{get, post},
};
use idempotency::{
    Attempt, Effect, Idempotency, IdempotencyHeaders,
    platform::{self, ApiError, ApiJson, ApiPath, Authenticator, Db, Migrations, Principal, on_pool, on_tx},
    routes::{find_operation_by_key, get_operation},
};
use serde::{Deserialize, Serialize};
use validator::Validate;

/// The notes table. Its SQL reads alike on both backends, so one directory serves both.
pub static MIGRATIONS: Migrations = Migrations {
    postgres: sqlx::migrate!("./migrations"),
    sqlite: sqlx::migrate!("./migrations"),
};

/// The route's template: part of what the fingerprint hashes.
pub const CREATE_NOTE: &str = "/v1/notes";

/// What a handler needs; each field is its own extractor's state.
#[derive(Clone, FromRef)]
pub struct App {
    pub idempotency: Idempotency,
    pub auth: Authenticator,
}

/// The request, validated: what the fingerprint hashes. A body that fails to
/// parse is a 400 that claims nothing, so the same key may come back fixed.
#[derive(Debug, Deserialize, Serialize, Validate)]
#[serde(deny_unknown_fields)]
pub struct CreateNote {
    #[validate(length(min = 1, max = 2000, message = "1 to 2000 characters"))]
    pub text: String,
}

/// A note, as the route answers it and the table holds it.
#[derive(Debug, Serialize, sqlx::FromRow)]
pub struct Note {
    pub id: String,
    pub text: String,
}

/// Applies the API keys', the operations' and the notes' tables, as one list.
pub async fn migrate(db: &Db) -> Result<(), sqlx::migrate::MigrateError> {
    db.migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS, &MIGRATIONS])
        .await
}

/// The notes, and the status of the operations that made them.
pub fn router(app: App) -> Router {
    Router::new()
        .route(CREATE_NOTE, post(create_note))
        .route("/v1/notes/{note_id}", get(get_note))
        .route("/v1/operations", get(find_operation_by_key))
        .route("/v1/operations/{operation_id}", get(get_operation))
        .with_state(app)
}

/// Parse, then hand the command and its one write to `execute`, which claims
/// the key, runs the closure once, stores its answer and replays it.
async fn create_note(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    key: IdempotencyHeaders,
    ApiJson(command): ApiJson<CreateNote>,
) -> Response {
    idempotency
        .execute(
            Attempt::post(CREATE_NOTE, &principal, key),
            &command,
            async |tx, operation| {
                let note = Note {
                    id: format!("note_{}", uuid::Uuid::now_v7().simple()),
                    text: command.text.clone(),
                };
                // the transaction that also stores the answer: both commit, or neither
                on_tx!(tx, |conn| {
                    sqlx::query("INSERT INTO notes (id, account_id, text, operation_id) VALUES ($1, $2, $3, $4)")
                        .bind(&note.id)
                        .bind(&principal.account_id)
                        .bind(&note.text)
                        .bind(operation.operation_id)
                        .execute(conn)
                        .await?;
                });
                let url = format!("/v1/notes/{}", note.id);
                Ok(Effect::json(StatusCode::CREATED, &note).with_resource("note", &note.id, url))
            },
        )
        .await
}

async fn get_note(
    State(idempotency): State<Idempotency>,
    principal: Principal,
    ApiPath(note_id): ApiPath<String>,
) -> Result<Json<Note>, ApiError> {
    let note: Option<Note> = on_pool!(idempotency.db().read(), |pool| {
        sqlx::query_as("SELECT id, text FROM notes WHERE account_id = $1 AND id = $2")
            .bind(&principal.account_id)
            .bind(&note_id)
            .fetch_optional(pool)
            .await?
    });
    note.map(Json)
        .ok_or_else(|| ApiError::not_found(format!("note `{note_id}`")))
}

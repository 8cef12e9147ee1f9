//! The one error type of every service, rendered as `application/problem+json`
//! (RFC 9457) with the contract's stable `code` (docs/contract.md §11).
//!
//! Internal causes never reach a body: they ride to the logging middleware in
//! the response's extensions (see [`InternalCause`]), and the client sees a
//! bare 500.

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use problem_details::ProblemDetails;
use serde::Serialize;
use serde_json::{Map, Value, json};

pub const PROBLEM_JSON: &str = "application/problem+json";

/// One field that failed validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A problem+json answer with the contract's `code`. Boxed: errors travel in
/// every `Result` of a handler, and the happy path should not carry their size.
#[derive(Debug, Clone)]
pub struct ApiError(Box<ProblemParts>);

#[derive(Debug, Clone)]
struct ProblemParts {
    status: StatusCode,
    code: &'static str,
    title: &'static str,
    detail: String,
    /// The `{field, message}` list of a 400 `invalid_request`.
    errors: Option<Vec<FieldError>>,
    extensions: Map<String, Value>,
    retry_after: Option<u64>,
    /// The `WWW-Authenticate` challenge of a 401 (RFC 6750 §3).
    challenge: Option<&'static str>,
    /// Whether it says the database was unavailable: see [`DatabaseUnavailable`].
    database_unavailable: bool,
    internal_cause: Option<String>,
}

/// The cause of a 500, handed to the logging middleware, never to the client.
#[derive(Debug, Clone)]
pub struct InternalCause(pub String);

/// Marks an answer that says the database was unavailable, so that the
/// service's router counts the outage ([`crate::db::Outages`]) however deep
/// in a handler the error arose.
#[derive(Debug, Clone, Copy)]
pub struct DatabaseUnavailable;

/// The shape of every error body, for the OpenAPI document.
#[derive(Serialize, utoipa::ToSchema)]
#[allow(dead_code)]
pub struct Problem {
    /// A URI reference naming the problem type; it is a page of this service's docs.
    #[schema(example = "/docs/problems/idempotency_key_reused")]
    r#type: String,
    title: String,
    status: u16,
    detail: String,
    /// The stable machine-readable name of the problem (docs/contract.md §11).
    #[schema(example = "idempotency_key_reused")]
    code: String,
    /// Present on 400 `invalid_request`: every field that failed and why.
    errors: Option<Vec<FieldError>>,
    /// Present on problems about an operation.
    operation_id: Option<String>,
    state: Option<String>,
    status_url: Option<String>,
    /// Present on a 409 about a ticket's state: the ticket's status (never
    /// `status`, which is the HTTP status).
    ticket_status: Option<String>,
}

/// The members every problem has (RFC 9457's and the contract's `code` and
/// `errors`): an extension member by one of these names would make the body
/// name a member twice.
const RESERVED_MEMBERS: &[&str] = &["type", "title", "status", "detail", "instance", "code", "errors"];

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        ApiError(Box::new(ProblemParts {
            status,
            code,
            title,
            detail: detail.into(),
            errors: None,
            extensions: Map::new(),
            retry_after: None,
            challenge: None,
            database_unavailable: false,
            internal_cause: None,
        }))
    }

    /// Adds a contract-named extra member (`operation_id`, `state`, …). A
    /// member is added once, and never under a name every problem already
    /// has: a body never names a member twice.
    pub fn with(mut self, member: &str, value: impl Serialize) -> Self {
        debug_assert!(
            !RESERVED_MEMBERS.contains(&member),
            "`{member}` is a member of every problem, not an extension"
        );
        debug_assert!(
            !self.0.extensions.contains_key(member),
            "the extension `{member}` is added twice"
        );
        self.0
            .extensions
            .insert(member.to_owned(), serde_json::to_value(value).unwrap_or(Value::Null));
        self
    }

    /// Replaces the human-readable `detail`.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.0.detail = detail.into();
        self
    }

    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.0.retry_after = Some(seconds);
        self
    }

    pub fn status(&self) -> StatusCode {
        self.0.status
    }

    pub fn code(&self) -> &'static str {
        self.0.code
    }

    pub fn detail(&self) -> &str {
        &self.0.detail
    }

    pub fn extension(&self, member: &str) -> Option<&Value> {
        self.0.extensions.get(member)
    }

    pub fn retry_after(&self) -> Option<u64> {
        self.0.retry_after
    }

    /// A known, final business outcome (a 4xx): stored with its operation and
    /// replayed to every retry. A 5xx is not an outcome: it frees the claim.
    /// Neither is a problem that asks to be retried (408, 429, or any with
    /// `Retry-After`): storing it would refuse every retry it invites.
    pub fn is_final(&self) -> bool {
        self.0.status.is_client_error()
            && !matches!(
                self.0.status,
                StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS
            )
            && self.0.retry_after.is_none()
    }

    // --- the contract's problems, by code ---

    /// No key was sent: the 401 asks for one (`WWW-Authenticate: Bearer`).
    pub fn unauthenticated() -> Self {
        let mut error = Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "Authentication required",
            "send `Authorization: Bearer <api key>` with a valid key",
        );
        error.0.challenge = Some("Bearer");
        error
    }

    /// A key was sent that the service does not know (or that was revoked):
    /// the same 401, whose challenge says the key is what failed (RFC 6750).
    pub fn unknown_key() -> Self {
        let mut error = Self::unauthenticated().with_detail(
            "the `Authorization: Bearer` key is not one this service knows (or it was revoked); send a valid key",
        );
        error.0.challenge = Some(r#"Bearer error="invalid_token""#);
        error
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "Not allowed", detail)
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "Not found",
            format!("{} was not found", what.into()),
        )
    }

    pub fn invalid_request(detail: impl Into<String>, errors: Vec<FieldError>) -> Self {
        let mut error = Self::new(StatusCode::BAD_REQUEST, "invalid_request", "Invalid request", detail);
        error.0.errors = Some(errors);
        error
    }

    pub fn invalid_field(field: impl Into<String>, message: impl Into<String>) -> Self {
        let error = FieldError::new(field, message);
        Self::invalid_request(format!("`{}` {}", error.field, error.message), vec![error])
    }

    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Unsupported media type",
            "send the body as JSON with `Content-Type: application/json`",
        )
    }

    /// The body did not arrive in time. Not final: nothing was claimed, and
    /// the same request may be sent again with the same key.
    pub fn request_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            "Request timeout",
            "the request body did not arrive in time; nothing was claimed, send it again with the same key",
        )
    }

    /// The process holds as many connections as it may (docs/contract.md
    /// §14): answered before the request is read, so nothing was claimed.
    pub fn too_many_connections() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_connections",
            "Too many connections",
            "the server holds as many connections as it may; nothing of this request was read: send it again after `Retry-After` seconds",
        )
    }

    pub fn idempotency_key_missing() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "idempotency_key_missing",
            "Idempotency-Key required",
            "this request creates an effect: send an `Idempotency-Key` header, made once per intended action",
        )
    }

    pub fn idempotency_key_invalid(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "idempotency_key_invalid",
            "Invalid Idempotency-Key",
            detail,
        )
    }

    pub fn invalid_state(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "invalid_state",
            "Not allowed in the current state",
            detail,
        )
    }

    pub fn version_mismatch(expected: i64, current: i64) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "version_mismatch",
            "Version mismatch",
            format!("expected version {expected}, but the current version is {current}"),
        )
        .with("current_version", current)
    }

    /// The database cannot be reached, or the connection died under a
    /// statement — perhaps under the COMMIT, whose outcome is then unknown
    /// here (docs/contract.md §5). So the detail never says "nothing
    /// happened": the retry with the same key finds out. The cause is logged.
    pub fn database_unavailable(cause: impl std::fmt::Display) -> Self {
        let mut error = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            "Database unavailable",
            "the service cannot reach its database, so whether this request took effect is not known here: \
             send it again with the same key after `Retry-After` seconds, and that attempt finds out",
        )
        .with_retry_after(1);
        error.0.database_unavailable = true;
        error.0.internal_cause = Some(cause.to_string());
        error
    }

    /// No connection to the database came free within the pool's wait
    /// (docs/contract.md §5). From here a database that refuses connections
    /// (the pool tries again until its wait ends) and one whose every
    /// connection is busy look the same, so the detail names both. The
    /// attempt may have claimed its key before it waited: the retry with the
    /// same key finds out, as after any `database_unavailable`.
    pub fn no_database_connection() -> Self {
        Self::database_unavailable("no connection came free within the pool's wait").with_detail(
            "no connection to the database came free in time: it is unreachable, or busy with every connection \
             this service may hold. Whether this request took effect is not known here: send it again with the \
             same key after `Retry-After` seconds, and that attempt finds out",
        )
    }

    /// A 500 whose cause is logged, never sent.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        let mut error = Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "Internal error",
            "the server failed; nothing was committed, and the same request may be retried with the same key",
        );
        error.0.internal_cause = Some(cause.to_string());
        error
    }

    /// The body, exactly as it is sent (and, for a final failure, stored).
    pub fn to_problem_json(&self) -> Vec<u8> {
        let problem = ProblemDetails::new()
            .with_type(
                format!("/docs/problems/{}", self.0.code)
                    .parse::<axum::http::Uri>()
                    .unwrap_or_default(),
            )
            .with_title(self.0.title)
            .with_status(self.0.status)
            .with_detail(self.0.detail.clone())
            .with_extensions({
                let mut members = Map::new();
                members.insert("code".into(), json!(self.0.code));
                if let Some(errors) = &self.0.errors {
                    members.insert("errors".into(), json!(errors));
                }
                // a reserved name slipped past `with` in a release build is
                // left out rather than sent as a second member
                members.extend(
                    self.0
                        .extensions
                        .iter()
                        .filter(|(name, _)| !RESERVED_MEMBERS.contains(&name.as_str()))
                        .map(|(name, value)| (name.clone(), value.clone())),
                );
                members
            });
        serde_json::to_vec(&problem).unwrap_or_default()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.0.status.as_u16(), self.0.code, self.0.detail)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.0.status,
            [(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))],
            self.to_problem_json(),
        )
            .into_response();
        if let Some(seconds) = self.0.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(challenge) = self.0.challenge {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
        }
        if self.0.database_unavailable {
            response.extensions_mut().insert(DatabaseUnavailable);
        }
        if let Some(cause) = self.0.internal_cause {
            response.extensions_mut().insert(InternalCause(cause));
        }
        response
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> Self {
        if database_unreachable(&error) {
            ApiError::database_unavailable(error)
        } else if matches!(error, sqlx::Error::PoolTimedOut) {
            ApiError::no_database_connection()
        } else {
            ApiError::internal(format!("database: {error}"))
        }
    }
}

/// Whether an error says the database could not be reached or lost the
/// connection — a fault of where the database is, not of the request — rather
/// than refusing the statement. A server that takes no writes (a standby, a
/// primary demoted in a failover) counts: a retry finds the new primary. A
/// pool's timeout does not: it says no connection came free, which a busy
/// database says too (see [`ApiError::no_database_connection`]).
pub fn database_unreachable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(e) => e.code().is_some_and(|code| {
            // 08: connection exception; 57P01–57P03: the server shuts down or
            // is not taking connections yet; 25006: a read-only transaction
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03" | "25006")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_are_final_but_those_that_ask_for_a_retry_are_not() {
        assert!(ApiError::invalid_state("closed").is_final());
        assert!(ApiError::not_found("ticket").is_final());
        assert!(!ApiError::internal("boom").is_final());
        assert!(!ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "Slow down", "later").is_final());
        assert!(!ApiError::invalid_state("busy").with_retry_after(2).is_final());
    }

    #[test]
    fn an_internal_error_never_shows_its_cause() {
        let body = String::from_utf8(ApiError::internal("password=hunter2 at db.rs:12").to_problem_json()).unwrap();
        assert!(!body.contains("hunter2"));
        assert!(body.contains("\"code\":\"internal_error\""));
    }

    #[test]
    fn a_pool_timeout_is_503_database_unavailable_that_names_a_busy_database_as_well_as_a_gone_one() {
        let timeout = ApiError::from(sqlx::Error::PoolTimedOut);
        assert_eq!(timeout.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(timeout.code(), "database_unavailable");
        assert_eq!(timeout.retry_after(), Some(1));
        assert!(
            timeout.detail().contains("unreachable, or busy"),
            "{}",
            timeout.detail()
        );
        assert!(timeout.detail().contains("same key"), "{}", timeout.detail());

        let gone = ApiError::from(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()));
        assert_eq!(gone.code(), "database_unavailable");
        assert!(gone.detail().contains("cannot reach its database"), "{}", gone.detail());
        assert!(!database_unreachable(&sqlx::Error::PoolTimedOut));
    }

    #[test]
    fn a_problem_names_each_member_once() {
        let problem = ApiError::invalid_field("title", "is required").with("operation_id", "op_1");
        let body: Map<String, Value> = serde_json::from_slice(&problem.to_problem_json()).unwrap();
        let mut names: Vec<_> = body.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["code", "detail", "errors", "operation_id", "status", "title", "type"]
        );
        let text = String::from_utf8(problem.to_problem_json()).unwrap();
        for name in names {
            assert_eq!(text.matches(&format!("\"{name}\":")).count(), 1, "`{name}` once");
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "not an extension")]
    fn an_extension_may_not_reuse_a_member_every_problem_has() {
        let _ = ApiError::invalid_state("closed").with("status", "closed");
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "added twice")]
    fn an_extension_may_not_be_added_twice() {
        let _ = ApiError::invalid_state("busy")
            .with("state", "running")
            .with("state", "unknown");
    }
}

//! Request input: JSON bodies (`Content-Type` checked, 415), query strings and
//! path parameters — unknown fields named, every validation failure listed as
//! `{field, message}` (CONTRACT §1), and every rejection in problem+json.
//!
//! Extraction happens before anything is claimed, so input that fails here
//! leaves the idempotency key unused.

use axum::{
    body::Bytes,
    extract::{FromRequest, FromRequestParts, Path, Request},
    http::{StatusCode, header, request::Parts},
};
use serde::de::DeserializeOwned;
use serde_json::Value;
use validator::{Validate, ValidationErrors, ValidationErrorsKind};

use crate::error::{ApiError, FieldError};

/// The largest body a service reads; a larger one is 413 `payload_too_large`.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A JSON object body, deserialized with unknown fields rejected and then validated.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned + Validate,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(&request) {
            return Err(ApiError::unsupported_media_type());
        }
        let bytes = Bytes::from_request(request, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "Body too large",
                    format!("the body may be at most {MAX_BODY_BYTES} bytes"),
                )
            } else {
                ApiError::invalid_request("the body could not be read", vec![])
            }
        })?;
        let value = parse_json::<T>(&bytes)?;
        value.validate().map_err(validation_problem)?;
        Ok(ApiJson(value))
    }
}

fn is_json(request: &Request) -> bool {
    let Some(content_type) = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Parses `bytes` as a JSON object and deserializes it, naming the field any
/// failure is about. NUL characters are refused everywhere: PostgreSQL cannot
/// store them in text, and the two backends must answer alike.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::invalid_request(
            format!("the body is not valid JSON (line {}, column {})", e.line(), e.column()),
            vec![],
        )
    })?;
    if !value.is_object() {
        return Err(ApiError::invalid_request("the body must be a JSON object", vec![]));
    }
    if let Some(field) = first_nul(&value, "") {
        return Err(ApiError::invalid_field(field, "must not contain the NUL character"));
    }
    serde_path_to_error::deserialize(value).map_err(|e| field_problem(&e.path().to_string(), &e.inner().to_string()))
}

fn first_nul(value: &Value, path: &str) -> Option<String> {
    let join = |name: &str| {
        if path.is_empty() {
            name.to_owned()
        } else {
            format!("{path}.{name}")
        }
    };
    match value {
        Value::String(text) if text.contains('\0') => Some(if path.is_empty() { "body".into() } else { path.into() }),
        Value::Object(members) => members.iter().find_map(|(name, member)| {
            if name.contains('\0') {
                Some(join(name))
            } else {
                first_nul(member, &join(name))
            }
        }),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| first_nul(item, &format!("{path}[{i}]"))),
        _ => None,
    }
}

/// Turns serde's `path` and message into the contract's `{field, message}`.
fn field_problem(path: &str, message: &str) -> ApiError {
    let message = without_position(message);
    let parent = if path == "." { "" } else { path };
    let join = |name: String| {
        if parent.is_empty() {
            name
        } else {
            format!("{parent}.{name}")
        }
    };
    // serde names the field of these two errors only inside its message; its
    // path ends at the unknown field itself, but at the parent of a missing one
    let (field, message) = match quoted_name(&message) {
        Some(name) if message.starts_with("missing field") => (join(name), "is required".to_owned()),
        Some(name) if message.starts_with("unknown field") => (
            if parent.is_empty() { name } else { parent.to_owned() },
            "is not a field of this request".to_owned(),
        ),
        _ if parent.is_empty() => ("body".to_owned(), message),
        _ => (parent.to_owned(), message),
    };
    ApiError::invalid_field(field, message)
}

fn quoted_name(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_owned())
}

fn without_position(message: &str) -> String {
    match message.find(" at line ") {
        Some(at) => message[..at].to_owned(),
        None => message.to_owned(),
    }
}

/// Every failed rule of a `validator` report, flattened to `{field, message}`.
pub fn validation_problem(errors: ValidationErrors) -> ApiError {
    let mut fields = Vec::new();
    collect(&errors, "", &mut fields);
    fields.sort_by(|a, b| a.field.cmp(&b.field));
    let detail = match fields.as_slice() {
        [one] => format!("`{}` {}", one.field, one.message),
        _ => format!("{} fields failed validation", fields.len()),
    };
    ApiError::invalid_request(detail, fields)
}

fn collect(errors: &ValidationErrors, prefix: &str, out: &mut Vec<FieldError>) {
    for (field, kind) in errors.errors() {
        let name = if prefix.is_empty() {
            field.to_string()
        } else {
            format!("{prefix}.{field}")
        };
        match kind {
            ValidationErrorsKind::Field(list) => {
                for error in list {
                    let message = error
                        .message
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_else(|| error.code.to_string());
                    out.push(FieldError::new(name.clone(), message));
                }
            }
            ValidationErrorsKind::Struct(inner) => collect(inner, &name, out),
            ValidationErrorsKind::List(items) => {
                for (index, inner) in items {
                    collect(inner, &format!("{name}[{index}]"), out);
                }
            }
        }
    }
}

/// Query parameters, with unknown parameters and bad values answered as 400
/// `invalid_request` naming the parameter.
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        let pairs = form_urlencoded::parse(query.as_bytes());
        if let Some((name, _)) = pairs
            .clone()
            .find(|(name, value)| name.contains('\0') || value.contains('\0'))
        {
            return Err(ApiError::invalid_field(
                name.into_owned(),
                "must not contain the NUL character",
            ));
        }
        serde_path_to_error::deserialize(serde_urlencoded::Deserializer::new(pairs))
            .map(ApiQuery)
            .map_err(|e| field_problem(&e.path().to_string(), &e.inner().to_string()))
    }
}

/// Path parameters. An id that cannot name anything (not UTF-8, or holding a
/// NUL) is 404 like any id that names nothing, never a database error.
#[derive(Debug, Clone)]
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        if parts.uri.path().to_ascii_lowercase().contains("%00") {
            return Err(ApiError::not_found("this resource"));
        }
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| ApiPath(value))
            .map_err(|_| ApiError::not_found("this resource"))
    }
}

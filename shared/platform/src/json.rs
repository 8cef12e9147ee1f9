//! JSON request bodies: `Content-Type` checked (415), unknown fields named,
//! every validation failure listed as `{field, message}` (CONTRACT §1).
//!
//! Extraction happens before anything is claimed, so a body that fails here
//! leaves the idempotency key unused.

use axum::{
    body::Bytes,
    extract::{FromRequest, Request},
    http::header,
};
use serde::de::DeserializeOwned;
use validator::{Validate, ValidationErrors, ValidationErrorsKind};

use crate::error::{ApiError, FieldError};

/// The largest body a service reads.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A JSON body, deserialized with unknown fields rejected and then validated.
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
        let bytes = Bytes::from_request(request, state).await.map_err(|_| {
            ApiError::invalid_request(
                format!("the body could not be read (at most {MAX_BODY_BYTES} bytes)"),
                vec![],
            )
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

/// Deserializes `bytes`, turning serde's message into the field it is about.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let not_json = |inner: &serde_json::Error| {
        ApiError::invalid_request(
            format!(
                "the body is not valid JSON (line {}, column {})",
                inner.line(),
                inner.column()
            ),
            vec![],
        )
    };
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let inner = error.inner();
        if inner.is_syntax() || inner.is_eof() || inner.is_io() {
            return not_json(inner);
        }
        let message = without_position(&inner.to_string());
        let path = error.path().to_string();
        let parent = if path == "." { String::new() } else { path };
        // serde names the field of these two errors only inside its message
        // serde's path ends at the unknown field itself, but at the parent of a missing one
        let field = match quoted_name(&message) {
            Some(name) if message.starts_with("missing field") => {
                if parent.is_empty() {
                    name
                } else {
                    format!("{parent}.{name}")
                }
            }
            Some(name) if message.starts_with("unknown field") && parent.is_empty() => name,
            _ if parent.is_empty() => "body".to_owned(),
            _ => parent,
        };
        let message = if message.starts_with("unknown field") {
            "is not a field of this request".to_owned()
        } else if message.starts_with("missing field") {
            "is required".to_owned()
        } else {
            message
        };
        ApiError::invalid_field(field, message)
    })?;
    deserializer.end().map_err(|e| not_json(&e))?;
    Ok(value)
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
/// `invalid_request` in problem+json.
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|axum::extract::Query(value)| ApiQuery(value))
            .map_err(|e| ApiError::invalid_request(e.body_text(), vec![]))
    }
}

//! Request input: JSON bodies (`Content-Type` checked, 415), query strings and
//! path parameters — unknown fields named, every validation failure listed as
//! `{field, message}` (docs/contract.md §1), and every rejection in
//! problem+json.
//!
//! Extraction happens before anything is claimed, so input that fails here
//! leaves the idempotency key unused.

use axum::{
    body::Bytes,
    extract::{FromRequest, FromRequestParts, Path, Request},
    http::{StatusCode, header, request::Parts},
};
use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
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
            } else if is_late(&rejection) {
                ApiError::request_timeout()
            } else {
                ApiError::invalid_request("the body could not be read", vec![])
            }
        })?;
        parse_body(&bytes).map(ApiJson)
    }
}

/// A body as a service reads it once it holds the bytes: parsed with unknown
/// fields refused, then validated. Whoever checks input before sending it
/// (the MCP server) refuses exactly what the service would.
pub fn parse_body<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<T, ApiError> {
    let value = parse_json::<T>(bytes)?;
    value.validate().map_err(validation_problem)?;
    Ok(value)
}

/// Whether the body failed to read because it missed the server's deadline
/// (see [`crate::serve`]).
fn is_late(rejection: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(rejection);
    while let Some(error) = cause {
        if error.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// `application/json` (or `application/…+json`), in UTF-8: JSON has no other
/// encoding (RFC 8259), so a body declared in another charset is refused
/// rather than misread.
fn is_json(request: &Request) -> bool {
    let Some(content_type) = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let mut parts = content_type.split(';');
    let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let json = essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"));
    json && parts.all(|parameter| match parameter.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    })
}

/// Parses `bytes` as a JSON object and deserializes it, naming the field any
/// failure is about. NUL characters are refused everywhere: PostgreSQL cannot
/// store them in text, and the two backends must answer alike.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut value = parse_unambiguous(bytes)?;
    if !value.is_object() {
        return Err(ApiError::invalid_request("the body must be a JSON object", vec![]));
    }
    if let Some(field) = first_nul(&value, "") {
        return Err(ApiError::invalid_field(field, "must not contain the NUL character"));
    }
    integral_numbers_as_integers(&mut value);
    // the value is moved into the command, its strings with it; only a body
    // that fails is read again, to list every failure
    serde_path_to_error::deserialize(value).map_err(|first| {
        let mut body = parse_unambiguous(bytes).unwrap_or_default();
        integral_numbers_as_integers(&mut body);
        every_member_problem::<T>(&body, &first)
    })
}

/// serde stops at the first failure; a person fixing a body wants them all.
/// So each member is read again alone: a failure inside it (or it being
/// unknown) is its own, while one about the body as a whole (what it lacks
/// alone) is not. Then the valid members are read together, for the first
/// required member that is missing. The first failure is always listed.
fn every_member_problem<T: DeserializeOwned>(body: &Value, first: &PathError) -> ApiError {
    let mut errors = vec![field_error(first)];
    let Value::Object(members) = body else {
        return field_problems(errors);
    };
    let read = |members: &mut dyn Iterator<Item = (&String, &Value)>| {
        let members = members.map(|(name, member)| (name.as_str(), member));
        let members = de::value::MapDeserializer::<_, serde_json::Error>::new(members);
        serde_path_to_error::deserialize::<_, T>(members).err()
    };
    let mut add = |error: &PathError| {
        let error = field_error(error);
        if !errors.iter().any(|listed| listed.field == error.field) {
            errors.push(error);
        }
    };
    let mut invalid = Vec::new();
    for member in members {
        if let Some(error) = read(&mut std::iter::once(member)).filter(|e| e.path().to_string() != ".") {
            invalid.push(member.0.as_str());
            add(&error);
        }
    }
    let missing = read(&mut members.iter().filter(|(name, _)| !invalid.contains(&name.as_str())));
    if let Some(error) = missing.filter(|e| missing_member(e).is_some_and(|name| !invalid.contains(&name.as_str()))) {
        add(&error);
    }
    field_problems(errors)
}

type PathError = serde_path_to_error::Error<serde_json::Error>;

/// The body's own member that a failure says is missing (not one inside a member).
fn missing_member(error: &PathError) -> Option<String> {
    let message = error.inner().to_string();
    (error.path().to_string() == "." && message.starts_with("missing field"))
        .then(|| quoted_name(&message))
        .flatten()
}

fn field_error<E: std::fmt::Display>(error: &serde_path_to_error::Error<E>) -> FieldError {
    field_failure(&error.path().to_string(), &error.inner().to_string())
}

/// The body as a JSON value, refusing what serde_json alone would accept
/// silently or describe wrongly: a member named twice in one object (which
/// one counts is a guess, docs/contract.md §1) and nesting past serde_json's
/// recursion limit.
fn parse_unambiguous(bytes: &[u8]) -> Result<Value, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed = UniqueMembers { path: &Member::Body }
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value));
    parsed.map_err(|e| {
        let message = e.to_string();
        if let Some(member) = duplicate_member(&message) {
            ApiError::invalid_field(member, "is named twice; a member may appear once in an object")
        } else if message.starts_with("recursion limit exceeded") {
            ApiError::invalid_request(
                format!("the body is nested too deep (line {}, column {})", e.line(), e.column()),
                vec![],
            )
        } else {
            ApiError::invalid_request(
                format!("the body is not valid JSON (line {}, column {})", e.line(), e.column()),
                vec![],
            )
        }
    })
}

const DUPLICATE_MEMBER: &str = "duplicate member ";

/// The path in a duplicate-member error, which may itself hold backticks.
fn duplicate_member(message: &str) -> Option<&str> {
    let quoted = message.strip_prefix(DUPLICATE_MEMBER)?.strip_prefix('`')?;
    Some(&quoted[..quoted.rfind('`')?])
}

/// Where a value sits in the body, kept on the stack while parsing and
/// written out (`payee.name`, `items[2]`) only for an error.
enum Member<'a> {
    Body,
    Named(&'a Member<'a>, &'a str),
    Item(&'a Member<'a>, usize),
}

impl std::fmt::Display for Member<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Member::Body => Ok(()),
            Member::Named(Member::Body, name) => f.write_str(name),
            Member::Named(parent, name) => write!(f, "{parent}.{name}"),
            Member::Item(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

/// A `serde_json::Value` that refuses an object naming one member twice.
struct UniqueMembers<'a> {
    path: &'a Member<'a>,
}

impl<'de> DeserializeSeed<'de> for UniqueMembers<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueMembers<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = access.next_key::<String>()? {
            if members.contains_key(&name) {
                let path = Member::Named(self.path, &name);
                return Err(de::Error::custom(format_args!("{DUPLICATE_MEMBER}`{path}`")));
            }
            let value = access.next_value_seed(UniqueMembers {
                path: &Member::Named(self.path, &name),
            })?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(access.size_hint().unwrap_or(0));
        while let Some(item) = access.next_element_seed(UniqueMembers {
            path: &Member::Item(self.path, items.len()),
        })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    // everything but objects and arrays is read as serde_json reads it
    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }
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

/// JSON has one number type: `3.0` is the integer 3 (RFC 8785 writes it `3`),
/// so an integral number that a double holds exactly reads as an integer.
fn integral_numbers_as_integers(value: &mut Value) {
    const EXACT: f64 = 9_007_199_254_740_991.0; // 2^53 - 1
    match value {
        Value::Number(number) => {
            if let Some(float) = number.as_f64().filter(|_| number.is_f64())
                && float.fract() == 0.0
                && float.abs() <= EXACT
            {
                *value = Value::from(float as i64);
            }
        }
        Value::Object(members) => members.values_mut().for_each(integral_numbers_as_integers),
        Value::Array(items) => items.iter_mut().for_each(integral_numbers_as_integers),
        _ => {}
    }
}

/// Turns serde's `path` and message into the contract's `{field, message}`.
fn field_failure(path: &str, message: &str) -> FieldError {
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
    FieldError::new(field, message)
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
    field_problems(fields)
}

/// The 400 `invalid_request` listing `fields`, in the order of their names.
fn field_problems(mut fields: Vec<FieldError>) -> ApiError {
    fields.sort_by(|a, b| a.field.cmp(&b.field));
    fields.dedup();
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
            .map_err(|e| field_problems(vec![field_error(&e)]))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Versioned {
        version: i64,
    }

    // parsing only: no database, so no backend applies
    #[test]
    fn an_integral_number_written_with_a_fraction_reads_as_that_integer() {
        let parsed: Versioned = parse_json(br#"{"version": 3.0}"#).unwrap();
        assert_eq!(parsed.version, 3);
        let parsed: Versioned = parse_json(br#"{"version": 3e2}"#).unwrap();
        assert_eq!(parsed.version, 300);
        assert_eq!(
            parse_json::<Versioned>(br#"{"version": 3.5}"#).unwrap_err().status(),
            400
        );
        assert_eq!(
            parse_json::<Versioned>(br#"{"version": 1e300}"#).unwrap_err().status(),
            400
        );
    }
}

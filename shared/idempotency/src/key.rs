//! The `Idempotency-Key` header (docs/contract.md §1) and `Prefer: wait=N` (§3).

use std::{fmt, time::Duration};

use axum::{extract::FromRequestParts, http::request::Parts};
use platform::ApiError;

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The longest wait a client may ask for with `Prefer: wait=N`.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// A client's name for one intended action, opaque to the server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the key is empty")]
    Empty,
    #[error("the key has {0} characters; at most 255 are allowed")]
    TooLong(usize),
    #[error("the key may hold only visible ASCII characters (0x21-0x7E); found {0:?}")]
    InvalidCharacter(char),
    #[error("the quoted key is not a valid RFC 8941 string: {0}")]
    BadQuoting(&'static str),
}

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    /// Parses a bare token or an RFC 8941 sf-string, unquoted first. The
    /// lookup's `idempotency_key` is read so too: both forms find one key.
    pub fn parse(header: &str) -> Result<Self, KeyError> {
        let value = header.trim_matches(|c| c == ' ' || c == '\t');
        let key = if let Some(quoted) = value.strip_prefix('"') {
            unquote_sf_string(quoted)?
        } else {
            value.to_owned()
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if let Some(bad) = key.chars().find(|c| !('\x21'..='\x7e').contains(c)) {
            return Err(KeyError::InvalidCharacter(bad));
        }
        let len = key.len();
        if len > Self::MAX_LEN {
            return Err(KeyError::TooLong(len));
        }
        Ok(IdempotencyKey(key))
    }

    /// A key read back from the store, where it was written after parsing.
    pub fn from_stored(key: String) -> Self {
        IdempotencyKey(key)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// RFC 8941 §4.2.5: `\"` and `\\` are the only escapes, and the first
/// unescaped quote must end the value.
fn unquote_sf_string(rest: &str) -> Result<String, KeyError> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => {
                    return Err(KeyError::BadQuoting("a backslash may only escape `\"` or `\\`"));
                }
            },
            '"' => {
                return if chars.as_str().is_empty() {
                    Ok(out)
                } else {
                    Err(KeyError::BadQuoting("text follows the closing quote"))
                };
            }
            other => out.push(other),
        }
    }
    Err(KeyError::BadQuoting("the closing quote is missing"))
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A keyed POST's headers: its key, and how long it waits for a running duplicate.
#[derive(Debug, Clone)]
pub struct IdempotencyHeaders {
    pub key: IdempotencyKey,
    pub wait: Option<Duration>,
}

impl IdempotencyHeaders {
    pub fn from_parts(parts: &Parts) -> Result<Option<Self>, ApiError> {
        let mut values = parts.headers.get_all(IDEMPOTENCY_KEY).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(ApiError::idempotency_key_invalid(
                "send exactly one `Idempotency-Key` header",
            ));
        }
        let text = value
            .to_str()
            .map_err(|_| ApiError::idempotency_key_invalid(KeyError::InvalidCharacter('\u{fffd}').to_string()))?;
        let key = IdempotencyKey::parse(text).map_err(|e| ApiError::idempotency_key_invalid(e.to_string()))?;
        Ok(Some(IdempotencyHeaders {
            key,
            wait: prefer_wait(parts),
        }))
    }
}

/// `Prefer: wait=N`, capped at [`MAX_WAIT`]; unreadable ones ignored (RFC 7240).
fn prefer_wait(parts: &Parts) -> Option<Duration> {
    parts
        .headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|pref| {
            let (name, value) = pref.trim().split_once('=')?;
            name.trim().eq_ignore_ascii_case("wait").then_some(())?;
            value.trim().trim_matches('"').parse::<u64>().ok()
        })
        .next()
        .map(|seconds| Duration::from_secs(seconds).min(MAX_WAIT))
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyHeaders {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Self::from_parts(parts)?.ok_or_else(ApiError::idempotency_key_missing)
    }
}

/// For POSTs that accept a key but need none (an approval decision, a cancel).
#[derive(Debug, Clone)]
pub struct OptionalIdempotencyHeaders(pub Option<IdempotencyHeaders>);

impl<S: Send + Sync> FromRequestParts<S> for OptionalIdempotencyHeaders {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(OptionalIdempotencyHeaders(IdempotencyHeaders::from_parts(parts)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_token_is_taken_as_it_is() {
        let key = IdempotencyKey::parse("81b59b1a-9e75-4de7-a53b-1bb50969c83c").unwrap();
        assert_eq!(key.as_str(), "81b59b1a-9e75-4de7-a53b-1bb50969c83c");
    }

    #[test]
    fn a_quoted_sf_string_is_unquoted_to_the_same_key() {
        let bare = IdempotencyKey::parse("81b59b1a-9e75").unwrap();
        let quoted = IdempotencyKey::parse("\"81b59b1a-9e75\"").unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(IdempotencyKey::parse(r#""a\"b\\c""#).unwrap().as_str(), r#"a"b\c"#);
    }

    #[test]
    fn keys_of_255_characters_are_accepted_and_256_rejected() {
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert_eq!(IdempotencyKey::parse(&"k".repeat(256)), Err(KeyError::TooLong(256)));
        assert!(IdempotencyKey::parse(&format!("\"{}\"", "k".repeat(255))).is_ok());
        assert_eq!(
            IdempotencyKey::parse(&format!("\"{}\"", "k".repeat(256))),
            Err(KeyError::TooLong(256))
        );
    }

    #[test]
    fn empty_keys_and_invisible_characters_are_rejected() {
        assert_eq!(IdempotencyKey::parse(""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse("\"\""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse("a b"), Err(KeyError::InvalidCharacter(' ')));
        assert_eq!(IdempotencyKey::parse("\"a b\""), Err(KeyError::InvalidCharacter(' ')));
        assert_eq!(IdempotencyKey::parse("ключ"), Err(KeyError::InvalidCharacter('к')));
        assert_eq!(
            IdempotencyKey::parse("a\u{7f}"),
            Err(KeyError::InvalidCharacter('\u{7f}'))
        );
    }

    #[test]
    fn broken_quoting_is_rejected() {
        assert!(matches!(IdempotencyKey::parse("\"abc"), Err(KeyError::BadQuoting(_))));
        assert!(matches!(IdempotencyKey::parse("\"ab\"c"), Err(KeyError::BadQuoting(_))));
        assert!(matches!(
            IdempotencyKey::parse(r#""a\nb""#),
            Err(KeyError::BadQuoting(_))
        ));
    }
}

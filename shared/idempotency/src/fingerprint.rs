//! The fingerprint of a validated command (docs/contract.md §2). JCS writes
//! numbers as doubles, as a float is already; an integer past 2^53 − 1 would
//! be rounded and two commands share a fingerprint, so such a command has
//! none ([`InexactNumber`]).

use std::fmt;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The largest integer magnitude a double holds exactly (2^53 − 1).
pub const MAX_EXACT_INTEGER: u64 = (1 << 53) - 1;

#[derive(Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Fingerprint(String);

#[derive(Serialize)]
struct Fingerprinted<'a, C: Serialize> {
    method: &'a str,
    route: &'a str,
    account_id: &'a str,
    command: &'a C,
}

impl Fingerprint {
    /// Hashes the route *template* (path parameters are fields of `command`)
    /// and the validated command, defaults applied.
    pub fn of<C: Serialize>(method: &str, route: &str, account_id: &str, command: &C) -> Result<Self, InexactNumber> {
        let command = serde_json::to_value(command).expect("a command serializes to JSON");
        if let Some(field) = inexact_integer_at(&command) {
            return Err(InexactNumber { field });
        }
        let canonical = canonical_json(&Fingerprinted {
            method,
            route,
            account_id,
            command: &command,
        });
        Ok(Fingerprint(hex::encode(Sha256::digest(canonical))))
    }

    /// A digest read back from the store.
    pub fn from_stored(hex: String) -> Self {
        Fingerprint(hex)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A command field holding an integer canonical JSON would round, by its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InexactNumber {
    pub field: String,
}

impl fmt::Display for InexactNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "must be at most {MAX_EXACT_INTEGER} in magnitude")
    }
}

/// The path of the first integer a double cannot hold exactly, built on the
/// way out so the common case allocates nothing.
fn inexact_integer_at(value: &Value) -> Option<String> {
    match value {
        Value::Number(number) => {
            let magnitude = number
                .as_u64()
                .or_else(|| number.as_i64().map(i64::unsigned_abs))
                .unwrap_or(0);
            (magnitude > MAX_EXACT_INTEGER).then(String::new)
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| inexact_integer_at(item).map(|rest| format!("[{i}]{}", member_path(&rest)))),
        Value::Object(members) => members
            .iter()
            .find_map(|(name, member)| inexact_integer_at(member).map(|rest| format!("{name}{}", member_path(&rest)))),
        Value::Null | Value::Bool(_) | Value::String(_) => None,
    }
}

/// What follows a step of a path: nothing, an index, or `.` and a member.
fn member_path(rest: &str) -> String {
    if rest.is_empty() || rest.starts_with('[') {
        rest.to_owned()
    } else {
        format!(".{rest}")
    }
}

/// RFC 8785 canonical JSON. A command that cannot be serialized is a bug.
pub fn canonical_json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json_canonicalizer::to_vec(value).expect("a command serializes to JSON")
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.0)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

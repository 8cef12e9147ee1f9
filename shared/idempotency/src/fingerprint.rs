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

impl Fingerprint {
    /// Hashes the route *template* (path parameters are fields of `command`)
    /// and the validated command, defaults applied.
    pub fn of<C: Serialize>(method: &str, route: &str, account_id: &str, command: &C) -> Result<Self, InexactNumber> {
        let command = serde_json::to_value(command).expect("a command serializes to JSON");
        if let Some(field) = inexact_integer_at(&command) {
            return Err(InexactNumber { field });
        }
        let fingerprinted = serde_json::json!({
            "method": method,
            "route": route,
            "account_id": account_id,
            "command": command,
        });
        let canonical = canonical_json(&fingerprinted);
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
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be at most {MAX_EXACT_INTEGER} in magnitude")]
pub struct InexactNumber {
    pub field: String,
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

/// RFC 8785 canonical JSON of `value`. A [`Value`] holds no NaN or infinity
/// (serde_json refuses them as numbers), so RFC 8785's one error cannot arise.
///
/// Written here rather than by `serde_json_canonicalizer`, which the tests keep
/// as the reference: that crate parses each member name again to sort it and
/// buffers every member, which made canonical JSON most of what a replay's
/// fingerprint and its journal entry cost (docs/design.md §10).
pub fn canonical_json(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // every number as ECMAScript writes a double, integers included (§3.2.2.3)
        Value::Number(number) => {
            let double = number.as_f64().expect("a JSON number is a finite double");
            out.extend_from_slice(ryu_js::Buffer::new().format_finite(double).as_bytes());
        }
        // serde_json escapes exactly what §3.2.2.2 escapes, with lowercase hex
        Value::String(text) => serde_json::to_writer(&mut *out, text).expect("a string writes to memory"),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            // by UTF-16 code units (§3.2.3), not by code points as a `str` compares
            let mut members: Vec<_> = members.iter().collect();
            members.sort_unstable_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push(b'{');
            for (i, (name, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, name).expect("a string writes to memory");
                out.push(b':');
                write_canonical(member, out);
            }
            out.push(b'}');
        }
    }
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

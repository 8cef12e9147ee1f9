//! The fingerprint of a validated command (CONTRACT §2):
//! `hex(sha256(canonical_json({method, route, account_id, command})))`, with
//! RFC 8785 (JCS) canonical JSON.

use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

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
    /// Hashes what the server will do: the route *template* (path parameters
    /// are fields of `command`) and the command after validation, so defaults
    /// and normalisation are already applied.
    pub fn of<C: Serialize>(method: &str, route: &str, account_id: &str, command: &C) -> Self {
        let canonical = canonical_json(&Fingerprinted {
            method,
            route,
            account_id,
            command,
        });
        Fingerprint(hex::encode(Sha256::digest(canonical)))
    }

    /// A digest read back from the store.
    pub fn from_stored(hex: String) -> Self {
        Fingerprint(hex)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// RFC 8785 canonical JSON. Commands are plain data, so serialization cannot
/// fail; a command that cannot be serialized is a bug, not an input error.
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

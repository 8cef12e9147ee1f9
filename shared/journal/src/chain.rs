//! The chain itself, with no database: the events, an entry and its hash,
//! linking records into entries, and [`verify`], which the `audit` command
//! runs over an exported journal. docs/contract.md §8.

use platform::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use idempotency::fingerprint::MAX_EXACT_INTEGER;
pub use idempotency::transitions::{AuditEvent, Record, StateChange};

/// The hash before the first entry.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One entry of the journal, as stored and as exported (one JSON object a
/// line). Read back, it refuses a member it does not know: the hash would not
/// cover it, and an export must carry nothing unhashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditEntry {
    pub seq: i64,
    pub account_id: String,
    pub principal_id: String,
    pub operation_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub fingerprint: Option<String>,
    pub route: Option<String>,
    pub event: AuditEvent,
    pub external_ref: Option<String>,
    pub at: Timestamp,
    /// See [`Record::attempt`].
    #[serde(default)]
    pub attempt: Option<i64>,
    /// `state_changed`: the resource and its new state.
    #[serde(default)]
    pub resource_type: Option<String>,
    #[serde(default)]
    pub resource_id: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
    /// `resolved`, `external_ref_refused`: what the person gave for it.
    #[serde(default)]
    pub evidence: Option<String>,
    pub prev_hash: String,
    pub hash: String,
}

/// Everything but `hash`: what the hash covers. The fields most entries do
/// not have (the attempt, the resource, the evidence) are left out when empty, so an entry
/// hashes the same whichever of them it lacks.
///
/// Its members are declared in RFC 8785's order (by name, all ASCII), and each is a string,
/// null or an integer within 2^53 − 1, which a double writes as its digits (an export with a
/// larger one is refused as it is read): so serde's JSON of it is its canonical JSON, with no
/// `Value` built and sorted for every entry a round links.
#[derive(Serialize)]
struct Hashed<'a> {
    account_id: &'a str,
    at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<i64>,
    event: AuditEvent,
    #[serde(skip_serializing_if = "Option::is_none")]
    evidence: Option<&'a str>,
    external_ref: Option<&'a str>,
    fingerprint: Option<&'a str>,
    idempotency_key: Option<&'a str>,
    operation_id: Option<&'a str>,
    prev_hash: &'a str,
    principal_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_type: Option<&'a str>,
    route: Option<&'a str>,
    seq: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'a str>,
}

impl AuditEntry {
    /// The entry that records `record` at `seq`, after `prev_hash`.
    pub(super) fn of(record: Record, seq: i64, prev_hash: String, hash: String) -> Self {
        let (resource_type, resource_id, state) = match record.change {
            Some(c) => (Some(c.resource_type), Some(c.resource_id), Some(c.state)),
            None => (None, None, None),
        };
        AuditEntry {
            seq,
            account_id: record.account_id,
            principal_id: record.principal_id,
            operation_id: record.operation_id,
            idempotency_key: record.idempotency_key,
            fingerprint: record.fingerprint,
            route: record.route,
            event: record.event,
            external_ref: record.external_ref,
            at: record.at,
            attempt: record.attempt,
            resource_type,
            resource_id,
            state,
            evidence: record.evidence,
            prev_hash,
            hash,
        }
    }

    /// `sha256(prev_hash ‖ canonical_json(entry without hash))`, lowercase hex.
    pub fn computed_hash(&self) -> String {
        let hashed = Hashed {
            seq: self.seq,
            account_id: &self.account_id,
            principal_id: &self.principal_id,
            operation_id: self.operation_id.as_deref(),
            idempotency_key: self.idempotency_key.as_deref(),
            fingerprint: self.fingerprint.as_deref(),
            route: self.route.as_deref(),
            event: self.event,
            external_ref: self.external_ref.as_deref(),
            at: self.at,
            attempt: self.attempt,
            resource_type: self.resource_type.as_deref(),
            resource_id: self.resource_id.as_deref(),
            state: self.state.as_deref(),
            evidence: self.evidence.as_deref(),
            prev_hash: &self.prev_hash,
        };
        let mut digest = Sha256::new();
        digest.update(self.prev_hash.as_bytes());
        serde_json::to_writer(&mut digest, &hashed).expect("an entry writes to a digest");
        hex::encode(digest.finalize())
    }
}

/// `records` as the entries that follow `head`, each hashed onto the one before.
pub(crate) fn chained((mut seq, mut prev_hash): (i64, String), records: Vec<Record>) -> Vec<AuditEntry> {
    let mut entries = Vec::with_capacity(records.len());
    for record in records {
        seq += 1;
        let mut entry = AuditEntry::of(record, seq, std::mem::take(&mut prev_hash), String::new());
        entry.hash = entry.computed_hash();
        prev_hash = entry.hash.clone();
        entries.push(entry);
    }
    entries
}

/// Where a chain breaks, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the audit chain breaks at entry {seq}: {reason}")]
pub struct ChainBreak {
    pub seq: i64,
    pub reason: &'static str,
}

/// The last entry of a chain: what an operator pins (writes down elsewhere)
/// so that a later verification can tell a journal that lost its tail.
/// `{seq: 0, hash: GENESIS}` for an empty chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Head {
    #[schema(example = 1234)]
    pub seq: i64,
    /// lowercase hex SHA-256
    pub hash: String,
}

impl std::fmt::Display for Head {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.seq, self.hash)
    }
}

impl std::str::FromStr for Head {
    type Err = String;
    /// `SEQ:HASH`, as [`Display`](std::fmt::Display) prints it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (seq, hash) = s.split_once(':').ok_or("a head is `SEQ:HASH`")?;
        let seq = seq.parse().map_err(|_| format!("`{seq}` is not an entry number"))?;
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("`{hash}` is not a SHA-256 in hex"));
        }
        Ok(Head {
            seq,
            hash: hash.to_ascii_lowercase(),
        })
    }
}

/// What a verification found: how many entries hold, and the head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub entries: u64,
    /// `None` for an empty journal.
    pub head: Option<Head>,
}

/// Checks a whole chain, in order from its first entry: each entry follows
/// the one before it, links to its hash, and hashes to what it says. With
/// `pinned` (a head written down earlier), the chain must still contain that
/// entry unchanged: a chain cut below it, or rewritten up to it, is broken —
/// the one tampering a chain alone cannot show.
pub fn verify<'a>(
    entries: impl IntoIterator<Item = &'a AuditEntry>,
    pinned: Option<&Head>,
) -> Result<Verified, ChainBreak> {
    let (mut expected_seq, mut prev_hash, mut checked) = (1_i64, GENESIS.to_owned(), 0_u64);
    // the head of an empty chain: every chain starts there
    let mut pinned_seen = pinned.is_some_and(|pin| pin.seq == 0 && pin.hash == GENESIS);
    for entry in entries {
        let broken = |reason| ChainBreak { seq: entry.seq, reason };
        if entry.seq != expected_seq {
            return Err(broken("an entry is missing or out of order before it"));
        }
        if entry.prev_hash != prev_hash {
            return Err(broken("its prev_hash is not the hash of the entry before it"));
        }
        if entry.computed_hash() != entry.hash {
            return Err(broken("its fields do not hash to its hash"));
        }
        if let Some(pin) = pinned.filter(|pin| pin.seq == entry.seq) {
            if pin.hash != entry.hash {
                return Err(broken(
                    "it is not the entry that was pinned: the chain was rewritten up to here",
                ));
            }
            pinned_seen = true;
        }
        prev_hash = entry.hash.clone();
        expected_seq += 1;
        checked += 1;
    }
    if let Some(pin) = pinned.filter(|_| !pinned_seen) {
        return Err(ChainBreak {
            seq: pin.seq,
            reason: "the journal ends before the pinned head: its tail was cut",
        });
    }
    Ok(Verified {
        entries: checked,
        head: (checked > 0).then(|| Head {
            seq: expected_seq - 1,
            hash: prev_hash,
        }),
    })
}

/// The journal as JSON lines: one entry a line, in chain order.
pub fn to_json_lines(entries: &[AuditEntry]) -> String {
    entries
        .iter()
        .filter_map(|e| serde_json::to_string(e).ok())
        .map(|line| line + "\n")
        .collect()
}

/// Reads an exported journal. A line that is not an entry is named by its
/// number, and so is an entry with a member its hash does not cover, with
/// the member: an export cannot carry unhashed content and still verify.
pub fn from_json_lines(text: &str) -> Result<Vec<AuditEntry>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| read_entry(line).map_err(|e| format!("line {}: {e}", n + 1)))
        .collect()
}

/// One exported entry; what refuses it names its entry.
fn read_entry(line: &str) -> Result<AuditEntry, String> {
    let entry: AuditEntry = serde_json::from_str(line).map_err(|e| {
        let seq = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|entry| entry.get("seq").map(ToString::to_string))
            .unwrap_or_else(|| "?".to_owned());
        if e.to_string().starts_with("unknown field") {
            format!("entry {seq} carries a member no hash covers: {e}")
        } else {
            format!("entry {seq}: {e}")
        }
    })?;
    // past 2^53 canonical JSON rounds an integer, which `Hashed` does not: refused, as a fingerprint refuses one
    for (member, value) in [("seq", Some(entry.seq)), ("attempt", entry.attempt)] {
        if value.is_some_and(|n| n.unsigned_abs() > MAX_EXACT_INTEGER) {
            return Err(format!(
                "entry {}: `{member}` must be at most {MAX_EXACT_INTEGER} in magnitude",
                entry.seq
            ));
        }
    }
    Ok(entry)
}

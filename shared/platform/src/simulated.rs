//! What the simulated external systems (the payment provider, the deployment
//! controller) share: they stand in for other companies' APIs, so they know
//! nothing of Retrysafe's accounts or its idempotency layer. A caller is a
//! tenant told apart by its bearer key; a request's idempotency key is a plain
//! header; a request is known again by the hash of its body.

use axum::{
    extract::FromRequestParts,
    http::{HeaderMap, StatusCode, header, request::Parts},
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ApiError;

/// Who calls: the SHA-256 of the bearer key, so no key is ever kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tenant(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|k| !k.is_empty());
        bearer
            .map(|k| Tenant(hex::encode(Sha256::digest(k.as_bytes()))))
            .ok_or_else(ApiError::unauthenticated)
    }
}

/// The request's `Idempotency-Key`: required, 1–255 visible ASCII characters.
pub fn idempotency_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let key = headers
        .get("idempotency-key")
        .ok_or_else(ApiError::idempotency_key_missing)?
        .to_str()
        .map_err(|_| ApiError::idempotency_key_invalid("not visible ASCII"))?
        .trim();
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::idempotency_key_invalid("1 to 255 visible ASCII characters"));
    }
    Ok(key.to_owned())
}

/// What a request asked for, to tell a repeat from another request under the same key.
pub fn request_hash(request: &impl Serialize) -> String {
    hex::encode(Sha256::digest(serde_json::to_vec(request).unwrap_or_default()))
}

/// The answer of a system that has taken a request and is still at it, as
/// its caller may get it: 409 (a request with this key is being processed),
/// 425, 429 with a body, or a 5xx. None of them says "not done".
pub fn still_processing(status: u16) -> ApiError {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let (code, title) = match status {
        StatusCode::CONFLICT => ("request_in_progress", "A request with this key is being processed"),
        StatusCode::TOO_EARLY => ("too_early", "Too early"),
        StatusCode::TOO_MANY_REQUESTS => ("request_in_progress", "Too many requests with this key"),
        StatusCode::SERVICE_UNAVAILABLE => ("unavailable", "Unavailable"),
        _ => ("internal_error", "Internal error"),
    };
    ApiError::new(
        status,
        code,
        title,
        "the request was taken and is still being processed; try again later",
    )
}

/// Something a simulated external system did, for a timeline a person reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimulatedEvent {
    pub at: crate::Timestamp,
    /// What happened, in words: "charged ch_… (1250 minor units)", "answer dropped (fault)".
    pub what: String,
    /// The caller's idempotency key, when the event is about a request.
    pub key: Option<String>,
}

/// What a simulated system did, in order: the last [`EventLog::KEPT`] events.
/// A timeline for a person to read, not a record: what the system did is in
/// its state (and its state file), so the oldest events may go.
#[derive(Debug, Clone, Default)]
pub struct EventLog(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<SimulatedEvent>>>);

impl EventLog {
    pub const KEPT: usize = 10_000;

    pub fn record(&self, what: impl Into<String>, key: Option<&str>) {
        let mut events = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if events.len() == Self::KEPT {
            events.pop_front();
        }
        events.push_back(SimulatedEvent {
            at: crate::Timestamp::now(),
            what: what.into(),
            key: key.map(str::to_owned),
        });
    }

    pub fn all(&self) -> Vec<SimulatedEvent> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// Reads a simulated system's state file: what it knew when it last wrote
/// it, or a fresh state if there is no file yet.
pub fn load_state<T: serde::de::DeserializeOwned + Default>(path: &std::path::Path) -> std::io::Result<T> {
    if !path.exists() {
        return Ok(T::default());
    }
    serde_json::from_slice(&std::fs::read(path)?).map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))
}

/// Writes a simulated system's state file before it answers the request that
/// changed it: a new file, flushed to disk and renamed over the old one, so a
/// crash at any point leaves the old state or the new one, whole.
pub fn save_state(path: &std::path::Path, state: &impl Serialize) -> std::io::Result<()> {
    use std::io::Write;
    let written = path.with_extension("tmp");
    let mut file = std::fs::File::create(&written)?;
    file.write_all(&serde_json::to_vec(state).map_err(std::io::Error::other)?)?;
    file.sync_all()?;
    std::fs::rename(&written, path)?;
    // the rename itself is durable once the directory is
    match path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// What a fault does to the answer of a request the simulator just accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerFault {
    None,
    /// `drop_next`: no answer at all.
    Drop,
    /// `answer_after_accepting`: this status instead of the answer.
    Status(u16),
}

impl AnswerFault {
    /// Uses up the next answer fault switched on, if any: a dropped answer
    /// first, then the next status of `answer_after_accepting`.
    pub fn take(drop_next: &mut u32, answer_after_accepting: &mut Vec<u16>) -> AnswerFault {
        if *drop_next > 0 {
            *drop_next -= 1;
            return AnswerFault::Drop;
        }
        if answer_after_accepting.is_empty() {
            return AnswerFault::None;
        }
        AnswerFault::Status(answer_after_accepting.remove(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_log_keeps_the_last_events_and_no_more() {
        let log = EventLog::default();
        for n in 0..=EventLog::KEPT {
            log.record(format!("event {n}"), None);
        }
        let events = log.all();
        assert_eq!(events.len(), EventLog::KEPT);
        assert_eq!(events[0].what, "event 1", "the oldest went first");
        assert_eq!(events[EventLog::KEPT - 1].what, format!("event {}", EventLog::KEPT));
    }
}

//! An operation: one intended action of a caller, across all its attempts.

use axum::http::StatusCode;
use platform::Timestamp;
use serde::{Deserialize, Serialize};

use crate::{
    fingerprint::Fingerprint,
    key::IdempotencyKey,
    transitions::{AuditEvent, Record},
};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, strum::IntoStaticStr, strum::EnumString,
)]
#[serde(rename_all = "snake_case")]
// stored as `into_str()` and read back by `str::parse`: strum's names, by serde's rule
#[strum(serialize_all = "snake_case", const_into_str)]
#[cfg_attr(test, derive(strum::EnumIter))]
pub enum OperationState {
    /// Claimed; an attempt holds the lease and is running it.
    InProgress,
    /// Waiting for a human decision bound to the fingerprint.
    AwaitingApproval,
    /// Finished with success; the stored answer is replayed.
    Completed,
    /// Finished with a known, final business failure; the stored answer is replayed.
    Failed,
    /// An external effect may or may not have happened; the reconciler resolves it.
    Unknown,
    /// The approval was refused or expired.
    Rejected,
}

impl OperationState {
    /// Finished: the stored answer is final and replayed to every retry.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            OperationState::Completed | OperationState::Failed | OperationState::Rejected
        )
    }
}

/// The answer a first attempt gave, kept to be replayed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: StatusCode,
    pub content_type: String,
    pub location: Option<String>,
    pub body: Vec<u8>,
}

/// What an operation made or acted on: `{type, id, url}` in its status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ResourceRef {
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
    pub url: String,
}

/// One row of `idempotency_operations`, as read back.
#[derive(Debug, Clone)]
pub struct OperationRecord {
    pub account_id: String,
    pub key: IdempotencyKey,
    pub operation_id: String,
    pub principal_id: String,
    pub method: String,
    pub route: String,
    pub fingerprint: Fingerprint,
    pub state: OperationState,
    pub lease_token: Option<String>,
    pub locked_until: Option<Timestamp>,
    pub attempts: i32,
    pub response: Option<StoredResponse>,
    pub resource: Option<ResourceRef>,
    pub external_ref: Option<String>,
    /// The approval this operation waits for (or ran with), if its route's policy asked for one.
    pub approval_id: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl OperationRecord {
    /// Who this operation is.
    pub fn identity(&self) -> OperationIdentity<'_> {
        OperationIdentity {
            account_id: &self.account_id,
            operation_id: &self.operation_id,
            idempotency_key: self.key.as_str(),
            fingerprint: self.fingerprint.as_str(),
            route: &self.route,
        }
    }

    /// A journal record of this operation, by `principal_id`.
    pub fn audit(&self, event: AuditEvent, principal_id: &str, at: Timestamp) -> Record {
        self.identity()
            .audit(event, principal_id, self.external_ref.as_deref(), at)
    }
}

/// Who an operation is: the five fields its record, journal entries and
/// outbox events all carry, named alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperationIdentity<'a> {
    pub account_id: &'a str,
    pub operation_id: &'a str,
    pub idempotency_key: &'a str,
    pub fingerprint: &'a str,
    pub route: &'a str,
}

impl OperationIdentity<'_> {
    /// A journal record of this operation, by `by`: the one copy of its identity.
    pub fn audit(&self, event: AuditEvent, by: &str, external_ref: Option<&str>, at: Timestamp) -> Record {
        Record {
            account_id: self.account_id.to_owned(),
            principal_id: by.to_owned(),
            operation_id: Some(self.operation_id.to_owned()),
            idempotency_key: Some(self.idempotency_key.to_owned()),
            fingerprint: Some(self.fingerprint.to_owned()),
            route: Some(self.route.to_owned()),
            event,
            external_ref: external_ref.map(str::to_owned),
            at,
            attempt: None,
            change: None,
            evidence: None,
        }
    }
}

pub fn status_url(operation_id: &str) -> String {
    format!("/v1/operations/{operation_id}")
}

/// A new public operation id: `op_` and a UUIDv7, so ids sort by creation.
pub fn new_operation_id() -> String {
    format!("op_{}", uuid::Uuid::now_v7().simple())
}

/// The least operation id of `at`'s millisecond: all created before are smaller.
pub fn first_operation_id_at(at: Timestamp) -> String {
    let millis = u64::try_from(at.as_datetime().timestamp_millis()).unwrap_or(0);
    format!(
        "op_{}",
        uuid::Builder::from_unix_timestamp_millis(millis, &[0; 10])
            .into_uuid()
            .simple()
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use strum::IntoEnumIterator;

    use super::*;
    use crate::status::{ApprovalState, EventState};

    /// The text a state or an event is stored as, and filtered by, is the name the API shows.
    fn stored_as_shown<T>()
    where
        T: IntoEnumIterator + Serialize + std::str::FromStr + PartialEq + std::fmt::Debug + Copy,
        &'static str: From<T>,
    {
        for value in T::iter() {
            let stored = <&'static str>::from(value);
            assert_eq!(serde_json::to_value(value).unwrap(), stored, "{value:?}");
            assert!(
                stored.parse::<T>().ok() == Some(value),
                "{stored} reads back as {value:?}"
            );
        }
    }

    #[test]
    fn every_state_and_event_is_stored_under_the_name_the_api_shows_and_read_back_as_itself() {
        stored_as_shown::<OperationState>();
        stored_as_shown::<AuditEvent>();
        stored_as_shown::<ApprovalState>();
        stored_as_shown::<EventState>();
    }

    #[test]
    fn the_first_operation_id_of_a_time_sorts_above_earlier_ids_and_below_later_ones() {
        let now = Timestamp::now();
        let id = new_operation_id();
        let (earlier, later) = (
            first_operation_id_at(now.minus(Duration::from_secs(1))),
            first_operation_id_at(now.plus(Duration::from_secs(1))),
        );
        assert!(earlier < id, "{earlier} < {id}");
        assert!(id < later, "{id} < {later}");
        assert_eq!(earlier.len(), id.len());
    }
}

//! The operation status resource's shape (docs/contract.md §4), whole in the
//! core; an extension fills in its part ([`crate::Extension::describe`]).

use platform::Timestamp;
use serde::{Deserialize, Serialize};

use crate::operation::{OperationRecord, OperationState, ResourceRef};

/// An operation as its caller may see it: never the stored request or answer body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OperationView {
    #[schema(example = "op_0193a1b2c3d4e5f60718293a4b5c6d7e")]
    pub operation_id: String,
    pub idempotency_key: String,
    #[schema(example = "POST")]
    pub method: String,
    #[schema(example = "/v1/tickets")]
    pub route: String,
    /// hex SHA-256 of the canonical `{method, route, account_id, command}`, the
    /// command as validated (docs/contract.md §2)
    pub fingerprint: String,
    pub state: OperationState,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// How many requests carried the key.
    pub attempts: i32,
    /// What the operation made or acted on, once known.
    pub resource: Option<ResourceRef>,
    /// The status of the stored answer every retry gets, once it is stored for
    /// good: finished, handed to the outbox, or unknown.
    pub response_status: Option<u16>,
    /// The approval that applies, if any: its id, state, expiry and decision.
    pub approval: Option<OperationApproval>,
    /// The external system's reference, when one was involved.
    pub external_ref: Option<String>,
    /// Where its outbox event is, when its work left the process: `dead`
    /// means it failed too often and is no longer tried until an admin sends
    /// it again, the operation's `state` left as it was.
    pub outbox: Option<EventState>,
    /// Why the event's last delivery or lookup came to nothing, if it did:
    /// the external system's status and problem `code` and `detail`, or what
    /// kept its answer away; never a raw body or an address.
    pub last_error: Option<String>,
}

impl From<&OperationRecord> for OperationView {
    fn from(op: &OperationRecord) -> Self {
        // in progress with no lease: its work is with the outbox, its 202 stored
        let answered = op.state.is_finished()
            || op.state == OperationState::Unknown
            || (op.state == OperationState::InProgress && op.lease_token.is_none());
        OperationView {
            operation_id: op.operation_id.clone(),
            idempotency_key: op.key.as_str().to_owned(),
            method: op.method.clone(),
            route: op.route.clone(),
            fingerprint: op.fingerprint.as_str().to_owned(),
            state: op.state,
            created_at: op.created_at,
            updated_at: op.updated_at,
            attempts: op.attempts,
            resource: op.resource.clone(),
            response_status: op.response.as_ref().filter(|_| answered).map(|r| r.status.as_u16()),
            approval: None,
            external_ref: op.external_ref.clone(),
            outbox: None,
            last_error: None,
        }
    }
}

/// What an operation's caller may know of its approval (never who else is waiting).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OperationApproval {
    pub approval_id: String,
    pub state: ApprovalState,
    pub expires_at: Timestamp,
    pub decided_by: Option<String>,
    pub decided_at: Option<Timestamp>,
}

/// The filters on the operations that need a person: each one set must hold;
/// with none set, those whose outcome is unknown or whose event is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeedsAPerson {
    pub unknown: bool,
    pub dead: bool,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, strum::IntoStaticStr, strum::EnumString,
)]
#[serde(rename_all = "snake_case")]
// stored as `into_str()` and read back by `str::parse`: strum's names, by serde's rule
#[strum(serialize_all = "snake_case", const_into_str)]
#[cfg_attr(test, derive(strum::EnumIter))]
pub enum ApprovalState {
    /// Waiting for a decision, and not yet past `expires_at`.
    Pending,
    Approved,
    Rejected,
    /// Nobody decided before `expires_at`.
    Expired,
}

/// Where an event is in its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema, strum::IntoStaticStr, strum::EnumString)]
#[serde(rename_all = "snake_case")]
// stored as `into_str()` and read back by `str::parse`: strum's names, by serde's rule
#[strum(serialize_all = "snake_case", const_into_str)]
#[cfg_attr(test, derive(strum::EnumIter))]
pub enum EventState {
    /// To be sent (first, or again).
    Pending,
    /// A worker holds it and may have sent it.
    Sending,
    /// Sent, and the answer was lost: the reconciler asks.
    Unknown,
    Delivered,
    Failed,
    /// Failed too often: no longer tried until an admin redelivers it or
    /// resolves its `unknown` operation.
    Dead,
}

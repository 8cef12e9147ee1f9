//! The approval record as the approvals table keeps it, and the decision an
//! approver makes: an approval is pending, then approved, rejected or
//! expired, once ([`ApprovalState`], the core's, which its verdict reads).

use idempotency::{Fingerprint, gate::ApprovalState};
use platform::Timestamp;
use serde::{Deserialize, Serialize};

use crate::ApprovalSummary;

/// What an approver decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approve,
    Reject,
}

impl Decision {
    pub(crate) fn state(self) -> ApprovalState {
        match self {
            Decision::Approve => ApprovalState::Approved,
            Decision::Reject => ApprovalState::Rejected,
        }
    }
}

/// One row of `idempotency_approvals`.
#[derive(Debug, Clone)]
pub struct ApprovalRecord {
    pub seq: i64,
    pub approval_id: String,
    pub account_id: String,
    pub operation_id: String,
    pub idempotency_key: String,
    pub route: String,
    pub fingerprint: Fingerprint,
    pub summary: ApprovalSummary,
    pub requested_by: String,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
    /// `None` while pending.
    pub decision: Option<ApprovalState>,
    pub decided_by: Option<String>,
    pub decided_at: Option<Timestamp>,
}

impl ApprovalRecord {
    /// The state as of `now`: a pending approval past its expiry is expired
    /// even before anything has marked it so.
    pub fn state(&self, now: Timestamp) -> ApprovalState {
        match self.decision {
            Some(decided) => decided,
            None if self.expires_at <= now => ApprovalState::Expired,
            None => ApprovalState::Pending,
        }
    }

    pub fn url(&self) -> String {
        approval_url(&self.approval_id)
    }
}

pub fn approval_url(approval_id: &str) -> String {
    format!("/v1/approvals/{approval_id}")
}

/// A new public approval id: `apr_` and a time-ordered UUID.
pub fn new_approval_id() -> String {
    format!("apr_{}", uuid::Uuid::now_v7().simple())
}

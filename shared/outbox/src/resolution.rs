//! What a person found out at the external system about an operation whose
//! outcome was unknown: what [`resolve`](crate::resolve) settles it with, and
//! what the settlement plan reads.

use idempotency::status::EventState;

/// What a person found out about an operation whose outcome was unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub outcome: Resolved,
    /// What they saw, in their words (a provider's dashboard, a ticket with
    /// the controller's team): journaled with the resolution.
    pub evidence: String,
}

/// How the work ended at the external system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// It took effect there. With a reference, it is accepted only when the
    /// external system confirms the reference is this operation's work, and
    /// settled as the reconciler settles what it finds. With none (the
    /// external system cannot be asked, for good), the operation ends
    /// `completed` and no row keeps an external id.
    Completed { external_ref: Option<String> },
    /// It did not take effect: accepted only when the external system holds
    /// nothing under the operation's key, and settled as a refusal. A
    /// reference the person names is their note, journaled only.
    Failed { external_ref: Option<String> },
}

impl Resolution {
    /// The event's state once settled this way.
    pub(crate) fn event_state(&self) -> EventState {
        match self.outcome {
            Resolved::Completed { .. } => EventState::Delivered,
            Resolved::Failed { .. } => EventState::Failed,
        }
    }

    /// The reference the person named, if any.
    pub(crate) fn external_ref(&self) -> Option<&str> {
        match &self.outcome {
            Resolved::Completed { external_ref } | Resolved::Failed { external_ref } => external_ref.as_deref(),
        }
    }
}

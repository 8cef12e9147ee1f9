//! The settlement plan: what each outcome of a delivery or a lookup writes to
//! the event, its operation, the service's rows and the journal, and when the
//! event is due again. One pure function for the worker and the reconciler,
//! so the tables of the module's map (and of docs/contract.md §5) are decided
//! in one place and tested row by row.

use idempotency::{OperationState, status::EventState, transitions::AuditEvent};

use crate::{
    answer::{Delivery, Lookup},
    event::Settlement,
    resolution::{Resolution, Resolved},
};

/// The principal the journal names for what the worker does.
pub const WORKER: &str = "system:outbox-worker";
/// The principal the journal names for what the reconciler does.
pub const RECONCILER: &str = "system:reconciler";

/// What handling an event came to: the worker's delivery, or the reconciler's lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The external system took the delivery.
    Accepted { external_ref: String },
    /// The external system refused the delivery, finally.
    Refused { reason: String },
    /// The delivery cannot have reached the work.
    NotAccepted { reason: String },
    /// The delivery may or may not have taken effect.
    AnswerLost { reason: String },
    /// The reconciler found what was asked for.
    Found { external_ref: String },
    /// The reconciler found no trace of it.
    Absent,
    /// The reconciler could not ask, or found something that is not what was
    /// asked for (which a person must look at). `sending`: the event was
    /// taken from a worker that died holding it, so nobody has said yet that
    /// it is unknown.
    NotAsked { reason: String, sending: bool },
}

impl From<Delivery> for Outcome {
    fn from(delivery: Delivery) -> Self {
        match delivery {
            Delivery::Accepted { external_ref } => Outcome::Accepted { external_ref },
            Delivery::Refused { reason } => Outcome::Refused { reason },
            Delivery::NotAccepted { reason } => Outcome::NotAccepted { reason },
            Delivery::AnswerLost { reason } => Outcome::AnswerLost { reason },
        }
    }
}

impl Outcome {
    /// Who came to it: the worker delivering, or the reconciler asking.
    pub(crate) fn by(&self) -> &'static str {
        match self {
            Outcome::Accepted { .. }
            | Outcome::Refused { .. }
            | Outcome::NotAccepted { .. }
            | Outcome::AnswerLost { .. } => WORKER,
            Outcome::Found { .. } | Outcome::Absent | Outcome::NotAsked { .. } => RECONCILER,
        }
    }

    /// What the reconciler's lookup of an event that was in `state` came to.
    pub(crate) fn looked_up(found: Result<Lookup, String>, state: EventState) -> Self {
        match found {
            Ok(Lookup::Found { external_ref }) => Outcome::Found { external_ref },
            Ok(Lookup::Absent) => Outcome::Absent,
            Ok(Lookup::Mismatch { reason, .. }) | Err(reason) => Outcome::NotAsked {
                reason,
                sending: state == EventState::Sending,
            },
        }
    }
}

/// What an outcome writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan<'a> {
    /// The event's new state.
    pub event: EventState,
    /// Kept on the event and the operation; `None` leaves what they have.
    pub external_ref: Option<&'a str>,
    /// The event's `last_error`.
    pub last_error: Option<&'a str>,
    /// When the event is due again.
    pub due: Due,
    /// What the operation, the service's rows and the journal become. `None`:
    /// the event is only tried again, and nothing else changes.
    pub settles: Option<Settles<'a>>,
    /// Whether this process's worker is woken: the event is due now.
    pub wake_worker: bool,
    /// Whether it counts towards the event's failures: it came to nothing
    /// known (not accepted, the answer lost, the external system not asked).
    pub failure: bool,
}

impl Plan<'_> {
    /// The event's state and failures once this plan is written over
    /// `failures` earlier ones: at `max_failures` a failure makes it `dead`,
    /// and its operation stays as the plan leaves it.
    pub(crate) fn event_after(&self, failures: i32, max_failures: i32) -> (EventState, i32) {
        if !self.failure {
            return (self.event, failures);
        }
        let failures = failures.saturating_add(1);
        let state = if failures >= max_failures {
            EventState::Dead
        } else {
            self.event
        };
        (state, failures)
    }
}

/// What settling an event writes beyond the event itself, in the same transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settles<'a> {
    pub operation: OperationState,
    /// What the service's [`Ledger::settle`](crate::Ledger::settle) is told.
    pub business: Settlement<'a>,
    /// Journaled in this order, each with the plan's `external_ref` (after the
    /// `dispatched` the worker journaled when it took the event), by whom.
    pub journal: Vec<(AuditEvent, &'a str)>,
}

/// When an event is due again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// At once.
    Now,
    /// After the doubling, jittered backoff for its deliveries.
    AfterBackoff,
    /// After `reconcile_after`: an unknown event is asked about then, while
    /// a delivered or failed one is never taken again.
    AfterReconcileWait,
}

/// The plan for `outcome`. `completes_on_acceptance`: the ledger's
/// [`completes_on_acceptance`](crate::Ledger::completes_on_acceptance)
/// for the event — work that goes on at the external system keeps its
/// operation in progress after it was accepted.
pub(crate) fn plan(outcome: &Outcome, completes_on_acceptance: bool) -> Plan<'_> {
    match outcome {
        Outcome::Accepted { external_ref } => {
            accepted(external_ref, AuditEvent::Accepted, WORKER, completes_on_acceptance)
        }
        Outcome::Found { external_ref } => accepted(
            external_ref,
            AuditEvent::Reconciled,
            RECONCILER,
            completes_on_acceptance,
        ),
        Outcome::Refused { reason } => settled(
            EventState::Failed,
            reason,
            OperationState::Failed,
            Settlement::Refused { reason },
            (AuditEvent::Failed, WORKER),
        ),
        Outcome::AnswerLost { reason } => unknown(reason, WORKER),
        // a worker died holding it: whether it was sent, nobody knows until someone can ask
        Outcome::NotAsked { reason, sending: true } => unknown(reason, RECONCILER),
        Outcome::NotAccepted { reason } => again(EventState::Pending, reason, Due::AfterBackoff),
        // sent again with the same key, which the external system's own idempotency makes safe
        Outcome::Absent => Plan {
            wake_worker: true,
            failure: false,
            ..again(EventState::Pending, "not found by the reconciler", Due::Now)
        },
        Outcome::NotAsked { reason, sending: false } => again(EventState::Unknown, reason, Due::AfterBackoff),
    }
}

/// The event's `last_error` once a person settled it as failed: their
/// evidence is in the journal, for those who may read it.
pub(crate) const FAILED_BY_HAND: &str = "settled as failed by a person";

/// What a person's settling of an operation whose outcome was unknown writes
/// ([`resolve`](crate::resolve)), journaled `resolved` by `by` first:
///
/// - `completed` with the reference the external system confirmed: what the
///   reconciler writes when it finds the work (a rollout goes on);
/// - `completed` with none: an end, with no external reference in any row —
///   nothing follows it or acts on it at the external system;
/// - `failed`: what a refusal writes. A reference the person named is only
///   their note, for the journal: the external system holds nothing for the
///   operation, so no row keeps it.
pub(crate) fn resolved<'a>(resolution: &'a Resolution, by: &'a str, completes_on_acceptance: bool) -> Plan<'a> {
    match &resolution.outcome {
        Resolved::Completed {
            external_ref: Some(external_ref),
        } => accepted(external_ref, AuditEvent::Resolved, by, completes_on_acceptance),
        Resolved::Completed { external_ref: None } => ended_by_hand(
            EventState::Delivered,
            None,
            (OperationState::Completed, AuditEvent::Completed),
            Settlement::CompletedByHand,
            by,
        ),
        Resolved::Failed { .. } => ended_by_hand(
            EventState::Failed,
            Some(FAILED_BY_HAND),
            (OperationState::Failed, AuditEvent::Failed),
            Settlement::FailedByHand,
            by,
        ),
    }
}

/// An operation a person ended with no external reference, journaled
/// `resolved` and then its end.
fn ended_by_hand<'a>(
    event: EventState,
    last_error: Option<&'a str>,
    (operation, end): (OperationState, AuditEvent),
    business: Settlement<'a>,
    by: &'a str,
) -> Plan<'a> {
    Plan {
        event,
        external_ref: None,
        last_error,
        due: Due::AfterReconcileWait,
        settles: Some(Settles {
            operation,
            business,
            journal: vec![(AuditEvent::Resolved, by), (end, by)],
        }),
        wake_worker: false,
        failure: false,
    }
}

fn accepted<'a>(external_ref: &'a str, found: AuditEvent, by: &'a str, completes: bool) -> Plan<'a> {
    let (operation, journal) = if completes {
        (
            OperationState::Completed,
            vec![(found, by), (AuditEvent::Completed, by)],
        )
    } else {
        (OperationState::InProgress, vec![(found, by)])
    };
    Plan {
        event: EventState::Delivered,
        external_ref: Some(external_ref),
        last_error: None,
        due: Due::AfterReconcileWait,
        settles: Some(Settles {
            operation,
            business: Settlement::Accepted { external_ref },
            journal,
        }),
        wake_worker: false,
        failure: false,
    }
}

fn unknown<'a>(reason: &'a str, by: &'a str) -> Plan<'a> {
    Plan {
        failure: true,
        ..settled(
            EventState::Unknown,
            reason,
            OperationState::Unknown,
            Settlement::Unknown,
            (AuditEvent::Unknown, by),
        )
    }
}

/// An event settled with no external reference (failed, or unknown), its
/// operation with it.
fn settled<'a>(
    event: EventState,
    reason: &'a str,
    operation: OperationState,
    business: Settlement<'a>,
    journaled: (AuditEvent, &'a str),
) -> Plan<'a> {
    Plan {
        event,
        external_ref: None,
        last_error: Some(reason),
        due: Due::AfterReconcileWait,
        settles: Some(Settles {
            operation,
            business,
            journal: vec![journaled],
        }),
        wake_worker: false,
        failure: false,
    }
}

/// An event given back to be tried again, which counts as one failure; its
/// operation does not change.
fn again(event: EventState, reason: &str, due: Due) -> Plan<'_> {
    Plan {
        event,
        external_ref: None,
        last_error: Some(reason),
        due,
        settles: None,
        wake_worker: false,
        failure: true,
    }
}

#[cfg(test)]
mod tests;

//! The settlement plan: what each outcome of a delivery or a lookup writes to
//! the event, its operation, the service's rows and the journal, and when the
//! event is due again. One pure function for the worker and the reconciler,
//! so the tables of the module's map (and of docs/contract.md §5) are decided
//! in one place and tested row by row.

use super::{Delivery, EventState, Lookup, RECONCILER, Settlement, WORKER};
use crate::{audit::AuditEvent, operation::OperationState};

/// What handling an event came to: the worker's delivery, or the reconciler's lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
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
    /// The reconciler could not ask. `sending`: the event was taken from a
    /// worker that died holding it, so nobody has said yet that it is unknown.
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
    /// What the reconciler's lookup of an event that was in `state` came to.
    pub(super) fn looked_up(found: Result<Lookup, String>, state: EventState) -> Self {
        match found {
            Ok(Lookup::Found { external_ref }) => Outcome::Found { external_ref },
            Ok(Lookup::Absent) => Outcome::Absent,
            Err(reason) => Outcome::NotAsked {
                reason,
                sending: state == EventState::Sending,
            },
        }
    }
}

/// What an outcome writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plan<'a> {
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
}

/// What settling an event writes beyond the event itself, in the same transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Settles<'a> {
    pub operation: OperationState,
    /// What the service's [`Destination::settle`](super::Destination::settle) is told.
    pub business: Settlement<'a>,
    /// Journaled in this order, each with the plan's `external_ref` (after the
    /// `dispatched` the worker journaled when it took the event).
    pub journal: Vec<(AuditEvent, &'static str)>,
}

/// When an event is due again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    /// At once.
    Now,
    /// After the doubling, jittered backoff for its deliveries.
    AfterBackoff,
    /// After `reconcile_after`: an unknown event is asked about then, while
    /// a delivered or failed one is never taken again.
    AfterReconcileWait,
}

/// The plan for `outcome`. `completes_on_acceptance`: the destination's
/// [`completes_on_acceptance`](super::Destination::completes_on_acceptance)
/// for the event — work that goes on at the external system keeps its
/// operation in progress after it was accepted.
pub(super) fn plan(outcome: &Outcome, completes_on_acceptance: bool) -> Plan<'_> {
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
            ..again(EventState::Pending, "not found by the reconciler", Due::Now)
        },
        Outcome::NotAsked { reason, sending: false } => again(EventState::Unknown, reason, Due::AfterBackoff),
    }
}

fn accepted<'a>(external_ref: &'a str, found: AuditEvent, by: &'static str, completes: bool) -> Plan<'a> {
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
    }
}

fn unknown<'a>(reason: &'a str, by: &'static str) -> Plan<'a> {
    settled(
        EventState::Unknown,
        reason,
        OperationState::Unknown,
        Settlement::Unknown,
        (AuditEvent::Unknown, by),
    )
}

/// An event settled with no external reference (failed, or unknown), its
/// operation with it.
fn settled<'a>(
    event: EventState,
    reason: &'a str,
    operation: OperationState,
    business: Settlement<'a>,
    journaled: (AuditEvent, &'static str),
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
    }
}

/// An event given back to be tried again; its operation does not change.
fn again(event: EventState, reason: &str, due: Due) -> Plan<'_> {
    Plan {
        event,
        external_ref: None,
        last_error: Some(reason),
        due,
        settles: None,
        wake_worker: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AuditEvent as A;
    use EventState as E;
    use OperationState as O;

    fn reason() -> String {
        "why".to_owned()
    }

    fn external_ref() -> String {
        "ref_1".to_owned()
    }

    /// A row of the table, its columns in the order the table's doc names them.
    type Row = (
        Outcome,
        Option<bool>,
        E,
        Option<&'static str>,
        Option<&'static str>,
        Due,
        Option<(O, Settlement<'static>)>,
        Vec<(A, &'static str)>,
        bool,
    );

    /// Every outcome, with the destination's `completes_on_acceptance` (`None`:
    /// either), and what it writes: the event's state, `external_ref` and
    /// `last_error`, when it is due, the operation's state, the service's
    /// settlement, the journal, and whether the worker is woken.
    #[rustfmt::skip]
    fn table() -> Vec<Row> {
        use Due::*;
        let accepted = Settlement::Accepted { external_ref: "ref_1" };
        let refused = Settlement::Refused { reason: "why" };
        let (r, x) = (Some("why"), Some("ref_1"));
        vec![
            (Outcome::Accepted { external_ref: external_ref() }, Some(true),
             E::Delivered, x, None, AfterReconcileWait, Some((O::Completed, accepted)),
             vec![(A::Accepted, WORKER), (A::Completed, WORKER)], false),
            (Outcome::Accepted { external_ref: external_ref() }, Some(false),
             E::Delivered, x, None, AfterReconcileWait, Some((O::InProgress, accepted)),
             vec![(A::Accepted, WORKER)], false),
            (Outcome::Refused { reason: reason() }, None,
             E::Failed, None, r, AfterReconcileWait, Some((O::Failed, refused)),
             vec![(A::Failed, WORKER)], false),
            (Outcome::NotAccepted { reason: reason() }, None,
             E::Pending, None, r, AfterBackoff, None,
             vec![], false),
            (Outcome::AnswerLost { reason: reason() }, None,
             E::Unknown, None, r, AfterReconcileWait, Some((O::Unknown, Settlement::Unknown)),
             vec![(A::Unknown, WORKER)], false),
            (Outcome::Found { external_ref: external_ref() }, Some(true),
             E::Delivered, x, None, AfterReconcileWait, Some((O::Completed, accepted)),
             vec![(A::Reconciled, RECONCILER), (A::Completed, RECONCILER)], false),
            (Outcome::Found { external_ref: external_ref() }, Some(false),
             E::Delivered, x, None, AfterReconcileWait, Some((O::InProgress, accepted)),
             vec![(A::Reconciled, RECONCILER)], false),
            (Outcome::Absent, None,
             E::Pending, None, Some("not found by the reconciler"), Now, None,
             vec![], true),
            (Outcome::NotAsked { reason: reason(), sending: true }, None,
             E::Unknown, None, r, AfterReconcileWait, Some((O::Unknown, Settlement::Unknown)),
             vec![(A::Unknown, RECONCILER)], false),
            (Outcome::NotAsked { reason: reason(), sending: false }, None,
             E::Unknown, None, r, AfterBackoff, None,
             vec![], false),
        ]
    }

    #[test]
    fn every_outcome_writes_what_its_row_says() {
        for (outcome, completes, event, external_ref, last_error, due, settles, journal, wake_worker) in table() {
            let expected = Plan {
                event,
                external_ref,
                last_error,
                due,
                settles: settles.map(|(operation, business)| Settles {
                    operation,
                    business,
                    journal: journal.clone(),
                }),
                wake_worker,
            };
            for completes in completes.map_or(vec![true, false], |c| vec![c]) {
                assert_eq!(
                    plan(&outcome, completes),
                    expected,
                    "{outcome:?}, completes: {completes}"
                );
            }
        }
    }

    #[test]
    fn the_table_has_a_row_for_every_outcome() {
        let rows = table();
        let has = |matches: fn(&Outcome) -> bool| rows.iter().any(|row| matches(&row.0));
        assert!(has(|o| matches!(o, Outcome::Accepted { .. })));
        assert!(has(|o| matches!(o, Outcome::Refused { .. })));
        assert!(has(|o| matches!(o, Outcome::NotAccepted { .. })));
        assert!(has(|o| matches!(o, Outcome::AnswerLost { .. })));
        assert!(has(|o| matches!(o, Outcome::Found { .. })));
        assert!(has(|o| matches!(o, Outcome::Absent)));
        assert!(has(|o| matches!(o, Outcome::NotAsked { sending: true, .. })));
        assert!(has(|o| matches!(o, Outcome::NotAsked { sending: false, .. })));
    }

    #[test]
    fn a_failed_lookup_is_unknown_only_for_an_event_a_dead_worker_held() {
        let failed = || Err(reason());
        assert_eq!(
            Outcome::looked_up(failed(), E::Sending),
            Outcome::NotAsked {
                reason: reason(),
                sending: true
            }
        );
        assert_eq!(
            Outcome::looked_up(failed(), E::Unknown),
            Outcome::NotAsked {
                reason: reason(),
                sending: false
            }
        );
        assert_eq!(
            Outcome::looked_up(
                Ok(Lookup::Found {
                    external_ref: external_ref()
                }),
                E::Unknown
            ),
            Outcome::Found {
                external_ref: external_ref()
            }
        );
        assert_eq!(Outcome::looked_up(Ok(Lookup::Absent), E::Sending), Outcome::Absent);
    }
}

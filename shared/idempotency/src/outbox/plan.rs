//! The settlement plan: what each outcome of a delivery or a lookup writes to
//! the event, its operation, the service's rows and the journal, and when the
//! event is due again. One pure function for the worker and the reconciler,
//! so the tables of the module's map (and of docs/contract.md §5) are decided
//! in one place and tested row by row.

use super::{Delivery, EventState, Lookup, RECONCILER, Resolution, Resolved, Settlement, WORKER};
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
    /// Who came to it: the worker delivering, or the reconciler asking.
    pub(super) fn by(&self) -> &'static str {
        match self {
            Outcome::Accepted { .. }
            | Outcome::Refused { .. }
            | Outcome::NotAccepted { .. }
            | Outcome::AnswerLost { .. } => WORKER,
            Outcome::Found { .. } | Outcome::Absent | Outcome::NotAsked { .. } => RECONCILER,
        }
    }

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
    /// Whether it counts towards the event's failures: it came to nothing
    /// known (not accepted, the answer lost, the external system not asked).
    pub failure: bool,
}

impl Plan<'_> {
    /// The event's state and failures once this plan is written over
    /// `failures` earlier ones: at `max_failures` a failure makes it `dead`,
    /// and its operation stays as the plan leaves it.
    pub(super) fn event_after(&self, failures: i32, max_failures: i32) -> (EventState, i32) {
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
pub(super) struct Settles<'a> {
    pub operation: OperationState,
    /// What the service's [`Destination::settle`](super::Destination::settle) is told.
    pub business: Settlement<'a>,
    /// Journaled in this order, each with the plan's `external_ref` (after the
    /// `dispatched` the worker journaled when it took the event), by whom.
    pub journal: Vec<(AuditEvent, &'a str)>,
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
            failure: false,
            ..again(EventState::Pending, "not found by the reconciler", Due::Now)
        },
        Outcome::NotAsked { reason, sending: false } => again(EventState::Unknown, reason, Due::AfterBackoff),
    }
}

/// The event's `last_error` once a person settled it as failed: their
/// evidence is in the journal, for those who may read it.
pub(super) const FAILED_BY_HAND: &str = "settled as failed by a person";

/// What a person's settling of an operation whose outcome was unknown writes
/// ([`resolve`](super::resolve)): what the reconciler writes when it finds the
/// work done (`external_ref`) or refused, journaled `resolved` by `by` first.
pub(super) fn resolved<'a>(resolution: &'a Resolution, by: &'a str, completes_on_acceptance: bool) -> Plan<'a> {
    match &resolution.outcome {
        Resolved::Completed { external_ref } => {
            accepted(external_ref, AuditEvent::Resolved, by, completes_on_acceptance)
        }
        Resolved::Failed => {
            let mut failed = settled(
                EventState::Failed,
                FAILED_BY_HAND,
                OperationState::Failed,
                Settlement::FailedByHand,
                (AuditEvent::Resolved, by),
            );
            if let Some(settles) = &mut failed.settles {
                settles.journal.push((AuditEvent::Failed, by));
            }
            failed
        }
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
        bool,
    );

    /// Every outcome, with the destination's `completes_on_acceptance` (`None`:
    /// either), and what it writes: the event's state, `external_ref` and
    /// `last_error`, when it is due, the operation's state, the service's
    /// settlement, the journal, whether the worker is woken, and whether it
    /// counts as a failure.
    #[rustfmt::skip]
    fn table() -> Vec<Row> {
        use Due::*;
        let accepted = Settlement::Accepted { external_ref: "ref_1" };
        let refused = Settlement::Refused { reason: "why" };
        let (r, x) = (Some("why"), Some("ref_1"));
        vec![
            (Outcome::Accepted { external_ref: external_ref() }, Some(true),
             E::Delivered, x, None, AfterReconcileWait, Some((O::Completed, accepted)),
             vec![(A::Accepted, WORKER), (A::Completed, WORKER)], false, false),
            (Outcome::Accepted { external_ref: external_ref() }, Some(false),
             E::Delivered, x, None, AfterReconcileWait, Some((O::InProgress, accepted)),
             vec![(A::Accepted, WORKER)], false, false),
            (Outcome::Refused { reason: reason() }, None,
             E::Failed, None, r, AfterReconcileWait, Some((O::Failed, refused)),
             vec![(A::Failed, WORKER)], false, false),
            (Outcome::NotAccepted { reason: reason() }, None,
             E::Pending, None, r, AfterBackoff, None,
             vec![], false, true),
            (Outcome::AnswerLost { reason: reason() }, None,
             E::Unknown, None, r, AfterReconcileWait, Some((O::Unknown, Settlement::Unknown)),
             vec![(A::Unknown, WORKER)], false, true),
            (Outcome::Found { external_ref: external_ref() }, Some(true),
             E::Delivered, x, None, AfterReconcileWait, Some((O::Completed, accepted)),
             vec![(A::Reconciled, RECONCILER), (A::Completed, RECONCILER)], false, false),
            (Outcome::Found { external_ref: external_ref() }, Some(false),
             E::Delivered, x, None, AfterReconcileWait, Some((O::InProgress, accepted)),
             vec![(A::Reconciled, RECONCILER)], false, false),
            (Outcome::Absent, None,
             E::Pending, None, Some("not found by the reconciler"), Now, None,
             vec![], true, false),
            (Outcome::NotAsked { reason: reason(), sending: true }, None,
             E::Unknown, None, r, AfterReconcileWait, Some((O::Unknown, Settlement::Unknown)),
             vec![(A::Unknown, RECONCILER)], false, true),
            (Outcome::NotAsked { reason: reason(), sending: false }, None,
             E::Unknown, None, r, AfterBackoff, None,
             vec![], false, true),
        ]
    }

    #[test]
    fn every_outcome_writes_what_its_row_says() {
        for (outcome, completes, event, external_ref, last_error, due, settles, journal, wake_worker, failure) in
            table()
        {
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
                failure,
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

    #[test]
    fn an_event_is_dead_at_its_last_allowed_failure_and_not_before() {
        let lost = Outcome::AnswerLost { reason: reason() };
        let lost = plan(&lost, true);
        assert_eq!(lost.event_after(0, 3), (E::Unknown, 1));
        assert_eq!(lost.event_after(1, 3), (E::Unknown, 2));
        assert_eq!(lost.event_after(2, 3), (E::Dead, 3));
        let absent = plan(&Outcome::Absent, true);
        assert_eq!(absent.event_after(2, 3), (E::Pending, 2), "a resend is not a failure");
        let found = Outcome::Found {
            external_ref: external_ref(),
        };
        assert_eq!(plan(&found, true).event_after(9, 3), (E::Delivered, 9));
    }

    #[test]
    fn a_resolution_writes_what_the_reconciler_would_after_a_resolved_entry_by_the_person() {
        let completed = Resolution {
            outcome: Resolved::Completed {
                external_ref: external_ref(),
            },
            evidence: "seen in the provider's dashboard".to_owned(),
        };
        let by = "key_admin";
        let found = Outcome::Found {
            external_ref: external_ref(),
        };
        let found = plan(&found, true);
        let by_hand = resolved(&completed, by, true);
        assert_eq!((by_hand.event, by_hand.external_ref), (found.event, found.external_ref));
        let settles = by_hand.settles.unwrap();
        assert_eq!(
            (settles.operation, settles.business),
            (O::Completed, Settlement::Accepted { external_ref: "ref_1" })
        );
        assert_eq!(settles.journal, vec![(A::Resolved, by), (A::Completed, by)]);
        let rollout = resolved(&completed, by, false).settles.unwrap();
        assert_eq!(
            (rollout.operation, rollout.journal),
            (O::InProgress, vec![(A::Resolved, by)]),
            "a rollout goes on, as if found"
        );

        let failed = Resolution {
            outcome: Resolved::Failed,
            evidence: "no charge at the provider".to_owned(),
        };
        let by_hand = resolved(&failed, by, true);
        assert_eq!(by_hand.event, E::Failed);
        assert_eq!(
            by_hand.last_error,
            Some(FAILED_BY_HAND),
            "the evidence stays in the journal"
        );
        let settles = by_hand.settles.unwrap();
        assert_eq!(settles.operation, O::Failed);
        assert_eq!(settles.business, Settlement::FailedByHand);
        assert_eq!(settles.journal, vec![(A::Resolved, by), (A::Failed, by)]);
    }
}

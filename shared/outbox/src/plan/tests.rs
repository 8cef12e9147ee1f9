//! Every row of the settlement tables, and the plans of dead letters and of a
//! person's resolution.

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
    for (outcome, completes, event, external_ref, last_error, due, settles, journal, wake_worker, failure) in table() {
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
            external_ref: Some(external_ref()),
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
        outcome: Resolved::Failed {
            external_ref: Some("declined_1".to_owned()),
        },
        evidence: "a declined charge at the provider".to_owned(),
    };
    let by_hand = resolved(&failed, by, true);
    assert_eq!(by_hand.event, E::Failed);
    assert_eq!(
        by_hand.external_ref, None,
        "what the person named is their note, for the journal: no row keeps it"
    );
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

#[test]
fn a_completed_resolution_without_a_reference_ends_the_operation_and_leaves_no_external_id() {
    let completed = Resolution {
        outcome: Resolved::Completed { external_ref: None },
        evidence: "the bank statement shows the payment".to_owned(),
    };
    let by = "key_admin";
    for completes_on_acceptance in [true, false] {
        let by_hand = resolved(&completed, by, completes_on_acceptance);
        assert_eq!((by_hand.event, by_hand.external_ref), (E::Delivered, None));
        let settles = by_hand.settles.unwrap();
        assert_eq!(
            (settles.operation, settles.business),
            (O::Completed, Settlement::CompletedByHand),
            "nothing follows it at the external system, so even a rollout ends here"
        );
        assert_eq!(settles.journal, vec![(A::Resolved, by), (A::Completed, by)]);
    }
}

#[test]
fn something_under_the_key_that_is_not_the_event_s_work_is_left_to_a_person_as_if_not_asked() {
    let mismatch = || {
        Ok(Lookup::Mismatch {
            external_ref: external_ref(),
            reason: reason(),
        })
    };
    assert_eq!(
        Outcome::looked_up(mismatch(), E::Unknown),
        Outcome::NotAsked {
            reason: reason(),
            sending: false
        }
    );
    assert_eq!(
        Outcome::looked_up(mismatch(), E::Sending),
        Outcome::NotAsked {
            reason: reason(),
            sending: true
        }
    );
}

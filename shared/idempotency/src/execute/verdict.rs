//! What an attempt does when it finds its key taken: a pure function of what is stored and what the
//! attempt brings, so that every row of the outcomes table (docs/contract.md §3) is one line of a test.

use platform::Timestamp;

use crate::{fingerprint::Fingerprint, gate::ApprovalState, operation::OperationState};

/// What is stored for a key, as far as the verdict needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stored<'a> {
    pub fingerprint: &'a Fingerprint,
    pub state: OperationState,
    /// Until when an attempt holds it, if one does.
    pub locked_until: Option<Timestamp>,
    pub answered: bool,
    /// Where it stands at its gate (its approval), if it waits there.
    pub approval: Option<ApprovalState>,
}

/// What the attempt brings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asking<'a> {
    pub fingerprint: &'a Fingerprint,
    pub now: Timestamp,
    /// It may run the operation itself (take over a dead lease, start an approved run); not once it waited.
    pub may_run: bool,
    /// It asked to wait for the answer (`Prefer: wait`) and its time is not up.
    pub may_wait: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// 422 `idempotency_key_reused`: the key names another request.
    KeyReused,
    /// The stored answer: a finished operation's, the 202 of handed-on work, or the approval request.
    Replay,
    /// 409 `request_in_progress`: an attempt holds it.
    InProgress,
    /// Look again shortly (`Prefer: wait`).
    Wait,
    /// Its holder's lease ran out: take it over and run it.
    TakeOver,
    /// A human approved it: start the run.
    StartApproved,
    /// Its approval expired: settle the operation as rejected, then look again.
    Expire,
    /// 409 `operation_outcome_unknown`: an external effect may have happened and no answer is stored.
    OutcomeUnknown,
}

pub(crate) fn verdict(stored: &Stored<'_>, asking: &Asking<'_>) -> Verdict {
    if stored.fingerprint != asking.fingerprint {
        return Verdict::KeyReused;
    }
    let lease_expired = stored.locked_until.is_some_and(|until| until <= asking.now);
    match stored.state {
        // no attempt holds it: its work went to the outbox after the first answer
        OperationState::InProgress if stored.locked_until.is_none() => Verdict::Replay,
        OperationState::InProgress if asking.may_run && lease_expired => Verdict::TakeOver,
        OperationState::InProgress if asking.may_wait => Verdict::Wait,
        OperationState::InProgress => Verdict::InProgress,
        OperationState::AwaitingApproval => match stored.approval {
            Some(ApprovalState::Expired) => Verdict::Expire,
            Some(ApprovalState::Approved) if asking.may_run => Verdict::StartApproved,
            // pending, or decided a moment ago and not settled yet: the approval request again
            _ => Verdict::Replay,
        },
        OperationState::Unknown if !stored.answered => Verdict::OutcomeUnknown,
        // an unknown outcome whose first answer (a 202) is stored keeps replaying it
        OperationState::Unknown | OperationState::Completed | OperationState::Failed | OperationState::Rejected => {
            Verdict::Replay
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    // the operation's state `in_progress` is `Running` here, beside the verdict `InProgress`
    use OperationState::{AwaitingApproval, Completed, Failed, InProgress as Running, Rejected, Unknown};
    use Verdict::*;

    fn fingerprint(c: char) -> Fingerprint {
        Fingerprint::from_stored(c.to_string().repeat(64))
    }

    /// The attempt: by default it sends the stored request, may run it, and does not wait.
    #[derive(Clone, Copy)]
    struct Ask {
        changed: bool,
        may_run: bool,
        may_wait: bool,
    }

    const AS_IS: Ask = Ask {
        changed: false,
        may_run: true,
        may_wait: false,
    };

    /// The verdict for `ask`, given what is stored (`lease`: seconds left, negative when it ran out).
    fn for_stored(
        state: OperationState,
        lease: Option<i64>,
        answered: bool,
        approval: Option<ApprovalState>,
        ask: Ask,
    ) -> Verdict {
        let now = Timestamp::now();
        let stored_fingerprint = fingerprint('a');
        let sent = fingerprint(if ask.changed { 'b' } else { 'a' });
        let locked_until = lease.map(|seconds| {
            if seconds >= 0 {
                now.plus(Duration::from_secs(seconds.unsigned_abs()))
            } else {
                now.minus(Duration::from_secs(seconds.unsigned_abs()))
            }
        });
        let stored = Stored {
            fingerprint: &stored_fingerprint,
            state,
            locked_until,
            answered,
            approval,
        };
        let asking = Asking {
            fingerprint: &sent,
            now,
            may_run: ask.may_run,
            may_wait: ask.may_wait,
        };
        verdict(&stored, &asking)
    }

    #[test]
    fn a_finished_operation_replays_its_stored_answer() {
        for state in [Completed, Failed, Rejected] {
            assert_eq!(for_stored(state, None, true, None, AS_IS), Replay, "{state:?}");
        }
    }

    #[test]
    fn another_request_under_the_key_is_refused_whatever_the_operation_is_doing() {
        for (state, lease) in [
            (Completed, None),
            (Running, Some(30)),
            (Running, Some(-1)),
            (Unknown, None),
        ] {
            let got = for_stored(state, lease, true, None, Ask { changed: true, ..AS_IS });
            assert_eq!(got, KeyReused, "{state:?}");
        }
    }

    #[test]
    fn a_running_operation_is_409_unless_the_attempt_may_wait_for_it() {
        assert_eq!(for_stored(Running, Some(30), false, None, AS_IS), InProgress);
        assert_eq!(
            for_stored(
                Running,
                Some(30),
                false,
                None,
                Ask {
                    may_wait: true,
                    ..AS_IS
                }
            ),
            Wait
        );
    }

    #[test]
    fn a_dead_holders_lease_is_taken_over_only_by_an_attempt_that_may_run() {
        assert_eq!(for_stored(Running, Some(-1), false, None, AS_IS), TakeOver);
        assert_eq!(
            for_stored(
                Running,
                Some(-1),
                false,
                None,
                Ask {
                    may_run: false,
                    ..AS_IS
                }
            ),
            InProgress
        );
    }

    #[test]
    fn work_handed_to_the_outbox_replays_its_first_answer_while_it_runs_and_after() {
        assert_eq!(for_stored(Running, None, true, None, AS_IS), Replay);
        assert_eq!(for_stored(Unknown, None, true, None, AS_IS), Replay);
    }

    #[test]
    fn an_unknown_outcome_with_no_stored_answer_is_never_run_again() {
        assert_eq!(for_stored(Unknown, None, false, None, AS_IS), OutcomeUnknown);
    }

    #[test]
    fn an_operation_awaiting_approval_replays_the_request_until_approved_then_runs_once() {
        let approval = |state| for_stored(AwaitingApproval, None, true, Some(state), AS_IS);

        assert_eq!(approval(ApprovalState::Pending), Replay);
        assert_eq!(approval(ApprovalState::Approved), StartApproved);
        assert_eq!(approval(ApprovalState::Expired), Expire);
        assert_eq!(
            for_stored(
                AwaitingApproval,
                None,
                true,
                Some(ApprovalState::Approved),
                Ask {
                    may_run: false,
                    ..AS_IS
                }
            ),
            Replay,
            "an attempt that may not run it is answered with the approval request"
        );
    }
}

//! Approvals bound to the exact operation (docs/contract.md §6).
//!
//! A route's policy decides, from the validated command, that a human must
//! look first, and says what the human judges ([`ApprovalSummary`]). Such an
//! attempt claims the key *as* `awaiting_approval` with an approval record,
//! and answers 202 with the approval request; matching retries get that 202
//! back. An approver of the same account — never the requester — decides,
//! echoing the fingerprint they saw.
//!
//! **An approved operation runs on the next matching retry**, not at once:
//! the service keeps no request bodies, so only a retry carries the command
//! again — and its fingerprint must still be the approved one (a changed
//! body is another fingerprint, so another operation with its own approval).
//! The attempt that runs it re-checks, inside the transaction of the effect,
//! that the approval is this operation's, for this fingerprint, approved and
//! not expired — and that what the summary promised still holds: the summary
//! the policy writes for this retry must be the one approved, and an effect
//! holds, in its transaction, whatever of it can still change (the release a
//! deployment replaces), answering [`stale`] when it no longer holds. A
//! rejection, an approval that expires (pending, or approved but not run in
//! time), or a promise broken leaves the operation `rejected` with 409
//! `approval_rejected` / `approval_expired` / `approval_stale` as its stored
//! answer.
//!
//! One idea a file: `record`, the approval and its states; `summary`, what a
//! human judges, shown so that nothing hides in it; `view`, what an approval
//! answers (the 202 request, the approver's view, the refusal); `store`, the
//! approvals table's statements; `decide`, who may decide, on which
//! fingerprint, and how an operation ends when refused or expired.

mod decide;
mod extension;
mod record;
mod store;
mod summary;
mod view;

pub use decide::may_decide;
pub use extension::Approvals;
pub use record::{ApprovalRecord, ApprovalState, Decision, approval_url, new_approval_id};
pub use store::{ExecutionCheck, count, find, list};
pub(crate) use store::{check_for_execution, count_by_state, insert};
pub use summary::{ApprovalSummary, Revealed, is_hidden};
pub use view::{AcceptedOrAwaitingApproval, ApprovalRequested, ApprovalView, refusal, stale};
pub(crate) use view::{is_stale, refused_operation};

//! Approvals bound to the exact operation (docs/contract.md §6;
//! docs/design.md §7): the idempotency core's gate ([`idempotency::gate`]).
//!
//! A route's policy decides, from the validated command, that a human must
//! look first, and says what the human judges ([`ApprovalSummary`], given to
//! [`Attempt::approval`](idempotency::Attempt::approval)). Such an attempt
//! claims the key *as* `awaiting_approval` with an approval record, and
//! answers 202 with the approval request; matching retries get that 202
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
//! A service's layer takes approvals as its gate
//! (`Idempotency::new(…).with_gate(Approvals)`), and the service merges
//! [`routes()`] and documents [`ApprovalsApi`]. The crate depends on the
//! `idempotency` core, never the reverse, and on no other extension (its
//! tests read what it journals through the journal, a test dependency). The
//! core keeps the operation's side: its state `awaiting_approval`, its
//! `approval_id`, the statements on them, how long an operation may wait
//! (`IdempotencyConfig::approval_ttl`), and the [`ApprovalState`] its pure
//! verdict reads. The approvals table stays in the core's migrations
//! (`migrations/idempotency`, `idempotency::MIGRATIONS`): moving a migration
//! already applied to another migrator would break every existing database.
//!
//! One idea a file: `record`, the approval and the decision; `summary`,
//! what a human judges, shown so that nothing hides in it; `view`, what an
//! approval answers (the 202 request, the approver's view, the refusal);
//! `store`, the approvals table's statements; `decide`, who may decide, on
//! which fingerprint, and how an operation ends when refused or expired;
//! `gate`, approvals as the core's gate; `extension`, as the core's
//! extension (the approval in an operation's status, the gauges, expiry in
//! the background); `routes`, the list, one approval, and the decision.

mod decide;
mod extension;
mod gate;
mod record;
pub mod routes;
mod store;
mod summary;
mod view;

pub use decide::{decide, expire_due, may_decide};
pub use idempotency::gate::ApprovalState;
pub use record::{ApprovalRecord, Decision, approval_url, new_approval_id};
pub use routes::{ApprovalsApi, routes};
pub use store::{count, find, list};
pub use summary::{ApprovalSummary, Revealed, is_hidden};
pub use view::{AcceptedOrAwaitingApproval, ApprovalRequested, ApprovalView, refusal, stale};

/// Approvals, as a service's layer takes them: its gate, which also shows
/// the approval in an operation's status, counts approvals for `/metrics`,
/// and expires those past their time in the background.
#[derive(Debug, Clone, Copy, Default)]
pub struct Approvals;

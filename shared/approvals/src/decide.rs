//! Deciding an approval: only an approver of the account, never the
//! requester, and only on the fingerprint they were shown; and how an
//! operation ends when its approval is rejected or runs out.

use axum::http::StatusCode;
use platform::metrics::names;
use platform::{ApiError, Principal, Role, Timestamp, Tx};

use idempotency::{
    Idempotency, OperationIdentity, OperationState,
    gate::ApprovalState,
    responses::problem_response,
    store::Completion,
    transitions::{AuditEvent, Record},
};

use crate::{
    ApprovalRecord, ApprovalView, Decision, refusal,
    store::{due, find, record_decision, record_expiry},
};

/// Who records an expiry in the journal: nobody decided.
const EXPIRY_PRINCIPAL: &str = "retrysafe:expiry";

/// `POST /v1/approvals/{id}/decision`: an approver's decision, bound to
/// the fingerprint they saw. Repeating the decision already made by the
/// same approver answers it again (a lost response is retried safely);
/// any other decision on a decided approval is 409 `invalid_state`.
pub async fn decide(
    idempotency: &Idempotency,
    principal: &Principal,
    approval_id: &str,
    decision: Decision,
    echoed_fingerprint: &str,
) -> Result<ApprovalView, ApiError> {
    may_decide(principal)?;
    let db = idempotency.db();
    let not_found = || ApiError::not_found(format!("approval `{approval_id}`"));
    let approval = find(db, &principal.account_id, approval_id)
        .await?
        .ok_or_else(not_found)?;
    if approval.requested_by == principal.principal_id {
        return Err(ApiError::forbidden(
            "the principal that requested an operation may not approve it; another approver must decide",
        ));
    }
    if approval.state(Timestamp::now()) != ApprovalState::Pending {
        return answer_decided(idempotency, approval, principal, decision).await;
    }
    if echoed_fingerprint != approval.fingerprint.as_str() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "approval_fingerprint_mismatch",
            "Fingerprint mismatch",
            "the fingerprint sent is not the operation's: the decision must be about the exact request waiting. Nothing was decided",
        )
        .with("approval_id", &approval.approval_id)
        .with("fingerprint", approval.fingerprint.as_str()));
    }

    let mut tx = idempotency.begin().await?;
    // the time of the decision is taken once the write lock is held
    let now = Timestamp::now();
    if !record_decision(
        &mut tx,
        &approval,
        decision.state(),
        &principal.principal_id,
        echoed_fingerprint,
        now,
    )
    .await?
    {
        // decided (by this very decision sent twice at once, too) or expired between the read and the write
        let _ = tx.rollback().await;
        let current = find(db, &principal.account_id, approval_id)
            .await?
            .ok_or_else(not_found)?;
        return answer_decided(idempotency, current, principal, decision).await;
    }
    let event = match decision {
        Decision::Approve => AuditEvent::Approved,
        Decision::Reject => AuditEvent::Rejected,
    };
    if decision == Decision::Reject {
        // the operation ends here: its answer from now on is the refusal
        settle(&mut tx, &approval, ApprovalState::Rejected, now).await?;
    }
    idempotency
        .transitions()
        .record(&mut tx, &[approval.audit(event, &principal.principal_id, now)])
        .await?;
    tx.commit().await?;
    let waited = (now.as_datetime() - approval.created_at.as_datetime())
        .to_std()
        .unwrap_or_default();
    idempotency.metrics().observe(
        names::APPROVAL_DECISION,
        &[("decision", decision.state().into_str())],
        waited,
    );
    let decided = find(db, &principal.account_id, approval_id)
        .await?
        .ok_or_else(not_found)?;
    Ok(ApprovalView::of(decided, Timestamp::now()))
}

/// The answer to a decision on an approval that is no longer pending. The
/// same approver repeating the decision made gets it again, however the
/// repeats interleave (a lost response retried, a request sent twice at
/// once); any other decision is 409 `invalid_state`, and one on an
/// approval past its expiry is the `approval_expired` refusal.
async fn answer_decided(
    idempotency: &Idempotency,
    approval: ApprovalRecord,
    principal: &Principal,
    decision: Decision,
) -> Result<ApprovalView, ApiError> {
    let now = Timestamp::now();
    match approval.state(now) {
        ApprovalState::Expired => {
            expire(idempotency, &approval).await?;
            Err(refusal(
                ApprovalState::Expired,
                &approval.operation_id,
                &approval.approval_id,
            ))
        }
        decided if decided == decision.state() && approval.decided_by.as_deref() == Some(&principal.principal_id) => {
            Ok(ApprovalView::of(approval, now))
        }
        state => Err(ApiError::invalid_state(format!(
            "this approval is {}; a decision is made once",
            state.into_str()
        ))
        .with("approval_id", &approval.approval_id)
        .with("state", state)),
    }
}

/// Ends an operation whose approval ran out, in a transaction of its own
/// (see [`end_expired`]).
pub(crate) async fn expire(idempotency: &Idempotency, approval: &ApprovalRecord) -> Result<(), sqlx::Error> {
    let mut tx = idempotency.begin().await?;
    match end_expired(&mut tx, approval, Timestamp::now()).await? {
        Some(ended) => {
            idempotency.transitions().record(&mut tx, &[ended]).await?;
            tx.commit().await
        }
        None => tx.rollback().await,
    }
}

/// Ends an operation whose approval ran out as of `now`, in `tx`: a pending
/// approval is marked expired; the operation, if it still waits (an
/// approved one no retry ran in time, too), becomes `rejected` with the
/// `approval_expired` answer. What to journal of it; `None` if it was
/// decided, or started, meanwhile, and nothing is to be kept of `tx`.
pub(crate) async fn end_expired(
    tx: &mut Tx,
    approval: &ApprovalRecord,
    now: Timestamp,
) -> Result<Option<Record>, sqlx::Error> {
    if approval.expires_at > now {
        return Ok(None);
    }
    let pending = approval.decision.is_none();
    if pending && !record_expiry(tx, approval, now).await? {
        // decided between the read and now: the decision stands
        return Ok(None);
    }
    // compare-and-set on `awaiting_approval`: an approved operation a retry just started is left to run
    let settled = settle(tx, approval, ApprovalState::Expired, now).await?;
    if !pending && !settled {
        return Ok(None);
    }
    Ok(Some(approval.audit(AuditEvent::Expired, EXPIRY_PRINCIPAL, now)))
}

/// Expires every approval past its time whose operation still waits (the
/// layer's background work runs it every round); how many there were.
pub async fn expire_due(idempotency: &Idempotency) -> Result<usize, sqlx::Error> {
    let due = due(idempotency.db(), Timestamp::now(), 500).await?;
    for approval in &due {
        expire(idempotency, approval).await?;
    }
    Ok(due.len())
}

/// Ends an operation waiting for its approval with the refusal as its
/// answer. `false`: it was not waiting any more.
async fn settle(
    tx: &mut Tx,
    approval: &ApprovalRecord,
    state: ApprovalState,
    now: Timestamp,
) -> Result<bool, sqlx::Error> {
    let response = problem_response(&refusal(state, &approval.operation_id, &approval.approval_id));
    let completion = Completion {
        state: OperationState::Rejected,
        response: &response,
        resource: None,
        external_ref: None,
        now,
    };
    crate::store::settle_awaiting(tx, &approval.account_id, &approval.operation_id, &completion).await
}

impl ApprovalRecord {
    fn audit(&self, event: AuditEvent, principal_id: &str, at: Timestamp) -> Record {
        let identity = OperationIdentity {
            account_id: &self.account_id,
            operation_id: &self.operation_id,
            idempotency_key: &self.idempotency_key,
            fingerprint: self.fingerprint.as_str(),
            route: &self.route,
        };
        identity.audit(event, principal_id, None, at)
    }
}

/// Only an approver decides (docs/contract.md §6): anyone else is refused
/// before anything is looked up or claimed.
pub fn may_decide(principal: &Principal) -> Result<(), ApiError> {
    if principal.role == Role::Approver {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "only a principal with the role `approver` may decide on an approval",
        ))
    }
}

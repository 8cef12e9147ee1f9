//! What a person does when the outbox cannot settle an operation by itself
//! (docs/contract.md §5): settle an operation whose outcome is unknown, with
//! the evidence they found ([`resolve`]), or send a dead event again
//! ([`redeliver`]). Each is one transaction of compare-and-sets, so it never
//! races the worker or the reconciler into settling an event twice.

use platform::{Principal, Timestamp};

use super::{EventOf, EventState, plan, status, store};
use crate::{
    Idempotency, OperationState,
    audit::{self, AuditEvent, Record},
};

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
    /// It took effect there, under this reference (the charge, the rollout):
    /// settled as the reconciler settles what it finds.
    Completed { external_ref: String },
    /// It did not take effect: settled as a refusal, with what the person
    /// found there, if anything.
    Failed { external_ref: Option<String> },
}

impl Resolution {
    /// The event's state once settled this way.
    fn event_state(&self) -> EventState {
        match self.outcome {
            Resolved::Completed { .. } => EventState::Delivered,
            Resolved::Failed { .. } => EventState::Failed,
        }
    }

    fn external_ref(&self) -> Option<&str> {
        match &self.outcome {
            Resolved::Completed { external_ref } => Some(external_ref),
            Resolved::Failed { external_ref } => external_ref.as_deref(),
        }
    }
}

/// Why a person's action changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ByHandError {
    #[error("no such operation in this account")]
    NotFound,
    /// The operation is not in the state the action is for: its state, and
    /// its event's if it has one.
    #[error("the operation is {0:?}, its event {1:?}")]
    InvalidState(OperationState, Option<EventState>),
    /// A worker or the reconciler holds the event until then, and may be
    /// hearing from the external system: ask again after.
    #[error("the event is held until {0}")]
    Held(Timestamp),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Settles `operation_id`, whose outcome is unknown, as `resolution` says,
/// in one transaction: its event (unless a worker or the reconciler holds it
/// right now), the operation (compare-and-set from `unknown`), the service's
/// rows through its [`Ledger`](super::Ledger) — the writes the reconciler
/// makes — and the journal: `resolved` by `by`, with the evidence, then the
/// outcome. The stored answer stays, replayed to every later attempt.
///
/// Sent again once it went through, it is refused with the state it left,
/// which tells a person whose answer was lost that it did.
pub async fn resolve(
    idempotency: &Idempotency,
    by: &Principal,
    operation_id: &str,
    resolution: &Resolution,
) -> Result<(), ByHandError> {
    let account_id = by.account_id.as_str();
    let failed_by_hand = matches!(resolution.outcome, Resolved::Failed { .. }).then_some(plan::FAILED_BY_HAND);
    let mut tx = idempotency.begin().await?;
    // after the lock: a lease that ran out while this waited must look so
    let now = Timestamp::now();
    // the event first, as the worker and the reconciler lock it first; an
    // operation is `unknown` only through its event, so no event, no resolution
    let Some(event) = store::settle_by_hand(
        &mut tx,
        account_id,
        operation_id,
        resolution.event_state(),
        resolution.external_ref(),
        failed_by_hand,
        now,
    )
    .await?
    else {
        // held, settled already, or not there
        tx.rollback().await?;
        return Err(why_not(idempotency, account_id, operation_id).await);
    };
    let ledger = idempotency
        .ledger()
        .ok_or_else(|| sqlx::Error::Protocol("the service keeps no ledger for its outbox events".into()))?;
    let plan = plan::resolved(resolution, &by.principal_id, ledger.completes_on_acceptance(&event));
    let settles = plan.settles.as_ref().expect("a resolution settles its operation");
    let Some((idempotency_key, fingerprint, route)) = crate::store::settle_unknown(
        &mut tx,
        account_id,
        operation_id,
        settles.operation,
        plan.external_ref,
        now,
    )
    .await?
    else {
        tx.rollback().await?;
        return Err(why_not(idempotency, account_id, operation_id).await);
    };
    ledger.settle(&mut tx, &event, settles.business).await?;
    let operation = EventOf {
        account_id,
        operation_id,
        idempotency_key: &idempotency_key,
        fingerprint: &fingerprint,
        route: &route,
    };
    let journaled: Vec<Record> = plan
        .settles
        .iter()
        .flat_map(|settles| settles.journal.iter())
        .map(|&(what, who)| Record {
            evidence: (what == AuditEvent::Resolved).then(|| resolution.evidence.clone()),
            ..operation.audit(what, who, plan.external_ref, now)
        })
        .collect();
    audit::record(&mut tx, &journaled).await?;
    tx.commit().await?;
    tracing::info!(%operation_id, by = %by.principal_id, state = settles.operation.as_str(),
        "an operation whose outcome was unknown was settled by hand");
    Ok(())
}

/// Why a resolution changed nothing: the operation is not there, a worker
/// or the reconciler holds its event right now, or it is not `unknown` (a
/// repeat of a resolution that went through lands here too: the 409 names
/// the state it left).
async fn why_not(idempotency: &Idempotency, account_id: &str, operation_id: &str) -> ByHandError {
    let found = async {
        let operation = crate::store::find_by_id(&idempotency.db, account_id, operation_id).await?;
        let delivery = status::delivery_of(&idempotency.db, account_id, operation_id).await?;
        Ok::<_, sqlx::Error>((operation, delivery))
    };
    let (operation, delivery) = match found.await {
        Ok(found) => found,
        Err(e) => return e.into(),
    };
    let Some(operation) = operation else {
        return ByHandError::NotFound;
    };
    match delivery.as_ref().and_then(|d| d.held_until) {
        Some(until) if operation.state == OperationState::Unknown && until > Timestamp::now() => {
            ByHandError::Held(until)
        }
        _ => ByHandError::InvalidState(operation.state, delivery.map(|d| d.state)),
    }
}

/// Gives `operation_id`'s dead event back to the reconciler, its failures
/// forgiven, journaled `redelivered` by `by`. The reconciler asks the
/// external system first and sends it again, with the same key, only if
/// there is no trace of it there: an effect that did happen is never made
/// twice. Sent again while the event is on its way, it changes nothing and
/// succeeds.
pub async fn redeliver(idempotency: &Idempotency, by: &Principal, operation_id: &str) -> Result<(), ByHandError> {
    let account_id = by.account_id.as_str();
    let mut tx = idempotency.begin().await?;
    let now = Timestamp::now();
    let Some((idempotency_key, fingerprint, route)) = store::revive(&mut tx, account_id, operation_id, now).await?
    else {
        tx.rollback().await?;
        let Some(operation) = crate::store::find_by_id(&idempotency.db, account_id, operation_id).await? else {
            return Err(ByHandError::NotFound);
        };
        let event = status::delivery_of(&idempotency.db, account_id, operation_id)
            .await?
            .map(|d| d.state);
        return match event {
            Some(EventState::Pending | EventState::Sending | EventState::Unknown) => Ok(()),
            _ => Err(ByHandError::InvalidState(operation.state, event)),
        };
    };
    let operation = EventOf {
        account_id,
        operation_id,
        idempotency_key: &idempotency_key,
        fingerprint: &fingerprint,
        route: &route,
    };
    let entry = operation.audit(AuditEvent::Redelivered, &by.principal_id, None, now);
    audit::record(&mut tx, &[entry]).await?;
    tx.commit().await?;
    tracing::info!(%operation_id, by = %by.principal_id, "a dead event was given back to the reconciler");
    Ok(())
}

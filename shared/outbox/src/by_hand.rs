//! What a person does when the outbox cannot settle an operation by itself
//! (docs/contract.md §5): settle an operation whose outcome is unknown, with
//! the evidence they found ([`resolve`]), or send a dead event again
//! ([`redeliver`]). Each is one transaction of compare-and-sets, so it never
//! races the worker or the reconciler into settling an event twice.
//!
//! What a person says is checked where it can be: before a resolution is
//! written, the external system is asked what it holds for the operation,
//! through the service's [`Witness`](crate::Witness) — the reconciler's own
//! lookup, by the operation's derived key and the service's reference.

use std::time::Duration;

use idempotency::{
    Idempotency, OperationIdentity, OperationState,
    status::EventState,
    store as operations,
    transitions::{AuditEvent, Record},
};
use platform::{Principal, Timestamp};

use crate::{
    answer::Lookup,
    event::OutboxEvent,
    extension::Events,
    plan,
    resolution::{Resolution, Resolved},
    status, store,
};

/// How long a resolution waits for the external system's answer: as long as
/// the outbox waits by default for a delivery's.
const ASKING_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// `completed` named a reference the external system does not confirm
    /// as the operation's work (it holds another, or nothing, for it); or,
    /// with no reference (`None`), the external system answered and holds
    /// no work of the operation.
    #[error("the external system does not confirm {0:?} as the operation's")]
    ExternalRefMismatch(Option<String>),
    /// `failed`, while the external system holds something under the
    /// operation's key or reference: the operation's own work (`Some`, its
    /// reference), or something that is not it and that a person must look at.
    #[error("the external system holds something under the operation's key")]
    ExternalOutcomeExists(Option<String>),
    /// The external system could not be asked; nothing was written.
    #[error("the external system could not be asked: {0}")]
    ExternalSystemUnavailable(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Settles `operation_id`, whose outcome is unknown, as `resolution` says.
///
/// First the external system is asked what it holds for the operation
/// (`check`, below); a resolution it does not bear out changes nothing (a refused
/// reference is journaled). Then, in one transaction: its event (unless a
/// worker or the reconciler holds it right now), the operation
/// (compare-and-set from `unknown`), the service's rows through its
/// [`Ledger`](crate::Ledger) — the writes the reconciler makes — and the
/// journal: `resolved` by `by`, with the evidence, then the outcome. The
/// stored answer stays, replayed to every later attempt.
///
/// Asking comes before the transaction, which must not wait on the network.
/// The transaction settles the event only as it was when the check asked:
/// held by nobody and handed to the external system no more times since
/// (its `deliveries`). An external system keeps what it made, so a confirmed
/// reference stays the operation's; and if the work was sent again in
/// between (the reconciler found nothing and a worker sent it), what the
/// check saw may be out of date, so it asks again.
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
    let mut asked = store::settleable_event(idempotency.db(), account_id, operation_id, Timestamp::now()).await?;
    // bounded: each round settles, is refused, or finds the work sent again since it asked
    for _ in 0..3 {
        let Some(event) = asked else {
            break;
        };
        if let Err(refused) = check(idempotency, &event, &resolution.outcome).await {
            if let ByHandError::ExternalRefMismatch(external_ref) = &refused {
                journal_refusal(idempotency, by, &event, external_ref.as_deref(), &resolution.evidence).await?;
            }
            return Err(refused);
        }
        if settle_as_checked(idempotency, by, &event, resolution).await? {
            return Ok(());
        }
        asked = store::settleable_event(idempotency.db(), account_id, operation_id, Timestamp::now())
            .await?
            .filter(|now| now.deliveries != event.deliveries);
    }
    Err(why_not(idempotency, account_id, operation_id).await)
}

/// The settling transaction of [`resolve`], for `event` as the check saw it.
/// `false`: nothing was written — the event is held, settled, or was sent
/// again since.
async fn settle_as_checked(
    idempotency: &Idempotency,
    by: &Principal,
    event: &OutboxEvent,
    resolution: &Resolution,
) -> Result<bool, ByHandError> {
    let (account_id, operation_id) = (event.account_id.as_str(), event.operation_id.as_str());
    let failed_by_hand = matches!(resolution.outcome, Resolved::Failed { .. }).then_some(plan::FAILED_BY_HAND);
    let ledger = idempotency
        .extension::<Events>()
        .map(Events::ledger)
        .ok_or_else(|| sqlx::Error::Protocol("the service keeps no ledger for its outbox events".into()))?;
    let plan = plan::resolved(resolution, &by.principal_id, ledger.completes_on_acceptance(event));
    let settles = plan.settles.as_ref().expect("a resolution settles its operation");
    let mut tx = idempotency.begin().await?;
    // after the lock: a lease that ran out while this waited must look so
    let now = Timestamp::now();
    // the event first, as the worker and the reconciler lock it first; an
    // operation is `unknown` only through its event, so no event, no resolution
    let settled = store::settle_by_hand(
        &mut tx,
        account_id,
        operation_id,
        event.deliveries,
        store::ByHand {
            state: resolution.event_state(),
            external_ref: plan.external_ref,
            last_error: failed_by_hand,
        },
        now,
    )
    .await?;
    let Some(event) = settled else {
        tx.rollback().await?;
        return Ok(false);
    };
    let Some((idempotency_key, fingerprint, route)) = store::settle_unknown(
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
        return Ok(false);
    };
    ledger.settle(&mut tx, &event, settles.business).await?;
    let operation = OperationIdentity {
        account_id,
        operation_id,
        idempotency_key: &idempotency_key,
        fingerprint: &fingerprint,
        route: &route,
    };
    let journaled: Vec<Record> = settles
        .journal
        .iter()
        .map(|&(what, who)| match what {
            // the person's entry names what they named; the outcome's, what the rows keep
            AuditEvent::Resolved => Record {
                evidence: Some(resolution.evidence.clone()),
                ..operation.audit(what, who, resolution.external_ref(), now)
            },
            _ => operation.audit(what, who, plan.external_ref, now),
        })
        .collect();
    idempotency.transitions().record(&mut tx, &journaled).await?;
    tx.commit().await?;
    tracing::info!(%operation_id, by = %by.principal_id, state = settles.operation.into_str(),
        "an operation whose outcome was unknown was settled by hand");
    Ok(true)
}

/// Whether the external system bears out `outcome` for `event`'s operation,
/// asked as the reconciler asks ([`Witness`](crate::Witness)):
///
/// - `completed` with a reference: it must be what the lookup finds for the
///   operation — the work under its key or its reference, of its amount and
///   currency, or its release and target. A reference that merely exists is
///   not enough: another account's work may be visible to the same lookup.
/// - `completed` with none: if the external system answers, it is checked
///   as well: the work it holds is named (settle with it), and no work at
///   all refutes it. Only when the external system cannot be asked is the
///   person's word taken, and then no external id enters any row (what can
///   still be settled when the external system is gone for good).
/// - `failed`: the external system must hold nothing under the key or the
///   reference.
async fn check(idempotency: &Idempotency, event: &OutboxEvent, outcome: &Resolved) -> Result<(), ByHandError> {
    let witness = idempotency
        .extension::<Events>()
        .map(Events::witness)
        .ok_or_else(|| ByHandError::ExternalSystemUnavailable("the service gives its layer no witness".into()))?;
    let held = tokio::time::timeout(ASKING_TIMEOUT, witness.holds(event))
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {ASKING_TIMEOUT:?}")));
    let held = match (outcome, held) {
        (Resolved::Completed { external_ref: None }, Err(reason)) => {
            tracing::warn!(operation_id = %event.operation_id, %reason,
                "the external system cannot be asked: a person's `completed` with no reference is taken as it is");
            return Ok(());
        }
        (_, Err(reason)) => {
            tracing::warn!(operation_id = %event.operation_id, %reason,
                "a resolution could not be checked: the external system could not be asked");
            return Err(ByHandError::ExternalSystemUnavailable(reason));
        }
        (_, Ok(held)) => held,
    };
    match (outcome, held) {
        (
            Resolved::Completed {
                external_ref: Some(named),
            },
            Lookup::Found { external_ref },
        ) if external_ref == *named => Ok(()),
        (Resolved::Completed { external_ref: None }, Lookup::Found { external_ref }) => {
            Err(ByHandError::ExternalOutcomeExists(Some(external_ref)))
        }
        (Resolved::Completed { external_ref }, _) => Err(ByHandError::ExternalRefMismatch(external_ref.clone())),
        (Resolved::Failed { .. }, Lookup::Absent) => Ok(()),
        (Resolved::Failed { .. }, Lookup::Found { external_ref }) => {
            Err(ByHandError::ExternalOutcomeExists(Some(external_ref)))
        }
        (Resolved::Failed { .. }, Lookup::Mismatch { .. }) => Err(ByHandError::ExternalOutcomeExists(None)),
    }
}

/// Journals a refused reference — who named it, with what evidence — in a
/// transaction of its own: nothing else is written.
async fn journal_refusal(
    idempotency: &Idempotency,
    by: &Principal,
    event: &OutboxEvent,
    external_ref: Option<&str>,
    evidence: &str,
) -> Result<(), sqlx::Error> {
    let operation = event.identity();
    let refusal = Record {
        evidence: Some(evidence.to_owned()),
        ..operation.audit(
            AuditEvent::ExternalRefRefused,
            &by.principal_id,
            external_ref,
            Timestamp::now(),
        )
    };
    let mut tx = idempotency.begin().await?;
    idempotency.transitions().record(&mut tx, &[refusal]).await?;
    tx.commit().await?;
    tracing::warn!(operation_id = %event.operation_id, by = %by.principal_id, external_ref = external_ref.unwrap_or("-"),
        "a resolution the external system does not bear out was refused");
    Ok(())
}

/// Why a resolution changed nothing: the operation is not there, a worker
/// or the reconciler holds its event right now, or it is not `unknown` (a
/// repeat of a resolution that went through lands here too: the 409 names
/// the state it left).
async fn why_not(idempotency: &Idempotency, account_id: &str, operation_id: &str) -> ByHandError {
    let found = async {
        let operation = operations::find_by_id(idempotency.db(), account_id, operation_id).await?;
        let delivery = status::delivery_of(idempotency.db(), account_id, operation_id).await?;
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
        let Some(operation) = operations::find_by_id(idempotency.db(), account_id, operation_id).await? else {
            return Err(ByHandError::NotFound);
        };
        let event = status::delivery_of(idempotency.db(), account_id, operation_id)
            .await?
            .map(|d| d.state);
        return match event {
            Some(EventState::Pending | EventState::Sending | EventState::Unknown) => Ok(()),
            _ => Err(ByHandError::InvalidState(operation.state, event)),
        };
    };
    let operation = OperationIdentity {
        account_id,
        operation_id,
        idempotency_key: &idempotency_key,
        fingerprint: &fingerprint,
        route: &route,
    };
    let entry = operation.audit(AuditEvent::Redelivered, &by.principal_id, None, now);
    idempotency.transitions().record(&mut tx, &[entry]).await?;
    tx.commit().await?;
    tracing::info!(%operation_id, by = %by.principal_id, "a dead event was given back to the reconciler");
    Ok(())
}

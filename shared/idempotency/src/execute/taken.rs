//! An attempt that finds its key taken: it reads the operation, asks the pure
//! [`verdict`](super::verdict) what to do, and carries it out (docs/contract.md §3).

use std::time::{Duration, Instant};

use axum::response::{IntoResponse, Response};
use platform::{ApiError, Timestamp, Tx, telemetry};

use super::{
    Attempt, Effect,
    attempt::new_lease_token,
    verdict::{Asking, Stored, Verdict, verdict},
};
use crate::{
    layer::Idempotency,
    operation::{OperationIdentity, OperationRecord, OperationState},
    responses::{in_progress, outcome_unknown},
    store,
    transitions::AuditEvent,
};

/// How often a duplicate that was asked to wait (`Prefer: wait`) looks again.
const WAIT_POLL: Duration = Duration::from_millis(25);

/// Where an attempt stands after looking at an existing operation.
pub(super) enum Resolution {
    /// Answer the client with this; nothing runs.
    Answer(Response),
    /// This attempt holds the operation now (its claim, a dead holder's lease, an approved run) and runs it.
    Run(Box<OperationRecord>),
    /// The operation disappeared under us (reaped, or freed): claim again.
    Vanished,
}

impl Idempotency {
    /// The answer for an attempt that found its key taken, or the run if the lease ran out or a person approved.
    pub(super) async fn answer_taken_key<T, W, F>(&self, attempt: &Attempt<'_>, call_out: W, effect: F) -> Response
    where
        W: AsyncFnOnce(&OperationIdentity<'_>) -> Result<T, ApiError>,
        F: AsyncFnOnce(&mut Tx, &OperationIdentity<'_>, T) -> Result<Effect, ApiError>,
    {
        match self.find_and_resolve(attempt, true).await {
            Ok(Resolution::Answer(response)) => response,
            Ok(Resolution::Run(operation)) => self.run(attempt, *operation, call_out, effect).await,
            // freed by a failed first attempt, or reaped: nothing holds the key now
            Ok(Resolution::Vanished) => {
                self.server_error_unclaimed(
                    attempt,
                    ApiError::internal("the operation holding the key vanished").with_detail(
                        "the operation holding this key was freed while this attempt waited; retry with the same key",
                    ),
                )
                .await
            }
            Err(error) => self.server_error_unclaimed(attempt, error).await,
        }
    }

    /// Reads the operation the attempt's key names, counting this request as an attempt at it, and
    /// [`resolves`](Self::resolve) it; `Vanished` if there is none.
    pub(super) async fn find_and_resolve(
        &self,
        attempt: &Attempt<'_>,
        may_take_over: bool,
    ) -> Result<Resolution, ApiError> {
        let (account_id, key) = (&attempt.principal.account_id, attempt.headers.key.as_str());
        let Some(existing) = store::find_by_key(&self.db, account_id, key).await? else {
            return Ok(Resolution::Vanished);
        };
        self.attempts.count(&self.db, account_id, key).await;
        self.resolve(attempt, existing, may_take_over).await
    }

    /// The answer for an attempt whose key names an operation. `may_take_over`: it may still run the
    /// operation (not once its effect was spent). One that has begun to wait never runs it, as its
    /// run could outlast the wait (docs/design.md §3).
    pub(super) async fn resolve(
        &self,
        attempt: &Attempt<'_>,
        mut operation: OperationRecord,
        may_take_over: bool,
    ) -> Result<Resolution, ApiError> {
        let deadline = attempt.headers.wait.map(|w| Instant::now() + w);
        let mut waited = false;
        loop {
            attempt.record_operation(&operation.operation_id);
            // the gate matters only to the request it was asked for: a changed one is refused without it
            let same_request = operation.fingerprint == attempt.fingerprint;
            let now = Timestamp::now();
            let approval = match operation.state {
                OperationState::AwaitingApproval if same_request => {
                    Some(self.gate()?.state(&self.db, &operation, now).await?)
                }
                _ => None,
            };
            let stored = Stored {
                fingerprint: &operation.fingerprint,
                state: operation.state,
                locked_until: operation.locked_until,
                answered: operation.response.is_some(),
                approval,
            };
            let asking = Asking {
                fingerprint: &attempt.fingerprint,
                now,
                may_run: may_take_over && !waited,
                may_wait: deadline.is_some_and(|d| Instant::now() < d),
            };
            match verdict(&stored, &asking) {
                Verdict::KeyReused => {
                    let (id, state) = (&operation.operation_id, operation.state);
                    return Ok(Resolution::Answer(self.refuse_reused_key(attempt, id, state).await));
                }
                Verdict::Replay => {
                    let (id, state) = (&operation.operation_id, operation.state);
                    let stored = operation
                        .response
                        .as_ref()
                        .ok_or_else(|| ApiError::internal("a finished operation has no stored answer"))?;
                    self.remember(attempt, id, state, stored, operation.updated_at);
                    return Ok(Resolution::Answer(self.replay(attempt, id, stored).await));
                }
                Verdict::InProgress => {
                    telemetry::record_outcome("in_progress");
                    self.observe(attempt, &operation.operation_id, Some(AuditEvent::InProgress))
                        .await;
                    return Ok(Resolution::Answer(in_progress(&operation)));
                }
                Verdict::Wait => {
                    if let Some(deadline) = deadline {
                        tokio::time::sleep(WAIT_POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
                    }
                    waited = true;
                }
                ran_out @ (Verdict::TakeOver | Verdict::StartApproved) => {
                    if let Some(held) = self.hold(attempt, &operation, ran_out == Verdict::TakeOver).await? {
                        return Ok(Resolution::Run(Box::new(held)));
                    }
                    // another attempt took it over, or started it, first
                }
                Verdict::Expire => self.end_expired_wait(&operation).await?,
                Verdict::OutcomeUnknown => {
                    telemetry::record_outcome("outcome_unknown");
                    self.observe(attempt, &operation.operation_id, None).await;
                    return Ok(Resolution::Answer(outcome_unknown(&operation)));
                }
            }
            // lost a race, waited a little, or ended an expired wait: look again
            match store::find_by_key(&self.db, &operation.account_id, operation.key.as_str()).await? {
                Some(fresh) => operation = fresh,
                None => return Ok(Resolution::Vanished),
            }
        }
    }

    /// Takes `operation` under a lease of this attempt's: a dead holder's, or an approved
    /// operation's run; `taking_over` only says which, for the log. `None`: another attempt took it first.
    async fn hold(
        &self,
        attempt: &Attempt<'_>,
        operation: &OperationRecord,
        taking_over: bool,
    ) -> Result<Option<OperationRecord>, ApiError> {
        let now = Timestamp::now();
        let (token, locked_until) = (new_lease_token(), now.plus(self.config.lease));
        let mut tx = self.begin().await?;
        let Some(held) = store::hold(&mut tx, operation, &token, locked_until, now).await? else {
            tx.rollback().await?;
            return Ok(None);
        };
        let by = attempt.principal.principal_id.as_str();
        let journaled = [
            held.audit(AuditEvent::Attempted, by, attempt.started),
            held.audit(AuditEvent::Claimed, by, now),
        ];
        self.transitions.record(&mut tx, &journaled).await?;
        tx.commit().await?;
        if taking_over {
            tracing::warn!(operation_id = %held.operation_id, "lease expired; this attempt took the operation over");
        }
        Ok(Some(held))
    }

    /// Ends an operation whose wait at the gate ran out, unless it was decided or started meanwhile.
    async fn end_expired_wait(&self, operation: &OperationRecord) -> Result<(), ApiError> {
        let gate = self.gate()?;
        let mut tx = self.begin().await?;
        match gate.expire(&mut tx, operation, Timestamp::now()).await {
            Ok(Some(ended)) => {
                self.transitions.record(&mut tx, &[ended]).await?;
                tx.commit().await?;
                Ok(())
            }
            Ok(None) => Ok(tx.rollback().await?),
            Err(error) => {
                let _ = tx.rollback().await;
                Err(error)
            }
        }
    }

    /// After losing the lease: answer as a duplicate would.
    pub(super) async fn answer_current(&self, attempt: &Attempt<'_>, operation: &OperationRecord) -> Response {
        match store::find_by_key(&self.db, &operation.account_id, operation.key.as_str()).await {
            Ok(Some(current)) => match self.resolve(attempt, current, false).await {
                Ok(Resolution::Answer(response)) => response,
                Ok(_) => in_progress(operation),
                Err(error) => error.into_response(),
            },
            Ok(None) => in_progress(operation),
            Err(e) => ApiError::from(e).into_response(),
        }
    }

    /// A duplicate's effect may fail on the first attempt's committed effect: if the key is taken,
    /// the duplicate's answer. `None`: nothing holds the key, and a retry starts afresh.
    pub(super) async fn answer_if_taken(&self, attempt: &Attempt<'_>) -> Option<Response> {
        match self.find_and_resolve(attempt, false).await {
            Ok(Resolution::Answer(response)) => Some(response),
            _ => None,
        }
    }
}

//! One attempt of an operation: claim, replay or refuse, and when this attempt owns the operation,
//! run its effect and record how it ended (docs/design.md §2, §3; docs/contract.md §3, §5).
//!
//! # How one attempt goes, file by file
//!
//! 1. **begin** (`mod.rs`, `attempt.rs`): the command's fingerprint, carried with the key from here on;
//! 2. **replay cache** (`answers.rs`): a retry this process remembers is answered with no query;
//! 3. **claim**: with the effect (`in_transaction.rs`), under a lease (`leased.rs`), or at the gate (`gated.rs`);
//! 4. **effect** (`effect.rs`, `run.rs` under a lease): the route's closure, in the transaction it is given;
//! 5. **conclude** (`conclude.rs`): one exit for both modes: commit, store a final failure, or free the key;
//! 6. **answer** (`responses.rs`): byte for byte, with the operation's headers.
//!
//! A key found taken is judged by the pure `verdict.rs` and carried out by `taken.rs`: replay,
//! 409, 422, wait, or run the operation when its holder's lease ran out or a person approved it.

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use platform::{ApiError, Principal, Tx};
use serde::Serialize;

use crate::{
    config::ClaimMode,
    key::IdempotencyHeaders,
    layer::Idempotency,
    operation::{OperationIdentity, new_operation_id},
};

use crate::responses::stored_response_without_operation;

/// A route's effect, given what its call-out said: nothing. A closure written in place, not
/// returned by a function, so that its future keeps a type the compiler can see is `Send`.
macro_rules! without_call_out {
    ($effect:expr) => {
        async move |tx: &mut Tx, operation: &OperationIdentity<'_>, (): ()| ($effect)(tx, operation).await
    };
}

mod answers;
mod attempt;
mod conclude;
mod effect;
mod gated;
mod in_transaction;
mod leased;
mod run;
mod taken;
mod verdict;

pub use crate::responses::{IDEMPOTENT_REPLAYED, OPERATION_ID, stored_response};
pub use attempt::Attempt;
pub use effect::Effect;

impl Idempotency {
    /// Runs one attempt of an operation. `effect` does the business writes in the transaction it is
    /// given, with the operation's id for rows that name it; the operation completes in that same
    /// transaction, so the effect and its stored answer exist together or not at all. A final 4xx from
    /// it rolls its writes back and is stored and replayed; a 5xx, 408, 429 or any error with
    /// `Retry-After` rolls back and frees the key. It may start more than once (a losing duplicate's
    /// run rolls back, a dead holder's lease taken over runs it again), but only one run ever commits.
    pub async fn execute<C, F>(&self, attempt: Attempt<'_>, command: &C, effect: F) -> Response
    where
        C: Serialize,
        F: AsyncFnOnce(&mut Tx, &OperationIdentity<'_>) -> Result<Effect, ApiError> + Clone,
    {
        if !self.config.enabled {
            return self.run_unguarded(&attempt, effect).await;
        }
        let attempt = match self.start(attempt, command).await {
            Ok(attempt) => attempt,
            Err(answered) => return answered,
        };
        // the rarer paths boxed: unboxed, their futures would set this one's size, and it is
        // moved by value into the handler's on every request, a replay's included
        if let Some(asked) = &attempt.approval {
            return Box::pin(self.request_approval(&attempt, &**asked, effect)).await;
        }
        if self.config.claim == ClaimMode::InTransaction {
            return self.execute_in_transaction(&attempt, effect).await;
        }
        Box::pin(self.execute_leased(&attempt, nothing_to_call, without_call_out!(effect))).await
    }

    /// [`Self::execute`] for an operation that must ask another system before it records its effect
    /// (a cancel at a deployment controller). The claim is always [`ClaimMode::Leased`]: `call_out`
    /// runs once it commits, outside any transaction, and again if a dead holder's lease is taken
    /// over, so it must be safe to repeat. The attempt carries no approval (docs/design.md §3).
    pub async fn execute_calling_out<C, T, W, F>(
        &self,
        attempt: Attempt<'_>,
        command: &C,
        call_out: W,
        effect: F,
    ) -> Response
    where
        C: Serialize,
        W: AsyncFnOnce(&OperationIdentity<'_>) -> Result<T, ApiError>,
        F: AsyncFnOnce(&mut Tx, &OperationIdentity<'_>, T) -> Result<Effect, ApiError>,
    {
        debug_assert!(attempt.approval.is_none(), "a route that calls out takes no approval");
        if !self.config.enabled {
            // not begun, so no fingerprint: an id that names nothing
            let operation_id = new_operation_id();
            return match call_out(&attempt.identity(&operation_id)).await {
                Ok(said) => {
                    self.run_unguarded(&attempt, async |tx, operation| effect(tx, operation, said).await)
                        .await
                }
                Err(error) => error.into_response(),
            };
        }
        let attempt = match self.start(attempt, command).await {
            Ok(attempt) => attempt,
            Err(answered) => return answered,
        };
        self.execute_leased(&attempt, call_out, effect).await
    }

    /// A POST that repeating cannot add an effect to (a decision, a settlement by hand): without a key
    /// `run` runs as it is; with one it is the call-out of an operation like any other. Its answer is
    /// about its author, so the fingerprint covers the principal too (docs/design.md §7).
    pub async fn execute_with_optional_key<C, T>(
        &self,
        route: &'static str,
        principal: &Principal,
        key: Option<IdempotencyHeaders>,
        command: &C,
        run: impl AsyncFnOnce() -> Result<T, ApiError>,
    ) -> Response
    where
        C: Serialize,
        T: Serialize,
    {
        let Some(key) = key else {
            return match run().await {
                Ok(answer) => Json(answer).into_response(),
                Err(error) => error.into_response(),
            };
        };
        let by_its_author = ByItsAuthor {
            principal_id: &principal.principal_id,
            command,
        };
        self.execute_calling_out(
            Attempt::post(route, principal, key),
            &by_its_author,
            async |_| run().await,
            async |_, _, answer: T| Ok(Effect::json(StatusCode::OK, &answer)),
        )
        .await
    }

    /// Begins an attempt: its fingerprint, then the replay cache. `Err`: it is answered already.
    async fn start<'a>(&self, attempt: Attempt<'a>, command: &impl Serialize) -> Result<Attempt<'a>, Response> {
        // read first: an outage seen while the attempt runs makes what it learns stale
        let attempt = attempt
            .begin(command, self.db.outages().seen())
            .map_err(IntoResponse::into_response)?;
        match self
            .remembered(&attempt.principal.account_id, attempt.headers.key.as_str())
            .await
        {
            Some(answer) => Err(self.replay_cached(&attempt, &answer).await),
            None => Ok(attempt),
        }
    }

    /// The measurement baseline (`enabled: false`): the effect in its transaction, and nothing else.
    async fn run_unguarded<F>(&self, attempt: &Attempt<'_>, effect: F) -> Response
    where
        F: AsyncFnOnce(&mut Tx, &OperationIdentity<'_>) -> Result<Effect, ApiError>,
    {
        let mut tx = match self.begin().await {
            Ok(tx) => tx,
            Err(e) => return ApiError::from(e).into_response(),
        };
        // not begun, so no fingerprint: an id that names nothing
        match effect(&mut tx, &attempt.identity(&new_operation_id())).await {
            Ok(done) if done.handoff.is_some() => {
                let _ = tx.rollback().await;
                ApiError::internal("work for the outbox needs the idempotency layer")
                    .with_detail("this route hands work to an outbox, which needs its operation; it cannot run with RETRYSAFE_IDEMPOTENCY=off")
                    .into_response()
            }
            Ok(done) => match tx.commit().await {
                Ok(()) => stored_response_without_operation(&done.response),
                Err(e) => ApiError::from(e).into_response(),
            },
            Err(error) => {
                let _ = tx.rollback().await;
                error.into_response()
            }
        }
    }
}

/// What the fingerprint of a request that answers about its author covers: who sent it, and what.
#[derive(Serialize)]
struct ByItsAuthor<'a, C> {
    principal_id: &'a str,
    command: &'a C,
}

/// The call-out of an operation whose effect is all in its database: none.
async fn nothing_to_call(_operation: &OperationIdentity<'_>) -> Result<(), ApiError> {
    Ok(())
}

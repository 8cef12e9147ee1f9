//! Running one attempt of an operation: claim, or replay, or refuse — and when
//! this attempt owns the operation, run its effect and record how it ended
//! (docs/contract.md §3, §5; docs/design.md §2, §3).
//!
//! # How one attempt goes, file by file
//!
//! 1. **begin** (`mod.rs`, `attempt.rs`) — the route's handler has validated
//!    the command and parsed the key and `Prefer: wait`; the attempt takes the
//!    command's fingerprint (docs/contract.md §2: a command the fingerprint
//!    cannot hold exactly is a 400 that claims nothing) and carries it, with
//!    the key, from here on.
//! 2. **replay cache** (`answers.rs`) — a retry of an answer this process
//!    remembers is answered from memory, with no query (docs/design.md §4).
//! 3. **claim**, in one of two modes (docs/design.md §2, §3):
//!    - in the effect's transaction (`in_transaction.rs`): the effect runs
//!      first and the claim is inserted with its answer;
//!    - under a lease (`leased.rs`): the claim commits on its own, then the
//!      operation runs under it (`run.rs`: the route's call-out, if it has
//!      one, the gate's last word, the effect).
//!
//!    A route whose policy wants a person claims the key as
//!    `awaiting_approval` instead, with what the layer's gate gives for it
//!    (`gated.rs`, [`crate::gate`]; docs/contract.md §6).
//! 4. **effect** — the route's closure, in the transaction it is given; what
//!    it answers is an [`Effect`] (`effect.rs`).
//! 5. **conclude** (`conclude.rs`) — one exit for both modes: the effect's
//!    answer commits with the operation's completion and the work it hands
//!    on; a final business failure (or a refused approval) is stored to be
//!    replayed; a server error gives the key back. A finished answer is
//!    remembered for the next replay.
//! 6. **answer** — byte for byte, with the operation's headers
//!    (`responses.rs`).
//!
//! An attempt that finds its key taken — at its claim, or when its own run
//! turns out to have lost a race — reads the operation, asks the pure verdict
//! (`verdict.rs`) what to do, and carries it out (`taken.rs`): replay, 409,
//! 422, wait, or run the operation itself (`run.rs`) when its holder's lease
//! ran out or a person approved it. The answers it gives without running
//! anything are journaled as observations (`answers.rs`).

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

/// A route's effect, as one that is given what its call-out said: nothing.
/// A closure written in place rather than returned by a function, so that
/// its future keeps a type the compiler can see is `Send`.
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
    /// Runs one attempt of an operation. `command` is the validated command
    /// (what the fingerprint hashes); `effect` does the business writes in the
    /// transaction it is given and says what to answer. It is also given the
    /// operation's id (`op_…`), for business rows that name the operation that
    /// made them and for keys derived from it. The operation's
    /// completion commits in that same transaction, so either both the
    /// effect and the stored answer exist, or neither.
    ///
    /// An `Err` from `effect` that is a final business failure (a 4xx) rolls
    /// the effect back and is stored and replayed like any answer; a server
    /// error (5xx) rolls back and frees the key.
    ///
    /// The effect may be started more than once (a losing duplicate's run is
    /// rolled back), but only one run ever commits. It is `Clone` (closures
    /// that borrow their inputs are) so that an attempt that finds a dead
    /// holder's lease can run it again.
    ///
    /// Every attempt is journaled: the transitions it makes in the
    /// transaction that makes them, what it merely observed in memory (see
    /// [`crate::transitions::Sink`], the journal).
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
        if let Some(asked) = &attempt.approval {
            return self.request_approval(&attempt, &**asked, effect).await;
        }
        if self.config.claim == ClaimMode::InTransaction {
            return self.execute_in_transaction(&attempt, effect).await;
        }
        self.execute_leased(&attempt, nothing_to_call, without_call_out!(effect))
            .await
    }

    /// [`Self::execute`] for an operation that must ask another system before
    /// it can record its effect (a cancel at a deployment controller, whose
    /// answer says whether the deployment is cancelled). `call_out` runs once
    /// the claim has committed, under the operation's lease and outside any
    /// transaction; `effect` then records what it said, and the operation's
    /// completion, in one transaction.
    ///
    /// The claim is always [`ClaimMode::Leased`] here, whatever the service's
    /// setting: claiming in the effect's transaction would call out before the
    /// claim is decided, or with a write transaction open. A duplicate meanwhile
    /// gets `request_in_progress` (or waits, with `Prefer: wait`); a replay, a
    /// 409 or a 422 never calls out. `call_out` runs again when a crashed
    /// holder's lease is taken over, so it must be safe to repeat (a cancel is).
    /// Such a route takes no approval: an approval is re-checked in the
    /// effect's transaction, which would come after the call.
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
            let operation_id = new_operation_id();
            return match call_out(&attempt.unrecorded(&operation_id)).await {
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

    /// A POST that repeating cannot add an effect to (a decision, a person's
    /// settlement), so it needs no key: without one, `run` runs as it is;
    /// with one, it is an operation like any other, its answer stored and
    /// replayed, and the key sent with another command is 422. `run` makes
    /// its own writes, so it is called out to once the claim commits, as in
    /// [`Self::execute_calling_out`].
    ///
    /// Such a request is its author's: what it answers (you decided, you
    /// settled) is about who sent it, so the principal is part of what the
    /// fingerprint covers, and another principal of the account sending the
    /// same key and body is 422, never told what the first one was
    /// (docs/contract.md §5).
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

    /// Begins an attempt: its fingerprint, then the replay cache. `Err`: it
    /// is answered already — a command the fingerprint cannot hold exactly
    /// (a 400 that claims nothing), or a retry this process remembers.
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

    /// The measurement baseline (`enabled: false`): the effect in its
    /// transaction, and nothing else of this module.
    async fn run_unguarded<F>(&self, attempt: &Attempt<'_>, effect: F) -> Response
    where
        F: AsyncFnOnce(&mut Tx, &OperationIdentity<'_>) -> Result<Effect, ApiError>,
    {
        let mut tx = match self.begin().await {
            Ok(tx) => tx,
            Err(e) => return ApiError::from(e).into_response(),
        };
        // no operation is stored: the effect gets an id that names none
        match effect(&mut tx, &attempt.unrecorded(&new_operation_id())).await {
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

/// A request that answers about its author (a decision, a settlement by
/// hand), as its fingerprint covers it: who sent it, and what they sent.
#[derive(Serialize)]
struct ByItsAuthor<'a, C> {
    principal_id: &'a str,
    command: &'a C,
}

/// The call-out of an operation whose effect is all in its database: none.
async fn nothing_to_call(_operation: &OperationIdentity<'_>) -> Result<(), ApiError> {
    Ok(())
}

//! Running one attempt of an operation: claim, or replay, or refuse — and when
//! this attempt owns the operation, run its effect and complete it in one
//! transaction (docs/contract.md §3, §5).

use std::{
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use platform::{ApiError, Principal, Timestamp, Tx, error::PROBLEM_JSON, telemetry};
use serde::Serialize;

use crate::{
    ClaimMode, Idempotency,
    approval::{
        self, ApprovalRecord, ApprovalRequested, ApprovalState, ApprovalSummary, ExecutionCheck, new_approval_id,
        refusal,
    },
    audit::{self, AuditEvent, Record},
    fingerprint::Fingerprint,
    key::{IdempotencyHeaders, IdempotencyKey},
    operation::{OperationRecord, OperationState, ResourceRef, StoredResponse, new_operation_id, status_url},
    outbox::{self, EventOf},
    replay_cache::CachedAnswer,
    store::{self, Completion, NewOperation},
    verdict::{Asking, Stored, Verdict, verdict},
};

pub const OPERATION_ID: &str = "operation-id";
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// How often a duplicate that was asked to wait (`Prefer: wait`) looks again.
const WAIT_POLL: Duration = Duration::from_millis(25);

/// A route's effect, as one that is given what its call-out said: nothing.
/// A closure written in place rather than returned by a function, so that
/// its future keeps a type the compiler can see is `Send`.
macro_rules! without_call_out {
    ($effect:expr) => {
        async move |tx: &mut Tx, operation_id: &str, (): ()| ($effect)(tx, operation_id).await
    };
}

/// One request that carries an idempotency key: who sent it, to which route,
/// and whether the route's policy wants a human to approve it first.
#[derive(Debug)]
pub struct Attempt<'a> {
    pub principal: &'a Principal,
    pub headers: IdempotencyHeaders,
    pub method: &'static str,
    /// The route *template*, e.g. `/v1/tickets/{ticket_id}/comments`.
    pub route: &'static str,
    /// `Some`: the operation waits for an approver before it runs
    /// (docs/contract.md §6).
    pub approval: Option<ApprovalSummary>,
    /// When this attempt arrived: the time of its `attempted` journal entry.
    pub started: Timestamp,
    /// The operation this request's log span names, once it is recorded.
    logged_operation: Mutex<Option<String>>,
}

impl<'a> Attempt<'a> {
    pub fn post(route: &'static str, principal: &'a Principal, headers: IdempotencyHeaders) -> Self {
        Attempt {
            principal,
            headers,
            method: "POST",
            route,
            approval: None,
            started: Timestamp::now(),
            logged_operation: Mutex::new(None),
        }
    }

    /// What the route's policy decided for this command: `Some(summary)` when
    /// a human must approve it, with what the human is to judge.
    pub fn approval(mut self, policy: Option<ApprovalSummary>) -> Self {
        self.approval = policy;
        self
    }

    /// The fingerprint of `command` sent on this attempt. A command the
    /// fingerprint cannot hold exactly is bad input, refused before any claim.
    fn fingerprint(&self, command: &impl Serialize) -> Result<Fingerprint, ApiError> {
        Fingerprint::of(self.method, self.route, &self.principal.account_id, command)
            .map_err(|inexact| ApiError::invalid_field(&inexact.field, inexact.to_string()))
    }

    /// Names the operation on the request's log span, once for each
    /// operation the request finds: a duplicate that waits looks at the
    /// operation again at every poll, and the text log format appends a field
    /// each time it is recorded.
    fn record_operation(&self, operation_id: &str, fingerprint: &Fingerprint) {
        let mut logged = self.logged_operation.lock().unwrap_or_else(PoisonError::into_inner);
        if logged.as_deref() != Some(operation_id) {
            telemetry::record_operation(operation_id, fingerprint.as_str());
            *logged = Some(operation_id.to_owned());
        }
    }

    /// A journal record of this attempt about `operation_id`.
    fn audit(&self, event: AuditEvent, operation_id: Option<&str>, fingerprint: &Fingerprint, at: Timestamp) -> Record {
        Record {
            account_id: self.principal.account_id.clone(),
            principal_id: self.principal.principal_id.clone(),
            operation_id: operation_id.map(str::to_owned),
            idempotency_key: Some(self.headers.key.as_str().to_owned()),
            fingerprint: Some(fingerprint.as_str().to_owned()),
            route: Some(self.route.to_owned()),
            event,
            external_ref: None,
            at,
            change: None,
        }
    }

    fn new_operation<'b>(&'b self, fingerprint: &'b Fingerprint, lease: Duration) -> NewOperation<'b> {
        let now = Timestamp::now();
        NewOperation {
            account_id: &self.principal.account_id,
            key: &self.headers.key,
            operation_id: new_operation_id(),
            principal_id: &self.principal.principal_id,
            method: self.method,
            route: self.route,
            fingerprint,
            lease_token: new_lease_token(),
            locked_until: now.plus(lease),
            now,
        }
    }
}

/// What the effect produced: the first answer, what it made, and the work it
/// hands to the outbox, if any.
#[derive(Debug, Clone)]
pub struct Effect {
    response: StoredResponse,
    resource: Option<ResourceRef>,
    outbox: Option<outbox::Message>,
}

impl Effect {
    /// A JSON answer with `status`.
    pub fn json(status: StatusCode, body: &impl Serialize) -> Self {
        Effect {
            response: json_response(status, body),
            resource: None,
            outbox: None,
        }
    }

    /// Names the resource the operation made or acted on; it also becomes the
    /// answer's `Location`.
    pub fn with_resource(mut self, kind: &str, id: &str, url: String) -> Self {
        self.response.location = Some(url.clone());
        self.resource = Some(ResourceRef {
            kind: kind.into(),
            id: id.into(),
            url,
        });
        self
    }

    /// Work that leaves the process (a charge, a rollout): `payload` goes to
    /// the outbox as a `kind` event, in the transaction of this effect, and the
    /// outbox delivers it with a key derived from the operation id (see
    /// [`crate::outbox`]). The operation answers now — this effect's answer,
    /// usually a 202 with the resource in its first state — and stays
    /// `in_progress`, replaying that answer, until the delivery settles it.
    pub fn with_outbox(mut self, kind: &'static str, payload: &impl Serialize) -> Self {
        self.outbox = Some(outbox::Message::new(kind, payload));
        self
    }

    /// How the operation stands once this effect commits: completed, or
    /// still in progress while the outbox delivers its work.
    fn completion(&self) -> Completion<'_> {
        Completion {
            state: if self.outbox.is_some() {
                OperationState::InProgress
            } else {
                OperationState::Completed
            },
            response: &self.response,
            resource: self.resource.as_ref(),
            external_ref: None,
            now: Timestamp::now(),
        }
    }
}

fn json_response(status: StatusCode, body: &impl Serialize) -> StoredResponse {
    StoredResponse {
        status,
        content_type: "application/json".into(),
        location: None,
        body: serde_json::to_vec(body).unwrap_or_default(),
    }
}

/// Where an attempt stands after looking at an existing operation.
enum Decision {
    /// Answer the client with this; nothing runs.
    Answer(Response),
    /// This attempt holds the operation now (its claim, a dead holder's
    /// lease, or an approved operation) and runs it.
    Run(Box<OperationRecord>),
    /// The operation disappeared under us (reaped, or freed): claim again.
    Vanished,
}

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
    /// [`audit::Journal`]).
    pub async fn execute<C, F>(&self, attempt: Attempt<'_>, command: &C, effect: F) -> Response
    where
        C: Serialize,
        F: AsyncFnOnce(&mut Tx, &str) -> Result<Effect, ApiError> + Clone,
    {
        if !self.config.enabled {
            return self.run_unguarded(effect).await;
        }
        let account_id = attempt.principal.account_id.as_str();
        let fingerprint = match attempt.fingerprint(command) {
            Ok(fingerprint) => fingerprint,
            Err(refused) => return refused.into_response(),
        };
        if let Some(answer) = self.replay_cache.get(account_id, attempt.headers.key.as_str()) {
            return self.replay_cached(&attempt, &answer, &fingerprint);
        }
        if let Some(summary) = &attempt.approval {
            return self.request_approval(&attempt, &fingerprint, summary, effect).await;
        }
        if self.config.claim == ClaimMode::InTransaction {
            return self.execute_in_transaction(&attempt, &fingerprint, effect).await;
        }
        self.execute_leased(&attempt, &fingerprint, nothing_to_call, without_call_out!(effect))
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
        W: AsyncFnOnce(&str) -> Result<T, ApiError>,
        F: AsyncFnOnce(&mut Tx, &str, T) -> Result<Effect, ApiError>,
    {
        debug_assert!(attempt.approval.is_none(), "a route that calls out takes no approval");
        if !self.config.enabled {
            let operation_id = new_operation_id();
            return match call_out(&operation_id).await {
                Ok(said) => self.run_unguarded(async |tx, id| effect(tx, id, said).await).await,
                Err(error) => error.into_response(),
            };
        }
        let account_id = attempt.principal.account_id.as_str();
        let fingerprint = match attempt.fingerprint(command) {
            Ok(fingerprint) => fingerprint,
            Err(refused) => return refused.into_response(),
        };
        if let Some(answer) = self.replay_cache.get(account_id, attempt.headers.key.as_str()) {
            return self.replay_cached(&attempt, &answer, &fingerprint);
        }
        self.execute_leased(&attempt, &fingerprint, call_out, effect).await
    }

    /// [`ClaimMode::Leased`]: the claim commits on its own, then this attempt
    /// calls out (if the route does) and runs the effect under its lease.
    async fn execute_leased<T, W, F>(
        &self,
        attempt: &Attempt<'_>,
        fingerprint: &Fingerprint,
        call_out: W,
        effect: F,
    ) -> Response
    where
        W: AsyncFnOnce(&str) -> Result<T, ApiError>,
        F: AsyncFnOnce(&mut Tx, &str, T) -> Result<Effect, ApiError>,
    {
        match self.claim_or_decide(attempt, fingerprint).await {
            Ok(Decision::Run(operation)) => {
                attempt.record_operation(&operation.operation_id, fingerprint);
                fail_point("idempotency::after_claim").await;
                self.run(attempt, *operation, call_out, effect).await
            }
            Ok(Decision::Answer(response)) => response,
            Ok(Decision::Vanished) => {
                ApiError::internal("the operation kept disappearing while it was claimed").into_response()
            }
            Err(error) => {
                self.journal
                    .observe([attempt.audit(AuditEvent::Attempted, None, fingerprint, attempt.started)]);
                error.into_response()
            }
        }
    }

    /// [`ClaimMode::InTransaction`]: the attempt runs its effect and then
    /// claims the key *with its answer* in the same transaction, so the claim,
    /// the effect and the stored answer become visible together or not at all.
    /// An attempt whose key turns out to be taken rolls its effect back and
    /// answers as a duplicate; no read is spent on the first attempt's path.
    async fn execute_in_transaction<F>(&self, attempt: &Attempt<'_>, fingerprint: &Fingerprint, effect: F) -> Response
    where
        F: AsyncFnOnce(&mut Tx, &str) -> Result<Effect, ApiError> + Clone,
    {
        let (principal, key) = (attempt.principal, &attempt.headers.key);
        // The lease fields are not used: a claim that finishes in its own
        // transaction is never seen running.
        let new = attempt.new_operation(fingerprint, self.config.lease);
        let operation_id = new.operation_id.as_str();
        // A transaction never outlives the lease: a hung effect would hold its
        // locks (on SQLite, the one writer) for every other request.
        let attempt_in_transaction = async {
            let mut tx = match self.db.begin().await {
                Ok(tx) => tx,
                Err(e) => return self.server_error_unclaimed(attempt, fingerprint, e.into()),
            };
            // A duplicate that waited for the write lock while the first attempt
            // committed finds its answer here, and never starts the effect.
            if let Some(answer) = self.replay_cache.get(&principal.account_id, key.as_str()) {
                let _ = tx.rollback().await;
                return self.replay_cached(attempt, &answer, fingerprint);
            }
            // a clone: the effect runs again if this attempt ends up taking over a dead holder's lease
            match effect.clone()(&mut tx, operation_id).await {
                Ok(done) => {
                    let completion = done.completion();
                    match store::claim_finished(&mut tx, &new, &completion, attempt.started).await {
                        Ok(true) => {}
                        Ok(false) => {
                            // The key was taken (PostgreSQL waited for its holder to commit): ours is undone.
                            let _ = tx.rollback().await;
                            return self
                                .answer_taken_key(attempt, fingerprint, nothing_to_call, without_call_out!(effect))
                                .await;
                        }
                        Err(e) => {
                            let _ = tx.rollback().await;
                            return self.server_error_unclaimed(attempt, fingerprint, e.into());
                        }
                    }
                    if let Err(e) = self
                        .hand_to_outbox(&mut tx, new.event_of(), &done, completion.now)
                        .await
                    {
                        let _ = tx.rollback().await;
                        return self.server_error_unclaimed(attempt, fingerprint, e.into());
                    }
                    fail_point("idempotency::after_claim").await;
                    fail_point("idempotency::before_commit").await;
                    if let Err(e) = tx.commit().await {
                        return commit_failed(e);
                    }
                    self.wake_outbox(&done);
                    attempt.record_operation(operation_id, fingerprint);
                    telemetry::record_outcome("created");
                    self.remember(&principal.account_id, key, operation_id, fingerprint, &completion);
                    stored_response(&done.response, operation_id, false)
                }
                Err(error) if error.is_final() => {
                    let _ = tx.rollback().await;
                    let response = problem_response(&error);
                    let completion = Completion::failed(&response);
                    match self.claim_finished_alone(&new, &completion, attempt.started).await {
                        Ok(true) => {
                            attempt.record_operation(operation_id, fingerprint);
                            telemetry::record_outcome("failed");
                            self.remember(&principal.account_id, key, operation_id, fingerprint, &completion);
                            with_retry_after(stored_response(&response, operation_id, false), &error)
                        }
                        Ok(false) => {
                            self.answer_taken_key(attempt, fingerprint, nothing_to_call, without_call_out!(effect))
                                .await
                        }
                        Err(e) => self.server_error_unclaimed(attempt, fingerprint, e.into()),
                    }
                }
                Err(error) => {
                    let _ = tx.rollback().await;
                    // A duplicate's effect may fail because the first attempt's
                    // committed effect is in its way: if the key is taken, answer as
                    // a duplicate. Otherwise nothing was claimed, and a retry starts afresh.
                    if let Ok(Some(existing)) = self.find_and_count(&principal.account_id, key).await
                        && let Ok(Decision::Answer(response)) = self.decide(attempt, existing, fingerprint, false).await
                    {
                        return response;
                    }
                    self.server_error_unclaimed(attempt, fingerprint, error)
                }
            }
        };
        match tokio::time::timeout(self.config.lease, attempt_in_transaction).await {
            Ok(response) => response,
            Err(_) => self.server_error_unclaimed(
                attempt,
                fingerprint,
                ApiError::internal("the effect's transaction outlived the lease").with_detail(
                    "the operation took too long and was rolled back; nothing was committed. Retry with the same key",
                ),
            ),
        }
    }

    /// Writes the effect's outbox event, if it has one, in the transaction
    /// that completes its operation.
    async fn hand_to_outbox(
        &self,
        tx: &mut Tx,
        of: EventOf<'_>,
        done: &Effect,
        now: Timestamp,
    ) -> Result<(), sqlx::Error> {
        match &done.outbox {
            Some(message) => outbox::enqueue(tx, of, message, now).await,
            None => Ok(()),
        }
    }

    /// After the commit: this process's outbox worker sends the event now
    /// instead of at its next poll.
    fn wake_outbox(&self, done: &Effect) {
        if done.outbox.is_some() {
            self.outbox_wake.notify_one();
        }
    }

    /// A server error before anything was claimed: the attempt is journaled
    /// (nothing else happened), and the client may retry with the same key.
    fn server_error_unclaimed(&self, attempt: &Attempt<'_>, fingerprint: &Fingerprint, error: ApiError) -> Response {
        self.journal
            .observe([attempt.audit(AuditEvent::Attempted, None, fingerprint, attempt.started)]);
        telemetry::record_outcome("server_error");
        error.into_response()
    }

    /// Claims a key with a finished answer and journals it, in a transaction
    /// of its own: a first attempt whose effect failed (and was rolled back)
    /// with a final business failure.
    async fn claim_finished_alone(
        &self,
        new: &NewOperation<'_>,
        completion: &Completion<'_>,
        attempted_at: Timestamp,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.db.begin().await?;
        if !store::claim_finished(&mut tx, new, completion, attempted_at).await? {
            tx.rollback().await?;
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Completes an operation this attempt holds, with no effect to commit
    /// beside it (a final failure, a refused approval), and journals it.
    /// `false`: the lease was lost.
    async fn complete_alone(
        &self,
        operation: &OperationRecord,
        token: &str,
        completion: &Completion<'_>,
        journaled: &[Record],
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.db.begin().await?;
        if !store::complete(&mut tx, &operation.account_id, &operation.key, token, completion).await? {
            tx.rollback().await?;
            return Ok(false);
        }
        audit::record(&mut tx, journaled).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// A route whose policy wants a human: the attempt claims the key as
    /// `awaiting_approval`, with the approval record and its 202 answer, in
    /// one transaction. A retry finds the operation and is answered by
    /// [`Self::decide`]: the same 202 while it waits, the run once approved.
    async fn request_approval<F>(
        &self,
        attempt: &Attempt<'_>,
        fingerprint: &Fingerprint,
        summary: &ApprovalSummary,
        effect: F,
    ) -> Response
    where
        F: AsyncFnOnce(&mut Tx, &str) -> Result<Effect, ApiError> + Clone,
    {
        let new = attempt.new_operation(fingerprint, self.config.lease);
        let approval = ApprovalRecord {
            seq: 0,
            approval_id: new_approval_id(),
            account_id: attempt.principal.account_id.clone(),
            operation_id: new.operation_id.clone(),
            idempotency_key: attempt.headers.key.as_str().to_owned(),
            route: attempt.route.to_owned(),
            fingerprint: fingerprint.clone(),
            summary: summary.clone(),
            requested_by: attempt.principal.principal_id.clone(),
            created_at: new.now,
            expires_at: new.now.plus(self.config.approval_ttl),
            decision: None,
            decided_by: None,
            decided_at: None,
        };
        let mut answer = json_response(
            StatusCode::ACCEPTED,
            &ApprovalRequested {
                approval_id: approval.approval_id.clone(),
                operation_id: new.operation_id.clone(),
                idempotency_key: approval.idempotency_key.clone(),
                fingerprint: fingerprint.as_str().to_owned(),
                state: OperationState::AwaitingApproval,
                summary: summary.clone(),
                expires_at: approval.expires_at,
                status_url: status_url(&new.operation_id),
                approval_url: approval.url(),
            },
        );
        answer.location = Some(status_url(&new.operation_id));
        let journaled = [
            new.audit(AuditEvent::Attempted, attempt.started),
            new.audit(AuditEvent::Claimed, new.now),
            new.audit(AuditEvent::ApprovalRequested, new.now),
        ];
        let claimed = async {
            let mut tx = self.db.begin().await?;
            if !store::claim_awaiting_approval(&mut tx, &new, &answer, &approval.approval_id).await? {
                tx.rollback().await?;
                return Ok(false);
            }
            approval::insert(&mut tx, &approval).await?;
            audit::record(&mut tx, &journaled).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(true)
        };
        match claimed.await {
            Ok(true) => {
                attempt.record_operation(&new.operation_id, fingerprint);
                telemetry::record_outcome("awaiting_approval");
                stored_response(&answer, &new.operation_id, false)
            }
            Ok(false) => {
                self.answer_taken_key(attempt, fingerprint, nothing_to_call, without_call_out!(effect))
                    .await
            }
            Err(e) => self.server_error_unclaimed(attempt, fingerprint, e.into()),
        }
    }

    /// The answer to a retry whose operation is in the replay cache.
    fn replay_cached(&self, attempt: &Attempt<'_>, answer: &CachedAnswer, fingerprint: &Fingerprint) -> Response {
        let (account_id, key) = (&attempt.principal.account_id, &attempt.headers.key);
        self.attempts.count(account_id, key.as_str());
        attempt.record_operation(&answer.operation_id, fingerprint);
        let replayed = &answer.fingerprint == fingerprint;
        let outcome = if replayed {
            AuditEvent::Replayed
        } else {
            AuditEvent::KeyReused
        };
        self.observe(attempt, &answer.operation_id, fingerprint, Some(outcome));
        if replayed {
            telemetry::record_outcome("replayed");
            stored_response(&answer.response, &answer.operation_id, true)
        } else {
            telemetry::record_outcome("key_reused");
            key_reused(&answer.operation_id, answer.state)
        }
    }

    /// Journals an attempt answered from what is stored: `attempted`, then what it was told.
    fn observe(
        &self,
        attempt: &Attempt<'_>,
        operation_id: &str,
        fingerprint: &Fingerprint,
        outcome: Option<AuditEvent>,
    ) {
        let now = Timestamp::now();
        let attempted = attempt.audit(AuditEvent::Attempted, Some(operation_id), fingerprint, attempt.started);
        let told = outcome.map(|event| attempt.audit(event, Some(operation_id), fingerprint, now));
        self.journal.observe(std::iter::once(attempted).chain(told));
    }

    /// Keeps a finished answer for replays from memory. An operation still
    /// in progress (its work in the outbox) is not kept: its state changes.
    fn remember(
        &self,
        account_id: &str,
        key: &IdempotencyKey,
        operation_id: &str,
        fingerprint: &Fingerprint,
        done: &Completion<'_>,
    ) {
        if !done.state.is_finished() {
            return;
        }
        self.replay_cache.put(
            account_id,
            key.as_str(),
            operation_id,
            fingerprint,
            done.state,
            done.response,
            done.now,
        );
    }

    /// Reads the operation a key names, counting this request as an attempt at it.
    async fn find_and_count(
        &self,
        account_id: &str,
        key: &IdempotencyKey,
    ) -> Result<Option<OperationRecord>, sqlx::Error> {
        let found = store::find_by_key(&self.db, account_id, key.as_str()).await?;
        if found.is_some() {
            self.attempts.count(account_id, key.as_str());
        }
        Ok(found)
    }

    /// The answer for an attempt that found its key taken: whatever the
    /// operation stored, 409 while it runs — or, when its holder died and the
    /// lease ran out (or a human approved it), this attempt runs the effect.
    async fn answer_taken_key<T, W, F>(
        &self,
        attempt: &Attempt<'_>,
        fingerprint: &Fingerprint,
        call_out: W,
        effect: F,
    ) -> Response
    where
        W: AsyncFnOnce(&str) -> Result<T, ApiError>,
        F: AsyncFnOnce(&mut Tx, &str, T) -> Result<Effect, ApiError>,
    {
        let account_id = &attempt.principal.account_id;
        let decided = match self.find_and_count(account_id, &attempt.headers.key).await {
            Ok(Some(existing)) => self.decide(attempt, existing, fingerprint, true).await,
            Ok(None) => Ok(Decision::Vanished),
            Err(e) => Err(e.into()),
        };
        match decided {
            Ok(Decision::Answer(response)) => response,
            Ok(Decision::Run(operation)) => self.run(attempt, *operation, call_out, effect).await,
            // freed by a failed first attempt, or reaped: nothing holds the key now
            Ok(Decision::Vanished) => self.server_error_unclaimed(
                attempt,
                fingerprint,
                ApiError::internal("the operation holding the key vanished").with_detail(
                    "the operation holding this key was freed while this attempt waited; retry with the same key",
                ),
            ),
            Err(error) => self.server_error_unclaimed(attempt, fingerprint, error),
        }
    }

    /// [`ClaimMode::Leased`]: claim under a lease in a transaction of its own.
    async fn claim_or_decide(&self, attempt: &Attempt<'_>, fingerprint: &Fingerprint) -> Result<Decision, ApiError> {
        // Bounded: each round either claims, decides, or saw the row vanish.
        for _ in 0..3 {
            let new = attempt.new_operation(fingerprint, self.config.lease);
            let mut tx = self.db.begin().await?;
            if let Some(claimed) = store::claim(&mut tx, &new).await? {
                let journaled = [
                    new.audit(AuditEvent::Attempted, attempt.started),
                    new.audit(AuditEvent::Claimed, new.now),
                ];
                audit::record(&mut tx, &journaled).await?;
                tx.commit().await?;
                return Ok(Decision::Run(Box::new(claimed)));
            }
            tx.rollback().await?;
            let Some(existing) = self
                .find_and_count(&attempt.principal.account_id, &attempt.headers.key)
                .await?
            else {
                continue;
            };
            match self.decide(attempt, existing, fingerprint, true).await? {
                Decision::Vanished => continue,
                decision => return Ok(decision),
            }
        }
        Ok(Decision::Vanished)
    }

    /// The answer for an attempt whose key already names an operation.
    /// `may_take_over`: whether this attempt can still run the operation if
    /// it finds a lease that ran out or an approval given (it cannot once its
    /// effect was spent).
    ///
    /// `Prefer: wait=N` bounds the answer to N seconds: an attempt that has
    /// begun to wait never runs the operation itself, whose run could outlast
    /// the wait. A lease that runs out (or an approval given) while it waits
    /// is left to the next attempt, which finds it so on arrival and runs the
    /// operation as a first attempt does; the waiter answers the replay if
    /// the holder finishes in time, else 409 `request_in_progress`.
    async fn decide(
        &self,
        attempt: &Attempt<'_>,
        mut operation: OperationRecord,
        fingerprint: &Fingerprint,
        may_take_over: bool,
    ) -> Result<Decision, ApiError> {
        let deadline = attempt.headers.wait.map(|w| Instant::now() + w);
        let by = attempt.principal.principal_id.as_str();
        let mut waited = false;
        loop {
            attempt.record_operation(&operation.operation_id, fingerprint);
            let approval = match (&operation.state, &operation.approval_id) {
                (OperationState::AwaitingApproval, Some(id)) => {
                    let found = approval::find(&self.db, &operation.account_id, id).await?;
                    Some(found.ok_or_else(|| ApiError::internal("an operation awaiting approval has no approval"))?)
                }
                (OperationState::AwaitingApproval, None) => {
                    return Err(ApiError::internal("an operation awaiting approval has no approval"));
                }
                _ => None,
            };
            let now = Timestamp::now();
            let stored = Stored {
                fingerprint: &operation.fingerprint,
                state: operation.state,
                locked_until: operation.locked_until,
                answered: operation.response.is_some(),
                approval: approval.as_ref().map(|a| a.state(now)),
            };
            let asking = Asking {
                fingerprint,
                now,
                may_run: may_take_over && !waited,
                may_wait: deadline.is_some_and(|d| Instant::now() < d),
            };
            match verdict(&stored, &asking) {
                Verdict::KeyReused => {
                    telemetry::record_outcome("key_reused");
                    self.observe(
                        attempt,
                        &operation.operation_id,
                        fingerprint,
                        Some(AuditEvent::KeyReused),
                    );
                    return Ok(Decision::Answer(key_reused(&operation.operation_id, operation.state)));
                }
                Verdict::Replay => {
                    let response = self.replay_stored(attempt, &operation, fingerprint)?;
                    // only a finished answer is kept in memory: the others still change
                    if let Some(stored) = operation.response.as_ref().filter(|_| operation.state.is_finished()) {
                        self.replay_cache.put(
                            &operation.account_id,
                            operation.key.as_str(),
                            &operation.operation_id,
                            fingerprint,
                            operation.state,
                            stored,
                            operation.updated_at,
                        );
                    }
                    return Ok(Decision::Answer(response));
                }
                Verdict::InProgress => {
                    telemetry::record_outcome("in_progress");
                    self.observe(
                        attempt,
                        &operation.operation_id,
                        fingerprint,
                        Some(AuditEvent::InProgress),
                    );
                    return Ok(Decision::Answer(in_progress(&operation)));
                }
                Verdict::Wait => {
                    if let Some(deadline) = deadline {
                        tokio::time::sleep(WAIT_POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
                    }
                    waited = true;
                }
                Verdict::TakeOver => {
                    let locked_until = now.plus(self.config.lease);
                    let mut tx = self.db.begin().await?;
                    if let Some(taken) =
                        store::take_over(&mut tx, &operation, &new_lease_token(), locked_until, now).await?
                    {
                        let journaled = [
                            taken.audit(AuditEvent::Attempted, by, attempt.started),
                            taken.audit(AuditEvent::Claimed, by, now),
                        ];
                        audit::record(&mut tx, &journaled).await?;
                        tx.commit().await?;
                        tracing::warn!(operation_id = %taken.operation_id, "lease expired; this attempt took the operation over");
                        return Ok(Decision::Run(Box::new(taken)));
                    }
                    // another attempt took it first
                    tx.rollback().await?;
                }
                Verdict::StartApproved => {
                    let locked_until = now.plus(self.config.lease);
                    let mut tx = self.db.begin().await?;
                    if let Some(started) =
                        store::start_approved(&mut tx, &operation, &new_lease_token(), locked_until, now).await?
                    {
                        let journaled = [
                            started.audit(AuditEvent::Attempted, by, attempt.started),
                            started.audit(AuditEvent::Claimed, by, now),
                        ];
                        audit::record(&mut tx, &journaled).await?;
                        tx.commit().await?;
                        return Ok(Decision::Run(Box::new(started)));
                    }
                    // another retry started it first
                    tx.rollback().await?;
                }
                Verdict::Expire => {
                    if let Some(approval) = &approval {
                        self.expire(approval).await?;
                    }
                }
                Verdict::OutcomeUnknown => {
                    telemetry::record_outcome("outcome_unknown");
                    self.observe(attempt, &operation.operation_id, fingerprint, None);
                    let error = ApiError::new(
                        StatusCode::CONFLICT,
                        "operation_outcome_unknown",
                        "Outcome unknown",
                        "an external effect of this operation may or may not have happened; it is not executed again. Poll `status_url`",
                    )
                    .with("operation_id", &operation.operation_id)
                    .with("state", OperationState::Unknown)
                    .with("status_url", operation.status_url());
                    return Ok(Decision::Answer(with_operation_headers(
                        error.into_response(),
                        &operation.operation_id,
                        false,
                    )));
                }
            }
            // lost a race, waited a little, or settled an expired approval: look again
            match store::find_by_key(&self.db, &operation.account_id, operation.key.as_str()).await? {
                Some(fresh) => operation = fresh,
                None => return Ok(Decision::Vanished),
            }
        }
    }

    /// The operation's stored answer, replayed (and journaled as `replayed`).
    fn replay_stored(
        &self,
        attempt: &Attempt<'_>,
        operation: &OperationRecord,
        fingerprint: &Fingerprint,
    ) -> Result<Response, ApiError> {
        let stored = operation
            .response
            .as_ref()
            .ok_or_else(|| ApiError::internal("a finished operation has no stored answer"))?;
        telemetry::record_outcome("replayed");
        self.observe(
            attempt,
            &operation.operation_id,
            fingerprint,
            Some(AuditEvent::Replayed),
        );
        Ok(stored_response(stored, &operation.operation_id, true))
    }

    /// Runs the effect of an operation this attempt holds the lease of: first
    /// its call-out, if the route has one, outside any transaction; then the
    /// effect with what the call-out said. An operation bound to an approval
    /// runs only if the approval still allows it, checked in the effect's own
    /// transaction.
    async fn run<T, W, F>(&self, attempt: &Attempt<'_>, operation: OperationRecord, call_out: W, effect: F) -> Response
    where
        W: AsyncFnOnce(&str) -> Result<T, ApiError>,
        F: AsyncFnOnce(&mut Tx, &str, T) -> Result<Effect, ApiError>,
    {
        let token = operation.lease_token.clone().unwrap_or_default();
        let by = attempt.principal.principal_id.as_str();
        let (account_id, key, operation_id) = (&operation.account_id, &operation.key, &operation.operation_id);
        let journaled = |event: AuditEvent, at: Timestamp| [operation.audit(event, by, at)];
        let give_back = async |error: ApiError| {
            let freed = async {
                let mut tx = self.db.begin().await?;
                if store::release(&mut tx, &operation, &token).await? {
                    audit::record(&mut tx, &journaled(AuditEvent::Released, Timestamp::now())).await?;
                }
                tx.commit().await
            };
            if let Err(e) = freed.await {
                tracing::error!(%operation_id, error = %e, "could not free the key after a server error; it frees when the lease ends");
            }
            telemetry::record_outcome("server_error");
            with_operation_headers(error.into_response(), operation_id, false)
        };
        // a final business failure is stored and replayed; a server error frees the key
        let failed = async |error: ApiError| {
            if !error.is_final() {
                return give_back(error).await;
            }
            let response = problem_response(&error);
            let completion = Completion::failed(&response);
            match self
                .complete_alone(
                    &operation,
                    &token,
                    &completion,
                    &journaled(AuditEvent::Failed, completion.now),
                )
                .await
            {
                Ok(true) => {
                    telemetry::record_outcome("failed");
                    self.remember(account_id, key, operation_id, &operation.fingerprint, &completion);
                    with_retry_after(stored_response(&response, operation_id, false), &error)
                }
                Ok(false) => self.answer_current(attempt, &operation).await,
                Err(e) => give_back(e.into()).await,
            }
        };

        // the claim has committed: only now may the operation reach another system
        let said = match call_out(operation_id).await {
            Ok(said) => said,
            Err(error) => return failed(error).await,
        };
        let mut tx = match self.db.begin().await {
            Ok(tx) => tx,
            Err(e) => return give_back(e.into()).await,
        };
        if let Some(approval_id) = &operation.approval_id {
            let check = approval::check_for_execution(
                &mut tx,
                approval_id,
                operation_id,
                &operation.fingerprint,
                Timestamp::now(),
            )
            .await;
            match check {
                Ok(ExecutionCheck::Allowed) => {}
                Ok(refused) => {
                    let _ = tx.rollback().await;
                    let (state, event) = match refused {
                        ExecutionCheck::Expired => (ApprovalState::Expired, AuditEvent::Expired),
                        _ => (ApprovalState::Rejected, AuditEvent::Rejected),
                    };
                    let response = problem_response(&refusal(state, operation_id, approval_id));
                    let completion = Completion {
                        state: OperationState::Rejected,
                        ..Completion::failed(&response)
                    };
                    return match self
                        .complete_alone(&operation, &token, &completion, &journaled(event, completion.now))
                        .await
                    {
                        Ok(true) => {
                            telemetry::record_outcome("rejected");
                            self.remember(account_id, key, operation_id, &operation.fingerprint, &completion);
                            stored_response(&response, operation_id, false)
                        }
                        Ok(false) => self.answer_current(attempt, &operation).await,
                        Err(e) => give_back(e.into()).await,
                    };
                }
                Err(e) => {
                    let _ = tx.rollback().await;
                    return give_back(e.into()).await;
                }
            }
        }
        match effect(&mut tx, operation_id, said).await {
            Ok(done) => {
                let completion = done.completion();
                match store::complete(&mut tx, account_id, key, &token, &completion).await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Our lease ran out and another attempt took over: its run is the one that counts.
                        let _ = tx.rollback().await;
                        return self.answer_current(attempt, &operation).await;
                    }
                    Err(e) => {
                        let _ = tx.rollback().await;
                        return give_back(e.into()).await;
                    }
                }
                let recorded = async {
                    self.hand_to_outbox(&mut tx, operation.event_of(), &done, completion.now)
                        .await?;
                    if completion.state == OperationState::Completed {
                        audit::record(&mut tx, &journaled(AuditEvent::Completed, completion.now)).await?;
                    }
                    Ok::<_, sqlx::Error>(())
                };
                if let Err(e) = recorded.await {
                    let _ = tx.rollback().await;
                    return give_back(e.into()).await;
                }
                fail_point("idempotency::before_commit").await;
                if let Err(e) = tx.commit().await {
                    return give_back(e.into()).await;
                }
                self.wake_outbox(&done);
                telemetry::record_outcome("created");
                self.remember(account_id, key, operation_id, &operation.fingerprint, &completion);
                stored_response(&done.response, operation_id, false)
            }
            Err(error) => {
                let _ = tx.rollback().await;
                failed(error).await
            }
        }
    }

    /// The measurement baseline (`enabled: false`): the effect in its
    /// transaction, and nothing else of this module.
    async fn run_unguarded<F>(&self, effect: F) -> Response
    where
        F: AsyncFnOnce(&mut Tx, &str) -> Result<Effect, ApiError>,
    {
        let mut tx = match self.db.begin().await {
            Ok(tx) => tx,
            Err(e) => return ApiError::from(e).into_response(),
        };
        // no operation is stored: the effect gets an id that names none
        match effect(&mut tx, &new_operation_id()).await {
            Ok(done) if done.outbox.is_some() => {
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

    /// After losing the lease: answer as a duplicate would.
    async fn answer_current(&self, attempt: &Attempt<'_>, operation: &OperationRecord) -> Response {
        match store::find_by_key(&self.db, &operation.account_id, operation.key.as_str()).await {
            Ok(Some(current)) => match self.decide(attempt, current, &operation.fingerprint, false).await {
                Ok(Decision::Answer(response)) => response,
                Ok(_) => in_progress(operation),
                Err(error) => error.into_response(),
            },
            Ok(None) => in_progress(operation),
            Err(e) => ApiError::from(e).into_response(),
        }
    }
}

/// The call-out of an operation whose effect is all in its database: none.
async fn nothing_to_call(_operation_id: &str) -> Result<(), ApiError> {
    Ok(())
}

/// A commit whose outcome the server cannot know (the connection broke while
/// committing). A retry with the same key finds out: a replay if it committed.
fn commit_failed(error: sqlx::Error) -> Response {
    ApiError::internal(format!("commit: {error}"))
        .with_detail("the server could not confirm the commit; retry with the same key: if it committed, the retry replays its answer")
        .into_response()
}

/// 422: the key names another request. Only the operation's id and state are
/// told, never what it stored.
fn key_reused(operation_id: &str, state: OperationState) -> Response {
    let error = ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
        "Idempotency-Key reused with a different request",
        "this key already names an operation with a different request; a new intention needs a new key",
    )
    .with("operation_id", operation_id)
    .with("state", state);
    with_operation_headers(error.into_response(), operation_id, false)
}

/// A final business failure, as it is stored and replayed.
pub(crate) fn problem_response(error: &ApiError) -> StoredResponse {
    StoredResponse {
        status: error.status(),
        content_type: PROBLEM_JSON.into(),
        location: None,
        body: error.to_problem_json(),
    }
}

fn in_progress(operation: &OperationRecord) -> Response {
    let error = ApiError::new(
        StatusCode::CONFLICT,
        "request_in_progress",
        "Request in progress",
        "an earlier attempt with this key is still running; retry with the same key after `Retry-After` seconds, or poll `status_url`",
    )
    .with("operation_id", &operation.operation_id)
    .with("state", operation.state)
    .with("status_url", operation.status_url())
    .with_retry_after(operation.retry_after_seconds());
    with_operation_headers(error.into_response(), &operation.operation_id, false)
}

/// The stored answer, byte for byte, with the operation's headers.
pub fn stored_response(stored: &StoredResponse, operation_id: &str, replayed: bool) -> Response {
    with_operation_headers(stored_response_without_operation(stored), operation_id, replayed)
}

fn stored_response_without_operation(stored: &StoredResponse) -> Response {
    let mut response = (stored.status, stored.body.clone()).into_response();
    let headers = response.headers_mut();
    if let Ok(content_type) = HeaderValue::from_str(&stored.content_type) {
        headers.insert(header::CONTENT_TYPE, content_type);
    }
    if let Some(location) = stored.location.as_deref().and_then(|l| HeaderValue::from_str(l).ok()) {
        headers.insert(header::LOCATION, location);
    }
    response
}

fn with_operation_headers(mut response: Response, operation_id: &str, replayed: bool) -> Response {
    let headers = response.headers_mut();
    if let Ok(id) = HeaderValue::from_str(operation_id) {
        headers.insert(OPERATION_ID, id);
    }
    headers.insert(
        IDEMPOTENT_REPLAYED,
        HeaderValue::from_static(if replayed { "true" } else { "false" }),
    );
    response
}

fn with_retry_after(mut response: Response, error: &ApiError) -> Response {
    if let Some(seconds) = error.retry_after() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

fn new_lease_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A place where a test can stop the process dead (docs/contract.md §5's
/// crash): with the `failpoints` feature and `FAILPOINTS=<name>=return`, the
/// request stops here and holds what it has until the process is killed.
pub(crate) async fn fail_point(name: &str) {
    #[cfg(feature = "failpoints")]
    {
        // fail points are read from `FAILPOINTS` once per process, wherever it started
        static FROM_ENV: std::sync::Once = std::sync::Once::new();
        FROM_ENV.call_once(|| std::mem::forget(fail::FailScenario::setup()));
    }
    #[cfg(feature = "failpoints")]
    if fail::eval(name, |_| ()).is_some() {
        tracing::warn!(
            fail_point = name,
            "fail point reached: holding here until the process is killed"
        );
        std::future::pending::<()>().await;
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

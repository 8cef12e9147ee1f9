//! Running one attempt of an operation: claim, or replay, or refuse — and when
//! this attempt owns the operation, run its effect and complete it in one
//! transaction (CONTRACT §3, §5).

use std::time::{Duration, Instant};

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use platform::{ApiError, Principal, Timestamp, Tx, error::PROBLEM_JSON, telemetry};
use serde::Serialize;

use crate::{
    ClaimMode, Idempotency,
    fingerprint::Fingerprint,
    key::{IdempotencyHeaders, IdempotencyKey},
    operation::{OperationRecord, OperationState, ResourceRef, StoredResponse, new_operation_id},
    replay_cache::CachedAnswer,
    store::{self, Completion, NewOperation},
};

pub const OPERATION_ID: &str = "operation-id";
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// How often a duplicate that was asked to wait (`Prefer: wait`) looks again.
const WAIT_POLL: Duration = Duration::from_millis(25);

/// One request that carries an idempotency key: who sent it, to which route.
#[derive(Debug)]
pub struct Attempt<'a> {
    pub principal: &'a Principal,
    pub headers: IdempotencyHeaders,
    pub method: &'static str,
    /// The route *template*, e.g. `/v1/tickets/{ticket_id}/comments`.
    pub route: &'static str,
}

impl<'a> Attempt<'a> {
    pub fn post(route: &'static str, principal: &'a Principal, headers: IdempotencyHeaders) -> Self {
        Attempt {
            principal,
            headers,
            method: "POST",
            route,
        }
    }
}

/// What the effect produced: the first answer, and what it made.
#[derive(Debug, Clone)]
pub struct Effect {
    response: StoredResponse,
    resource: Option<ResourceRef>,
}

impl Effect {
    /// A JSON answer with `status`.
    pub fn json(status: StatusCode, body: &impl Serialize) -> Self {
        Effect {
            response: StoredResponse {
                status,
                content_type: "application/json".into(),
                location: None,
                body: serde_json::to_vec(body).unwrap_or_default(),
            },
            resource: None,
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
}

/// Where an attempt stands after looking at an existing operation.
enum Decision {
    /// Answer the client with this; nothing runs.
    Answer(Response),
    /// This attempt took the lease over and runs the operation.
    Run(Box<OperationRecord>),
    /// The operation disappeared under us (reaped, or freed): claim again.
    Vanished,
}

impl Idempotency {
    /// Runs one attempt of an operation. `command` is the validated command
    /// (what the fingerprint hashes); `effect` does the business writes in the
    /// transaction it is given and says what to answer. The operation's
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
    pub async fn execute<C, F>(&self, attempt: Attempt<'_>, command: &C, effect: F) -> Response
    where
        C: Serialize,
        F: AsyncFnOnce(&mut Tx) -> Result<Effect, ApiError> + Clone,
    {
        if !self.config.enabled {
            return self.run_unguarded(effect).await;
        }
        let account_id = attempt.principal.account_id.as_str();
        let fingerprint = Fingerprint::of(attempt.method, attempt.route, account_id, command);
        if let Some(answer) = self.replay_cache.get(account_id, attempt.headers.key.as_str()) {
            return self.replay_cached(&answer, account_id, &attempt.headers.key, &fingerprint);
        }
        if self.config.claim == ClaimMode::InTransaction {
            return self.execute_in_transaction(&attempt, &fingerprint, effect).await;
        }
        let owned = match self.claim_or_decide(&attempt, &fingerprint).await {
            Ok(Decision::Run(operation)) => *operation,
            Ok(Decision::Answer(response)) => return response,
            Ok(Decision::Vanished) => {
                return ApiError::internal("the operation kept disappearing while it was claimed").into_response();
            }
            Err(error) => return error.into_response(),
        };
        telemetry::record_operation(&owned.operation_id, fingerprint.as_str());
        fail_point("idempotency::after_claim").await;
        self.run(owned, effect).await
    }

    /// [`ClaimMode::InTransaction`]: the attempt runs its effect and then
    /// claims the key *with its answer* in the same transaction, so the claim,
    /// the effect and the stored answer become visible together or not at all.
    /// An attempt whose key turns out to be taken rolls its effect back and
    /// answers as a duplicate; no read is spent on the first attempt's path.
    async fn execute_in_transaction<F>(&self, attempt: &Attempt<'_>, fingerprint: &Fingerprint, effect: F) -> Response
    where
        F: AsyncFnOnce(&mut Tx) -> Result<Effect, ApiError> + Clone,
    {
        let (principal, key) = (attempt.principal, &attempt.headers.key);
        let now = Timestamp::now();
        let new = NewOperation {
            account_id: &principal.account_id,
            key,
            operation_id: new_operation_id(),
            principal_id: &principal.principal_id,
            method: attempt.method,
            route: attempt.route,
            fingerprint,
            lease_token: String::new(),
            locked_until: now,
            now,
        };
        // A transaction never outlives the lease: a hung effect would hold its
        // locks (on SQLite, the one writer) for every other request.
        let attempt_in_transaction = async {
            let operation_id = new.operation_id.as_str();
            let mut tx = match self.db.begin().await {
                Ok(tx) => tx,
                Err(e) => return ApiError::from(e).into_response(),
            };
            // A duplicate that waited for the write lock while the first attempt
            // committed finds its answer here, and never starts the effect.
            if let Some(answer) = self.replay_cache.get(&principal.account_id, key.as_str()) {
                let _ = tx.rollback().await;
                return self.replay_cached(&answer, &principal.account_id, key, fingerprint);
            }
            // a clone: the effect runs again if this attempt ends up taking over a dead holder's lease
            match effect.clone()(&mut tx).await {
                Ok(done) => {
                    let completion = Completion {
                        state: OperationState::Completed,
                        response: &done.response,
                        resource: done.resource.as_ref(),
                        external_ref: None,
                        now: Timestamp::now(),
                    };
                    match store::claim_finished(&mut tx, &new, &completion).await {
                        Ok(true) => {}
                        Ok(false) => {
                            // The key was taken (PostgreSQL waited for its holder to commit): ours is undone.
                            let _ = tx.rollback().await;
                            return self.answer_taken_key(attempt, fingerprint, effect).await;
                        }
                        Err(e) => {
                            let _ = tx.rollback().await;
                            return ApiError::from(e).into_response();
                        }
                    }
                    fail_point("idempotency::after_claim").await;
                    fail_point("idempotency::before_commit").await;
                    if let Err(e) = tx.commit().await {
                        return commit_failed(e);
                    }
                    telemetry::record_operation(operation_id, fingerprint.as_str());
                    telemetry::record_outcome("created");
                    self.remember(&principal.account_id, key, operation_id, fingerprint, &completion);
                    stored_response(&done.response, operation_id, false)
                }
                Err(error) if error.is_final() => {
                    let _ = tx.rollback().await;
                    let response = problem_response(&error);
                    let completion = Completion::failed(&response);
                    match store::claim_finished_without_effect(&self.db, &new, &completion).await {
                        Ok(true) => {
                            telemetry::record_operation(operation_id, fingerprint.as_str());
                            telemetry::record_outcome("failed");
                            self.remember(&principal.account_id, key, operation_id, fingerprint, &completion);
                            with_retry_after(stored_response(&response, operation_id, false), &error)
                        }
                        Ok(false) => self.answer_taken_key(attempt, fingerprint, effect).await,
                        Err(e) => ApiError::from(e).into_response(),
                    }
                }
                Err(error) => {
                    let _ = tx.rollback().await;
                    // A duplicate's effect may fail because the first attempt's
                    // committed effect is in its way: if the key is taken, answer as
                    // a duplicate. Otherwise nothing was claimed, and a retry starts afresh.
                    match self.find_and_count(&principal.account_id, key).await {
                        Ok(Some(existing)) => {
                            match self.decide(existing, fingerprint, attempt.headers.wait, false).await {
                                Ok(Decision::Answer(response)) => response,
                                _ => error.into_response(),
                            }
                        }
                        _ => error.into_response(),
                    }
                }
            }
        };
        match tokio::time::timeout(self.config.lease, attempt_in_transaction).await {
            Ok(response) => response,
            Err(_) => ApiError::internal("the effect's transaction outlived the lease")
                .with_detail(
                    "the operation took too long and was rolled back; nothing was committed. Retry with the same key",
                )
                .into_response(),
        }
    }

    /// The answer to a retry whose operation is in the replay cache.
    fn replay_cached(
        &self,
        answer: &CachedAnswer,
        account_id: &str,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Response {
        self.attempts.count(account_id, key.as_str());
        telemetry::record_operation(&answer.operation_id, fingerprint.as_str());
        if &answer.fingerprint == fingerprint {
            telemetry::record_outcome("replayed");
            stored_response(&answer.response, &answer.operation_id, true)
        } else {
            telemetry::record_outcome("key_reused");
            key_reused(&answer.operation_id, answer.state)
        }
    }

    /// Keeps a finished answer for replays from memory.
    fn remember(
        &self,
        account_id: &str,
        key: &IdempotencyKey,
        operation_id: &str,
        fingerprint: &Fingerprint,
        done: &Completion<'_>,
    ) {
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
    /// lease ran out, this attempt takes it over and runs the effect again.
    async fn answer_taken_key<F>(&self, attempt: &Attempt<'_>, fingerprint: &Fingerprint, effect: F) -> Response
    where
        F: AsyncFnOnce(&mut Tx) -> Result<Effect, ApiError> + Clone,
    {
        let account_id = &attempt.principal.account_id;
        match self.find_and_count(account_id, &attempt.headers.key).await {
            Ok(Some(existing)) => match self.decide(existing, fingerprint, attempt.headers.wait, true).await {
                Ok(Decision::Answer(response)) => response,
                Ok(Decision::Run(operation)) => self.run(*operation, effect).await,
                Ok(Decision::Vanished) => ApiError::internal("the operation that held the key is gone").into_response(),
                Err(error) => error.into_response(),
            },
            Ok(None) => ApiError::internal("the operation that held the key is gone").into_response(),
            Err(e) => ApiError::from(e).into_response(),
        }
    }

    async fn claim_or_decide(&self, attempt: &Attempt<'_>, fingerprint: &Fingerprint) -> Result<Decision, ApiError> {
        let principal = attempt.principal;
        // Bounded: each round either claims, decides, or saw the row vanish.
        for _ in 0..3 {
            let now = Timestamp::now();
            let new = NewOperation {
                account_id: &principal.account_id,
                key: &attempt.headers.key,
                operation_id: new_operation_id(),
                principal_id: &principal.principal_id,
                method: attempt.method,
                route: attempt.route,
                fingerprint,
                lease_token: new_lease_token(),
                locked_until: now.plus(self.config.lease),
                now,
            };
            if let Some(claimed) = store::claim(&self.db, &new).await? {
                return Ok(Decision::Run(Box::new(claimed)));
            }
            let Some(existing) = self.find_and_count(&principal.account_id, &attempt.headers.key).await? else {
                continue;
            };
            match self.decide(existing, fingerprint, attempt.headers.wait, true).await? {
                Decision::Vanished => continue,
                decision => return Ok(decision),
            }
        }
        Ok(Decision::Vanished)
    }

    /// The answer for an attempt whose key already names an operation.
    /// `may_take_over`: whether this attempt can still run the operation if
    /// it finds a lease that ran out (it cannot once its effect was spent).
    async fn decide(
        &self,
        mut operation: OperationRecord,
        fingerprint: &Fingerprint,
        wait: Option<Duration>,
        may_take_over: bool,
    ) -> Result<Decision, ApiError> {
        let deadline = wait.map(|w| Instant::now() + w);
        loop {
            if &operation.fingerprint != fingerprint {
                telemetry::record_operation(&operation.operation_id, fingerprint.as_str());
                telemetry::record_outcome("key_reused");
                return Ok(Decision::Answer(key_reused(&operation.operation_id, operation.state)));
            }
            match operation.state {
                OperationState::InProgress => {
                    let now = Timestamp::now();
                    if may_take_over && operation.lease_expired(now) {
                        let locked_until = now.plus(self.config.lease);
                        if let Some(taken) =
                            store::take_over(&self.db, &operation, &new_lease_token(), locked_until, now).await?
                        {
                            tracing::warn!(operation_id = %taken.operation_id, "lease expired; this attempt took the operation over");
                            return Ok(Decision::Run(Box::new(taken)));
                        }
                    } else if let Some(deadline) = deadline.filter(|d| Instant::now() < *d) {
                        tokio::time::sleep(WAIT_POLL.min(deadline - Instant::now())).await;
                    } else {
                        telemetry::record_operation(&operation.operation_id, fingerprint.as_str());
                        telemetry::record_outcome("in_progress");
                        return Ok(Decision::Answer(in_progress(&operation)));
                    }
                    // lost the takeover, or waited a little: look again
                    match store::find_by_key(&self.db, &operation.account_id, operation.key.as_str()).await? {
                        Some(fresh) => operation = fresh,
                        None => return Ok(Decision::Vanished),
                    }
                }
                OperationState::Unknown if operation.response.is_none() => {
                    telemetry::record_operation(&operation.operation_id, fingerprint.as_str());
                    telemetry::record_outcome("outcome_unknown");
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
                // an unknown outcome whose first answer (a 202) was stored keeps replaying it
                OperationState::Unknown
                | OperationState::Completed
                | OperationState::Failed
                | OperationState::Rejected
                | OperationState::AwaitingApproval => {
                    telemetry::record_operation(&operation.operation_id, fingerprint.as_str());
                    telemetry::record_outcome("replayed");
                    let stored = operation
                        .response
                        .as_ref()
                        .ok_or_else(|| ApiError::internal("a finished operation has no stored answer"))?;
                    self.replay_cache.put(
                        &operation.account_id,
                        operation.key.as_str(),
                        &operation.operation_id,
                        fingerprint,
                        operation.state,
                        stored,
                        operation.updated_at,
                    );
                    return Ok(Decision::Answer(stored_response(stored, &operation.operation_id, true)));
                }
            }
        }
    }

    /// Runs the effect of an operation this attempt holds the lease of.
    async fn run<F>(&self, operation: OperationRecord, effect: F) -> Response
    where
        F: AsyncFnOnce(&mut Tx) -> Result<Effect, ApiError> + Clone,
    {
        let token = operation.lease_token.clone().unwrap_or_default();
        let (account_id, key, operation_id) = (&operation.account_id, &operation.key, &operation.operation_id);
        let free_the_key = async |error: ApiError| {
            if let Err(e) = store::release(&self.db, account_id, key, &token).await {
                tracing::error!(%operation_id, error = %e, "could not free the key after a server error; it frees when the lease ends");
            }
            telemetry::record_outcome("server_error");
            with_operation_headers(error.into_response(), operation_id, false)
        };

        let mut tx = match self.db.begin().await {
            Ok(tx) => tx,
            Err(e) => return free_the_key(e.into()).await,
        };
        match effect(&mut tx).await {
            Ok(done) => {
                let completion = Completion {
                    state: OperationState::Completed,
                    response: &done.response,
                    resource: done.resource.as_ref(),
                    external_ref: None,
                    now: Timestamp::now(),
                };
                match store::complete(&mut tx, account_id, key, &token, &completion).await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Our lease ran out and another attempt took over: its run is the one that counts.
                        let _ = tx.rollback().await;
                        return self.answer_current(&operation).await;
                    }
                    Err(e) => {
                        let _ = tx.rollback().await;
                        return free_the_key(e.into()).await;
                    }
                }
                fail_point("idempotency::before_commit").await;
                if let Err(e) = tx.commit().await {
                    return free_the_key(e.into()).await;
                }
                telemetry::record_outcome("created");
                self.remember(account_id, key, operation_id, &operation.fingerprint, &completion);
                stored_response(&done.response, operation_id, false)
            }
            Err(error) if error.is_final() => {
                let _ = tx.rollback().await;
                let response = problem_response(&error);
                let completion = Completion::failed(&response);
                match store::finish(&self.db, account_id, key, &token, &completion).await {
                    Ok(true) => {
                        telemetry::record_outcome("failed");
                        self.remember(account_id, key, operation_id, &operation.fingerprint, &completion);
                        with_retry_after(stored_response(&response, operation_id, false), &error)
                    }
                    Ok(false) => self.answer_current(&operation).await,
                    Err(e) => free_the_key(e.into()).await,
                }
            }
            Err(error) => {
                let _ = tx.rollback().await;
                free_the_key(error).await
            }
        }
    }

    /// The measurement baseline (`enabled: false`): the effect in its
    /// transaction, and nothing else of this module.
    async fn run_unguarded<F>(&self, effect: F) -> Response
    where
        F: AsyncFnOnce(&mut Tx) -> Result<Effect, ApiError> + Clone,
    {
        let mut tx = match self.db.begin().await {
            Ok(tx) => tx,
            Err(e) => return ApiError::from(e).into_response(),
        };
        match effect(&mut tx).await {
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
    async fn answer_current(&self, operation: &OperationRecord) -> Response {
        match store::find_by_key(&self.db, &operation.account_id, operation.key.as_str()).await {
            Ok(Some(current)) => match self.decide(current, &operation.fingerprint, None, false).await {
                Ok(Decision::Answer(response)) => response,
                Ok(_) => in_progress(operation),
                Err(error) => error.into_response(),
            },
            Ok(None) => in_progress(operation),
            Err(e) => ApiError::from(e).into_response(),
        }
    }
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
fn problem_response(error: &ApiError) -> StoredResponse {
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

/// A place where a test can stop the process dead (CONTRACT §5's crash): with
/// the `failpoints` feature and `FAILPOINTS=<name>=return`, the request stops
/// here and holds what it has until the process is killed.
async fn fail_point(name: &str) {
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

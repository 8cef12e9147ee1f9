//! Answers an attempt gives without running anything — a replay, a reused
//! key, a server error before any claim — journaled as observations, and the
//! finished answers remembered for the next replay (docs/contract.md §3, §8;
//! docs/design.md §4).

use axum::response::{IntoResponse, Response};
use platform::{ApiError, Timestamp, telemetry};

use super::Attempt;
use crate::{
    fingerprint::Fingerprint,
    key::IdempotencyKey,
    layer::Idempotency,
    operation::OperationRecord,
    replay_cache::CachedAnswer,
    responses::{key_reused, stored_response},
    store::Completion,
    transitions::AuditEvent,
};

impl Idempotency {
    /// The answer this process remembers for the key, if it remembers one
    /// and the database it learned it from is still the one it reaches: a
    /// failover may have taken the operation away (docs/design.md §4).
    pub(super) async fn remembered(&self, account_id: &str, key: &str) -> Option<std::sync::Arc<CachedAnswer>> {
        self.replay_cache.get(account_id, key)?;
        if !self.db.still_the_same_server().await {
            return None;
        }
        self.replay_cache.get(account_id, key)
    }

    /// The answer to a retry whose operation is in the replay cache.
    pub(super) async fn replay_cached(
        &self,
        attempt: &Attempt<'_>,
        answer: &CachedAnswer,
        fingerprint: &Fingerprint,
    ) -> Response {
        let (account_id, key) = (&attempt.principal.account_id, &attempt.headers.key);
        self.attempts.count(&self.db, account_id, key.as_str()).await;
        attempt.record_operation(&answer.operation_id, fingerprint);
        let replayed = &answer.fingerprint == fingerprint;
        let outcome = if replayed {
            AuditEvent::Replayed
        } else {
            AuditEvent::KeyReused
        };
        self.observe(attempt, &answer.operation_id, fingerprint, Some(outcome))
            .await;
        if replayed {
            telemetry::record_outcome("replayed");
            stored_response(&answer.response, &answer.operation_id, true)
        } else {
            telemetry::record_outcome("key_reused");
            key_reused(&answer.operation_id, answer.state)
        }
    }

    /// The operation's stored answer, replayed (and journaled as `replayed`).
    pub(super) async fn replay_stored(
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
        )
        .await;
        Ok(stored_response(stored, &operation.operation_id, true))
    }

    /// Journals an attempt answered from what is stored, as one entry: what
    /// it was told (`replayed`, `key_reused`, `in_progress`), which stands
    /// for the attempt too (docs/contract.md §8), or `attempted` when what it
    /// was told has no event of its own.
    pub(super) async fn observe(
        &self,
        attempt: &Attempt<'_>,
        operation_id: &str,
        fingerprint: &Fingerprint,
        outcome: Option<AuditEvent>,
    ) {
        let observed = match outcome {
            Some(told) => attempt.audit(told, Some(operation_id), fingerprint, Timestamp::now()),
            None => attempt.audit(AuditEvent::Attempted, Some(operation_id), fingerprint, attempt.started),
        };
        self.transitions.observe(&self.db, observed).await;
    }

    /// Keeps a finished answer for replays from memory, for as long as no
    /// outage is seen after `attempt` began. An operation still in progress
    /// (its work in the outbox) is not kept: its state changes.
    pub(super) fn remember(
        &self,
        attempt: &Attempt<'_>,
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
            attempt.outages_seen,
        );
    }

    /// A server error before anything was claimed: the attempt is journaled
    /// (nothing else happened), and the client may retry with the same key.
    pub(super) async fn server_error_unclaimed(
        &self,
        attempt: &Attempt<'_>,
        fingerprint: &Fingerprint,
        error: ApiError,
    ) -> Response {
        self.transitions
            .observe(
                &self.db,
                attempt.audit(AuditEvent::Attempted, None, fingerprint, attempt.started),
            )
            .await;
        telemetry::record_outcome("server_error");
        error.into_response()
    }
}

//! Answers an attempt gives without running anything, journaled as observations (docs/design.md §4, §8).

use axum::response::{IntoResponse, Response};
use platform::{ApiError, Timestamp, telemetry};

use super::Attempt;
use crate::{
    layer::Idempotency,
    operation::{OperationState, StoredResponse},
    replay_cache::CachedAnswer,
    responses::{key_reused, stored_response},
    transitions::AuditEvent,
};

impl Idempotency {
    /// The answer this process remembers for the key, if the database it learned it from is still the
    /// one it reaches: a failover may have taken the operation away (docs/design.md §4).
    pub(super) async fn remembered(&self, account_id: &str, key: &str) -> Option<std::sync::Arc<CachedAnswer>> {
        self.replay_cache.get(account_id, key)?;
        if !self.db.still_the_same_server().await {
            return None;
        }
        self.replay_cache.get(account_id, key)
    }

    /// The answer to a retry whose operation is in the replay cache.
    pub(super) async fn replay_cached(&self, attempt: &Attempt<'_>, answer: &CachedAnswer) -> Response {
        let (account_id, key) = (&attempt.principal.account_id, &attempt.headers.key);
        self.attempts.count(&self.db, account_id, key.as_str()).await;
        attempt.record_operation(&answer.operation_id);
        if answer.fingerprint != attempt.fingerprint {
            return self
                .refuse_reused_key(attempt, &answer.operation_id, answer.state)
                .await;
        }
        self.replay(attempt, &answer.operation_id, &answer.response).await
    }

    /// The operation's stored answer, replayed (and journaled as `replayed`).
    pub(super) async fn replay(&self, attempt: &Attempt<'_>, operation_id: &str, stored: &StoredResponse) -> Response {
        telemetry::record_outcome("replayed");
        self.observe(attempt, operation_id, Some(AuditEvent::Replayed)).await;
        stored_response(stored, operation_id, true)
    }

    /// 422 for a key that names another request (journaled as `key_reused`).
    pub(super) async fn refuse_reused_key(
        &self,
        attempt: &Attempt<'_>,
        operation_id: &str,
        state: OperationState,
    ) -> Response {
        telemetry::record_outcome("key_reused");
        self.observe(attempt, operation_id, Some(AuditEvent::KeyReused)).await;
        key_reused(operation_id, state)
    }

    /// Journals an attempt answered from what is stored as one entry: what it was told, which stands
    /// for the attempt too, or `attempted` when that has no event of its own (docs/contract.md §8).
    pub(super) async fn observe(&self, attempt: &Attempt<'_>, operation_id: &str, outcome: Option<AuditEvent>) {
        let observed = match outcome {
            Some(told) => attempt.audit(told, Some(operation_id), Timestamp::now()),
            None => attempt.audit(AuditEvent::Attempted, Some(operation_id), attempt.started),
        };
        self.transitions.observe(&self.db, observed).await;
    }

    /// A server error before anything was claimed: only the attempt is journaled, and the key stays free.
    pub(super) async fn server_error_unclaimed(&self, attempt: &Attempt<'_>, error: ApiError) -> Response {
        self.transitions
            .observe(&self.db, attempt.audit(AuditEvent::Attempted, None, attempt.started))
            .await;
        telemetry::record_outcome("server_error");
        error.into_response()
    }
}

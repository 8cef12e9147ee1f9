//! What a route's effect answers, and the work it hands to the outbox.

use axum::http::StatusCode;
use platform::{Timestamp, Tx};
use serde::Serialize;

use crate::{
    layer::Idempotency,
    operation::{OperationIdentity, OperationState, ResourceRef, StoredResponse},
    outbox,
    store::Completion,
};

/// What the effect produced: the first answer, what it made, and the work it
/// hands to the outbox, if any.
#[derive(Debug, Clone)]
pub struct Effect {
    pub(super) response: StoredResponse,
    pub(super) resource: Option<ResourceRef>,
    pub(super) outbox: Option<outbox::Message>,
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
    pub(super) fn completion(&self) -> Completion<'_> {
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

pub(super) fn json_response(status: StatusCode, body: &impl Serialize) -> StoredResponse {
    StoredResponse {
        status,
        content_type: "application/json".into(),
        location: None,
        body: serde_json::to_vec(body).unwrap_or_default(),
    }
}

impl Idempotency {
    /// Writes the effect's outbox event, if it has one, in the transaction
    /// that completes its operation.
    pub(super) async fn hand_to_outbox(
        &self,
        tx: &mut Tx,
        of: OperationIdentity<'_>,
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
    pub(super) fn wake_outbox(&self, done: &Effect) {
        if done.outbox.is_some() {
            self.outbox_wake.notify_one();
        }
    }
}

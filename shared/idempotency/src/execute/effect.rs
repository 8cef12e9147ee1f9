//! What a route's effect answers, and the work it hands on.

use axum::http::StatusCode;
use platform::Timestamp;
use serde::Serialize;

use std::sync::Arc;

use crate::{
    handoff::Handoff,
    operation::{OperationState, ResourceRef, StoredResponse},
    store::Completion,
};

/// What the effect produced: the first answer, what it made, and the work it hands on, if any.
#[derive(Debug, Clone)]
pub struct Effect {
    pub(super) response: StoredResponse,
    pub(super) resource: Option<ResourceRef>,
    pub(super) handoff: Option<Arc<dyn Handoff>>,
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
            handoff: None,
        }
    }

    /// Names the resource the operation made or acted on; it also becomes the answer's `Location`.
    pub fn with_resource(mut self, kind: &str, id: &str, url: String) -> Self {
        self.response.location = Some(url.clone());
        self.resource = Some(ResourceRef {
            kind: kind.into(),
            id: id.into(),
            url,
        });
        self
    }

    /// Work this effect hands on ([`Handoff`]): the operation answers now and stays `in_progress`
    /// until the work is settled.
    pub fn with_handoff(mut self, work: impl Handoff) -> Self {
        self.handoff = Some(Arc::new(work));
        self
    }

    /// How the operation stands once this effect commits.
    pub(super) fn completion(&self) -> Completion<'_> {
        Completion {
            state: if self.handoff.is_some() {
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

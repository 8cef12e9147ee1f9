//! What a person does from the page — decide on an approval, settle an
//! operation whose outcome is unknown, send a dead delivery again — each a
//! posted form, sent on to its service with the session's key. The service
//! decides who may; the console shows its answer in words.

use axum::{
    Form,
    extract::State,
    http::HeaderMap,
    response::{IntoResponse, Redirect, Response},
};
use serde::Deserialize;
use serde_json::Value;

use super::{
    Console, ServiceLink,
    access::TurnedAway,
    page::{PageQuery, is_approval_id, is_operation_id},
    services,
    session::Session,
    url_encoded,
};

#[derive(Debug, Deserialize)]
pub(super) struct DecideForm {
    service: String,
    approval_id: String,
    fingerprint: String,
    decision: String,
    /// The session's form token: the form was one this console rendered for this session.
    #[serde(default)]
    form_token: String,
}

pub(super) async fn decide(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(form): Form<DecideForm>,
) -> Result<Response, TurnedAway> {
    let session = console.form_session(&headers, &form.form_token)?;
    if !is_approval_id(&form.approval_id) {
        let problem = "That is not an approval id (apr_ and 32 hex digits); reload the page.";
        return Ok(console
            .with_problem(&session, &PageQuery::of(&form.service), problem)
            .await);
    }
    let service = console.service_for(&session, &form.service).await?;
    let decision = if form.decision == "approve" {
        "approve"
    } else {
        "reject"
    };
    let path = format!("/v1/approvals/{}/decision", form.approval_id);
    let body = serde_json::json!({"decision": decision, "fingerprint": form.fingerprint});
    Ok(
        match console.act(service, &session, &path, &body, services::in_words).await {
            Ok(()) => {
                let done = if decision == "approve" { "approved" } else { "rejected" };
                let target = format!(
                    "/?done={done}&approval={}&service={}",
                    url_encoded(&form.approval_id),
                    url_encoded(&service.name),
                );
                Redirect::to(&target).into_response()
            }
            Err(problem) => {
                console
                    .with_problem(&session, &PageQuery::of(&service.name), &problem)
                    .await
            }
        },
    )
}

/// How a person found an operation whose outcome is unknown ended at the external system.
#[derive(Debug, Deserialize)]
pub(super) struct ResolveForm {
    service: String,
    operation_id: String,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    evidence: String,
    #[serde(default)]
    external_ref: String,
    #[serde(default)]
    form_token: String,
}

/// Settles an operation whose outcome is unknown with the service's
/// resolution endpoint; the service decides who may, and what it needs.
pub(super) async fn resolve(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(form): Form<ResolveForm>,
) -> Result<Response, TurnedAway> {
    let (session, service) = console
        .operation_form(&headers, &form.form_token, &form.service, &form.operation_id)
        .await?;
    let Some(outcome) = ["completed", "failed"].into_iter().find(|o| *o == form.outcome) else {
        let problem = "Say how the operation ended: completed or failed.";
        return Ok(console
            .with_problem(&session, &PageQuery::of(&service.name), problem)
            .await);
    };
    // an empty reference is no reference, and then no member: `completed` without
    // one is what a person settles when the external system can no longer be asked
    let mut body = serde_json::json!({"outcome": outcome, "evidence": form.evidence});
    if let Some(external_ref) = Some(form.external_ref.trim()).filter(|r| !r.is_empty()) {
        body["external_ref"] = external_ref.into();
    }
    let path = format!("/v1/operations/{}/resolution", form.operation_id);
    Ok(console
        .settle(&session, service, &path, &body, outcome, &form.operation_id)
        .await)
}

#[derive(Debug, Deserialize)]
pub(super) struct RedeliverForm {
    service: String,
    operation_id: String,
    #[serde(default)]
    form_token: String,
}

/// Gives an operation's dead delivery back to its outbox with the service's redelivery endpoint.
pub(super) async fn redeliver(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(form): Form<RedeliverForm>,
) -> Result<Response, TurnedAway> {
    let (session, service) = console
        .operation_form(&headers, &form.form_token, &form.service, &form.operation_id)
        .await?;
    let path = format!("/v1/operations/{}/redelivery", form.operation_id);
    Ok(console
        .settle(
            &session,
            service,
            &path,
            &serde_json::json!({}),
            "resent",
            &form.operation_id,
        )
        .await)
}

impl Console {
    /// The service a form names, or the page saying there is none.
    async fn service_for(&self, session: &Session, name: &str) -> Result<&ServiceLink, TurnedAway> {
        match self.config.services.iter().find(|s| s.name == name) {
            Some(service) => Ok(service),
            None => {
                let problem = format!("There is no service called “{name}” in this sandbox.");
                Err(self.with_problem(session, &PageQuery::default(), &problem).await.into())
            }
        }
    }

    /// The session and service of a form about one operation; the operation
    /// id goes into the service's URL, so only what the services make is taken.
    async fn operation_form(
        &self,
        headers: &HeaderMap,
        form_token: &str,
        service: &str,
        operation_id: &str,
    ) -> Result<(Session, &ServiceLink), TurnedAway> {
        let session = self.form_session(headers, form_token)?;
        if !is_operation_id(operation_id) {
            let problem = "That is not an operation id (op_ and 32 hex digits); reload the page.";
            return Err(self
                .with_problem(&session, &PageQuery::of(service), problem)
                .await
                .into());
        }
        let service = self.service_for(&session, service).await?;
        Ok((session, service))
    }

    /// Sends a resolution or a redelivery, then back to the page with `done`'s
    /// notice, or the page with the service's refusal in words.
    async fn settle(
        &self,
        session: &Session,
        service: &ServiceLink,
        path: &str,
        body: &Value,
        done: &str,
        operation_id: &str,
    ) -> Response {
        match self
            .act(service, session, path, body, services::settling_in_words)
            .await
        {
            Ok(()) => {
                let target = format!(
                    "/?done={done}&operation={}&service={}",
                    url_encoded(operation_id),
                    url_encoded(&service.name),
                );
                Redirect::to(&target).into_response()
            }
            Err(problem) => {
                self.with_problem(session, &PageQuery::of(&service.name), &problem)
                    .await
            }
        }
    }
}

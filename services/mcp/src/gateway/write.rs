//! The write tools: an intent's key found or made, the request run by the
//! agent's retry rule, and what the run came to told in §13's words.

use std::sync::Arc;

use agent::{AgentError, Report};
use rmcp::model::JsonObject;
use serde_json::Value;

use super::{
    Gateway, Identity, Session,
    args::{fill_route, take_string},
};
use crate::{
    answer::{Answer, ApprovalWait, NextStep, Outcome, ToolError},
    calls::ToolCall,
    endpoints::Write,
};

/// What an agent run came to, as §13 words it.
fn answer_of(report: &Report) -> Result<Answer, ToolError> {
    use agent::Outcome as Run;
    let goes_on = report.status == Some(202);
    let after = |done: NextStep| if goes_on { NextStep::PollOperation } else { done };
    let (outcome, next_step) = match report.outcome {
        // sent now and done now; anything else done is the first answer again
        // (a replay at the service, or an answer the journal already had)
        Run::Created if report.sends > 0 => (Outcome::Created, after(NextStep::Done)),
        Run::Created | Run::Replayed => (Outcome::Replayed, after(NextStep::Done)),
        Run::MatchedExisting => (Outcome::MatchedExisting, NextStep::Done),
        Run::InProgress if !report.answered => {
            return Err(ToolError::new(
                "service_unreachable",
                "the service did not answer and nothing is known of the request: call again with the same intent later",
            ));
        }
        Run::InProgress => (Outcome::InProgress, NextStep::CallAgain),
        Run::AwaitingApproval => (Outcome::AwaitingApproval, NextStep::WaitForApproval),
        Run::Conflict => (Outcome::KeyReused, NextStep::Stop),
        Run::Unknown => (Outcome::OutcomeUnknown, NextStep::PollOperation),
        // an answer that belongs to no operation claimed nothing (docs/contract.md §3)
        Run::Failed if report.operation_id.is_none() => (Outcome::Refused, NextStep::Stop),
        Run::Failed => (Outcome::BusinessFailure, NextStep::Stop),
    };
    let approval = match outcome {
        Outcome::AwaitingApproval => report.body.as_ref().and_then(ApprovalWait::from_body),
        _ => None,
    };
    Ok(Answer {
        outcome,
        operation_id: report.operation_id.clone(),
        idempotency_key: Some(report.idempotency_key.clone()),
        http_status: report.status,
        resource: report.body.clone(),
        next_step,
        approval,
    })
}

/// An explicit key this server's journal holds for another request.
fn key_reused_here() -> ToolError {
    ToolError::new(
        "idempotency_key_reused",
        "this idempotency key was used here for another request before; nothing was sent",
    )
}

/// `intent` or `idempotency_key`: exactly one.
fn take_identity(args: &mut JsonObject) -> Result<Identity, ToolError> {
    let intent = take_string(args, "intent")?;
    let key = take_string(args, "idempotency_key")?;
    match (intent, key) {
        (Some(intent), None) => {
            let length = intent.chars().count();
            if !(1..=200).contains(&length) {
                return Err(ToolError::invalid_input("`intent` must be 1 to 200 characters"));
            }
            Ok(Identity::Intent(intent))
        }
        (None, Some(key)) => {
            let visible = !key.is_empty() && key.len() <= 255 && key.bytes().all(|b| (0x21..=0x7e).contains(&b));
            if !visible {
                return Err(ToolError::invalid_input(
                    "`idempotency_key` must be 1 to 255 visible ASCII characters",
                ));
            }
            Ok(Identity::Key(key))
        }
        (Some(_), Some(_)) => Err(ToolError::invalid_input("give `intent` or `idempotency_key`, not both")),
        (None, None) => Err(ToolError::invalid_input(
            "give `intent`: a stable name for this action, the same on every retry of it",
        )),
    }
}

impl Gateway {
    /// A write tool: its arguments checked as the service would, the
    /// intent's key found or made, the request run by the retry rule, the
    /// call journaled. The whole call is the server's, not the client's: a
    /// cancelled call or a client that went away never aborts a request the
    /// service may already have committed.
    pub async fn write(
        &self,
        session: &Session,
        tool: &'static str,
        endpoint: &Write,
        args: JsonObject,
    ) -> Result<Answer, ToolError> {
        let (gateway, session, endpoint) = (self.clone(), session.clone(), *endpoint);
        // past the bound a call waits here, before its key is made or anything
        // is sent: a client that leaves meanwhile leaves nothing behind
        let place = Arc::clone(&self.run_places)
            .acquire_owned()
            .await
            .map_err(|e| ToolError::internal(&e))?;
        self.runs
            .spawn(async move {
                let _place = place;
                let mut call = ToolCall::new(&session, tool);
                call.account = Some(gateway.agent(endpoint.service).journal().account().to_string());
                let result = gateway.run_write(&mut call, &endpoint, args).await;
                gateway.record(call, &result).await;
                result
            })
            .await
            .map_err(|e| ToolError::internal(&e))?
    }

    async fn run_write(
        &self,
        call: &mut ToolCall,
        endpoint: &Write,
        mut args: JsonObject,
    ) -> Result<Answer, ToolError> {
        let identity = take_identity(&mut args)?;
        match &identity {
            Identity::Intent(intent) => call.intent = Some(intent.clone()),
            Identity::Key(key) => call.idempotency_key = Some(key.clone()),
        }
        let path = fill_route(endpoint.route, &mut args)?;
        // what remains is the body
        let body = Value::Object(args);
        match endpoint.check {
            Some(check) => {
                let bytes = serde_json::to_vec(&body).map_err(|e| ToolError::invalid_input(e.to_string()))?;
                check(&bytes).map_err(|problem| {
                    ToolError::from_problem(&serde_json::from_slice(&problem.to_problem_json()).unwrap_or_default())
                })?;
            }
            None if body.as_object().is_some_and(|b| !b.is_empty()) => {
                return Err(ToolError::invalid_input(format!("{} takes no body", endpoint.route)));
            }
            None => {}
        }
        let target = self.config.target(endpoint.service);
        let request = agent::Request::new(endpoint.method, &target.url, path, body);
        let agent = self.agent(endpoint.service);
        let name = identity.journal_name();
        call.payload_digest = Some(agent::journal::payload_digest(&request));
        // the key, made once and stored before anything is sent; `execute`
        // finds it there (and only this way is an explicit key adopted)
        let bound = match &identity {
            Identity::Intent(_) => agent.journal().begin(&name, &request).await,
            Identity::Key(key) => agent.journal().adopt(&name, key, &request).await,
        };
        let entry = match bound {
            Ok(entry) => entry,
            Err(AgentError::ChangedPayload { .. }) => {
                // the journal names the key the intent holds
                let held = agent.journal().entry(&name).await.ok().flatten();
                call.idempotency_key = held.map(|e| e.idempotency_key);
                return Err(match identity {
                    Identity::Intent(intent) => ToolError::new(
                        "intent_reused_with_changed_payload",
                        format!(
                            "the intent `{intent}` was used for another request before; nothing was sent. \
                             A new action needs a new intent"
                        ),
                    ),
                    Identity::Key(_) => key_reused_here(),
                });
            }
            // the key is another intent's, or another key's, of this account
            Err(AgentError::KeyOfAnotherOperation { .. }) => return Err(key_reused_here()),
            // most likely this server's own intent, under a key it held before
            Err(AgentError::KnownUnderAnotherAccount { .. }) => {
                return Err(ToolError::new(
                    "intent_known_under_another_key",
                    "the journal has this intent under another key of this server's (a key rotated since?): name \
                     the account with MCP_ACCOUNT so its key is found, or use a new intent; nothing was sent",
                ));
            }
            Err(other) => return Err(ToolError::journal_unavailable(&other)),
        };
        call.idempotency_key = Some(entry.idempotency_key);
        let report = agent
            .execute(&name, &request)
            .await
            .map_err(|e| ToolError::journal_unavailable(&e))?;
        if matches!(report.status, Some(401 | 403)) && report.operation_id.is_none() {
            // the server's own key was refused: nothing was claimed, and once
            // the key is fixed the same intent must be sent again
            agent
                .journal()
                .reopen(&name)
                .await
                .map_err(|e| ToolError::journal_unavailable(&e))?;
            return Err(ToolError::new(
                "api_key_refused",
                format!(
                    "{} refused the MCP server's API key ({}): nothing was claimed; once its key is fixed, \
                     call again with the same intent",
                    endpoint.service.as_str(),
                    report.status.unwrap_or_default()
                ),
            ));
        }
        answer_of(&report)
    }
}

#[cfg(test)]
mod tests {
    use agent::Outcome as Run;
    use serde_json::json;

    use super::*;

    fn report(outcome: Run, status: Option<u16>, operation_id: Option<&str>, sends: u32, body: Value) -> Report {
        Report {
            name: "intent:x".into(),
            outcome,
            idempotency_key: "k".into(),
            operation_id: operation_id.map(str::to_owned),
            status,
            body: Some(body),
            sends,
            answered: status.is_some() || operation_id.is_some(),
            note: String::new(),
        }
    }

    fn outcome_and_step(report: &Report) -> (Outcome, NextStep) {
        let answer = answer_of(report).unwrap();
        (answer.outcome, answer.next_step)
    }

    #[test]
    fn every_run_outcome_maps_onto_the_contracts_outcome_and_next_step() {
        let op = Some("op_1");
        let cases = [
            (
                report(Run::Created, Some(201), op, 1, json!({})),
                (Outcome::Created, NextStep::Done),
            ),
            (
                report(Run::Created, Some(202), op, 1, json!({})),
                (Outcome::Created, NextStep::PollOperation),
            ),
            (
                report(Run::Replayed, Some(201), op, 2, json!({})),
                (Outcome::Replayed, NextStep::Done),
            ),
            // known from the journal: the first answer again
            (
                report(Run::Created, Some(201), op, 0, json!({})),
                (Outcome::Replayed, NextStep::Done),
            ),
            (
                report(Run::Replayed, Some(202), op, 0, json!({})),
                (Outcome::Replayed, NextStep::PollOperation),
            ),
            (
                report(Run::MatchedExisting, Some(200), op, 1, json!({})),
                (Outcome::MatchedExisting, NextStep::Done),
            ),
            (
                report(Run::InProgress, Some(409), op, 6, json!({})),
                (Outcome::InProgress, NextStep::CallAgain),
            ),
            (
                report(Run::InProgress, None, op, 6, Value::Null),
                (Outcome::InProgress, NextStep::CallAgain),
            ),
            (
                report(Run::AwaitingApproval, Some(202), op, 1, json!({})),
                (Outcome::AwaitingApproval, NextStep::WaitForApproval),
            ),
            (
                report(Run::Conflict, Some(422), op, 1, json!({})),
                (Outcome::KeyReused, NextStep::Stop),
            ),
            (
                report(Run::Unknown, None, op, 1, Value::Null),
                (Outcome::OutcomeUnknown, NextStep::PollOperation),
            ),
            (
                report(Run::Failed, Some(409), op, 1, json!({})),
                (Outcome::BusinessFailure, NextStep::Stop),
            ),
            (
                report(Run::Failed, Some(400), None, 1, json!({})),
                (Outcome::Refused, NextStep::Stop),
            ),
        ];
        for (report, expected) in cases {
            assert_eq!(
                outcome_and_step(&report),
                expected,
                "{:?} {:?}",
                report.outcome,
                report.status
            );
        }
    }

    #[test]
    fn a_run_that_never_reached_the_service_is_a_tool_error() {
        let lost = report(Run::InProgress, None, None, 6, Value::Null);
        assert_eq!(answer_of(&lost).unwrap_err().code, "service_unreachable");
    }

    #[test]
    fn an_approval_wait_carries_the_approval_request() {
        let body = json!({"approval_id": "apr_1", "summary": {"action": "deploy"}, "status_url": "/v1/operations/op_1",
                          "fingerprint": "f", "approval_url": "/v1/approvals/apr_1"});
        let answer = answer_of(&report(Run::AwaitingApproval, Some(202), Some("op_1"), 1, body)).unwrap();
        let approval = answer.approval.unwrap();
        assert_eq!(approval.approval_id, "apr_1");
        assert_eq!(approval.summary, json!({"action": "deploy"}));
        assert_eq!(approval.status_url, "/v1/operations/op_1");
    }
}

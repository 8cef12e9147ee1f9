//! `get_operation` and `get_approval`: an operation or an approval found by
//! its id, its key or its intent, at the service that knows it.

use agent::AgentError;
use rmcp::model::JsonObject;
use serde_json::Value;

use super::{
    Gateway, Identity, Session,
    args::{no_more, path_segment, take_id},
};
use crate::{
    answer::{Answer, NextStep, Outcome, ToolError},
    calls::ToolCall,
    endpoints::{self, Service},
};

/// An operation found: its id, key and next step, from its state.
fn read_operation(mut answer: Answer) -> Answer {
    if answer.outcome != Outcome::Found {
        return answer;
    }
    if let Some(operation) = &answer.resource {
        answer.operation_id = operation["operation_id"].as_str().map(str::to_owned);
        answer.idempotency_key = operation["idempotency_key"].as_str().map(str::to_owned);
        answer.next_step = next_step_of_operation(operation);
    }
    answer
}

/// What an operation's state lets the agent do (docs/contract.md §4, §6):
/// an approved operation runs when the same call is made again.
fn next_step_of_operation(operation: &Value) -> NextStep {
    match (operation["state"].as_str(), operation["approval"]["state"].as_str()) {
        (Some("in_progress" | "unknown"), _) => NextStep::PollOperation,
        (Some("awaiting_approval"), Some("approved")) => NextStep::CallAgain,
        (Some("awaiting_approval"), Some("pending") | None) => NextStep::WaitForApproval,
        (Some("completed"), _) => NextStep::Done,
        // failed, rejected, an approval that expired: sending it again cannot help
        _ => NextStep::Stop,
    }
}

impl Gateway {
    /// `get_operation`: by `operation_id`, `idempotency_key` or `intent`, at
    /// the service that knows it.
    pub async fn get_operation(&self, session: &Session, mut args: JsonObject) -> Result<Answer, ToolError> {
        let mut call = ToolCall::new(session, "get_operation");
        call.account = self.sole_account();
        let result = async {
            let operation_id = take_id(&mut args, "operation_id")?;
            let key = take_id(&mut args, "idempotency_key")?;
            let intent = take_id(&mut args, "intent")?;
            no_more(&args)?;
            let (known, key) = match (operation_id, key, intent) {
                (Some(id), None, None) => {
                    let path = endpoints::OPERATION_BY_ID.replace("{operation_id}", &path_segment(&id)?);
                    let mut answer = self.find(None, &path, &[]).await?;
                    if answer.outcome == Outcome::NotFound {
                        // no service has it: nothing to wait for
                        answer.next_step = NextStep::Stop;
                    }
                    return Ok(read_operation(answer));
                }
                (None, Some(key), None) => (self.key_entry(&key).await, Some(key)),
                (None, None, Some(intent)) => {
                    let entry = self.intent_entry(&intent).await;
                    let key = entry
                        .as_ref()
                        .ok()
                        .and_then(Option::as_ref)
                        .map(|e| e.idempotency_key.clone());
                    (entry, key)
                }
                _ => {
                    return Err(ToolError::invalid_input(
                        "give exactly one of operation_id, idempotency_key, intent",
                    ));
                }
            };
            let known = known.map_err(|e| ToolError::journal_unavailable(&e))?;
            let service = known.as_ref().and_then(|e| self.service_of_target(&e.target));
            let mut answer = match key {
                Some(key) => {
                    let query = [("idempotency_key".to_owned(), key)];
                    self.find(service, "/v1/operations", &query).await?
                }
                // an intent never used: no key, no operation
                None => Answer::not_found(),
            };
            // a lookup by key answers a list: the operation is its one item
            if answer.outcome == Outcome::Found {
                answer.resource = answer
                    .resource
                    .and_then(|r| r["data"].as_array().and_then(|d| d.first().cloned()));
                if answer.resource.is_none() {
                    answer.outcome = Outcome::NotFound;
                }
            }
            if answer.outcome == Outcome::NotFound {
                // never claimed: sending it is safe, unless the journal knows it is
                // done (a status declared by PUT has no operation)
                let finished = known.and_then(|e| e.state).is_some_and(agent::Outcome::is_final);
                answer.next_step = if finished { NextStep::Done } else { NextStep::CallAgain };
                return Ok(answer);
            }
            Ok(read_operation(answer))
        }
        .await;
        self.record(call, &result).await;
        result
    }

    /// `get_approval`: an approval a call waited for, as its operation shows
    /// it (an agent's key reads approvals only there); another, at the
    /// service that has it, if the server's key may read it.
    pub async fn get_approval(&self, session: &Session, mut args: JsonObject) -> Result<Answer, ToolError> {
        let mut call = ToolCall::new(session, "get_approval");
        call.account = self.sole_account();
        let result = async {
            let approval_id = take_id(&mut args, "approval_id")?
                .ok_or_else(|| ToolError::invalid_input("`approval_id` is required"))?;
            no_more(&args)?;
            let waited_for = self
                .waited_for(&approval_id)
                .await
                .map_err(|e| ToolError::journal_unavailable(&e))?;
            let Some((tool, operation_id)) = waited_for else {
                let path = endpoints::APPROVAL_BY_ID.replace("{approval_id}", &path_segment(&approval_id)?);
                let answer = self.find(None, &path, &[]).await?;
                // a key that may not read approvals (an agent's) sees none but
                // those its calls waited for: any other is not there to it,
                // whichever account's it is
                return Ok(match answer.outcome {
                    Outcome::Refused => Answer::not_found(),
                    _ => answer,
                });
            };
            let service = endpoints::WRITES
                .iter()
                .find(|(name, _)| *name == tool)
                .map(|(_, endpoint)| endpoint.service);
            let path = endpoints::OPERATION_BY_ID.replace("{operation_id}", &path_segment(&operation_id)?);
            let mut answer = self.find(service, &path, &[]).await?;
            let operation = match (answer.outcome, answer.resource.take()) {
                (Outcome::Found, Some(operation)) => operation,
                // not this key's to read (another server's call, on a journal
                // they share) or gone: nothing of it is shown, its id included
                (Outcome::NotFound, _) => return Ok(Answer::not_found()),
                (_, resource) => {
                    answer.resource = resource;
                    return Ok(answer);
                }
            };
            let mut approval = match &operation["approval"] {
                Value::Object(approval) => approval.clone(),
                _ => return Ok(Answer::not_found()),
            };
            approval.insert("operation_id".into(), operation["operation_id"].clone());
            answer.next_step = match approval.get("state").and_then(Value::as_str) {
                Some("pending") => NextStep::WaitForApproval,
                // approved: the same call with the same intent runs it now
                Some("approved") => NextStep::CallAgain,
                _ => NextStep::Stop,
            };
            answer.operation_id = Some(operation_id);
            answer.idempotency_key = operation["idempotency_key"].as_str().map(str::to_owned);
            answer.resource = Some(Value::Object(approval));
            Ok(answer)
        }
        .await;
        self.record(call, &result).await;
        result
    }

    /// The journal's entry of `intent`, under whichever service's account it was sent.
    async fn intent_entry(&self, intent: &str) -> Result<Option<agent::Entry>, AgentError> {
        let name = Identity::Intent(intent.to_owned()).journal_name();
        for service in Service::ALL {
            if let Some(entry) = self.agent(service).journal().entry(&name).await? {
                return Ok(Some(entry));
            }
        }
        Ok(None)
    }

    /// The journal's entry sent with `key` by one of the server's accounts:
    /// a key another account sent through the same journal is not there.
    async fn key_entry(&self, key: &str) -> Result<Option<agent::Entry>, AgentError> {
        for service in Service::ALL {
            if let Some(entry) = self.agent(service).journal().entry_by_key(key).await? {
                return Ok(Some(entry));
            }
        }
        Ok(None)
    }

    /// The tool and operation of the call of one of the server's accounts
    /// that was told to wait for `approval_id`.
    async fn waited_for(&self, approval_id: &str) -> Result<Option<(String, String)>, sqlx::Error> {
        for account in self.accounts() {
            if let Some(waited) = self.calls.waiting_for(account, approval_id).await? {
                return Ok(Some(waited));
            }
        }
        Ok(None)
    }

    /// The service whose base URL `target` starts with.
    fn service_of_target(&self, target: &str) -> Option<Service> {
        Service::ALL
            .into_iter()
            .find(|s| target.starts_with(&format!("{}/", self.config.target(*s).url)))
    }
}

//! The calls themselves: a tool's arguments in, the service asked, an
//! [`Answer`] out — and every call journaled.
//!
//! A write goes through the agent client (docs/contract.md §9): the intent's
//! key is made once and stored before the first send, a lost answer is asked
//! about by key before anything is sent again, and the call runs to its end
//! even if the MCP client cancels it or goes away, so the next call with the
//! same intent finds its answer rather than a half-done request.

use std::sync::Arc;

use agent::{Account, Agent, AgentError, Journal, Report};
use rmcp::model::JsonObject;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::{
    answer::{Answer, ApprovalWait, NextStep, Outcome, ToolError},
    calls::{Calls, ToolCall},
    config::McpConfig,
    endpoints::{self, Read, Service, Write, argument_for, path_parameters},
};

/// How a write names its operation: an intent the server keeps a key for,
/// or a key the agent keeps itself.
#[derive(Debug, Clone)]
enum Identity {
    Intent(String),
    Key(String),
}

impl Identity {
    /// The operation's name in the agent journal: intents and keys apart.
    /// The journal keeps it under the account the service's key acts for,
    /// so servers that share a journal but not an account never share one.
    fn journal_name(&self) -> String {
        match self {
            Identity::Intent(intent) => format!("intent:{intent}"),
            Identity::Key(key) => format!("key:{key}"),
        }
    }
}

/// One agent per service: each calls with that service's key, on the
/// journal of the account the key acts for (the account the configuration
/// names, else the key's own: see [`Account`]).
#[derive(Debug, Clone)]
struct Agents {
    tickets: Agent,
    payments: Agent,
    deployments: Agent,
}

/// The calls of one MCP server, whatever transport they come by.
#[derive(Debug, Clone)]
pub struct Gateway {
    agents: Agents,
    config: McpConfig,
    calls: Calls,
    http: reqwest::Client,
    /// Calls under way: they outlive a cancelled call and a client that left.
    runs: TaskTracker,
    /// A place for each call under way, `max_runs` in all: a client that
    /// sends calls and leaves at once cannot pile up runs without end.
    run_places: Arc<Semaphore>,
}

/// Who made a call: `stdio <id>`, one per server process, or `http <id>`,
/// one per request (streamable HTTP is served statelessly).
pub type Session = String;

impl Gateway {
    pub async fn open(config: McpConfig) -> Result<Gateway, AgentError> {
        let account = |service: Service| Account::of(config.account.as_deref(), &config.target(service).api_key);
        let journal = Journal::open(&config.journal, account(Service::Tickets)).await?;
        let calls = Calls::open(journal.pool().clone())
            .await
            .map_err(|e| AgentError::Journal(e.to_string()))?;
        let agent = |service: Service| {
            let journal = journal.for_account(account(service));
            Agent::new(journal, &config.target(service).api_key, config.agent.clone())
        };
        let agents = Agents {
            tickets: agent(Service::Tickets)?,
            payments: agent(Service::Payments)?,
            deployments: agent(Service::Deployments)?,
        };
        let http = reqwest::Client::builder()
            .timeout(config.agent.request_timeout)
            .build()
            .map_err(|e| AgentError::Usage(format!("an HTTP client: {e}")))?;
        let gateway = Gateway {
            agents,
            calls,
            http,
            runs: TaskTracker::new(),
            run_places: Arc::new(Semaphore::new(config.max_runs.clamp(1, Semaphore::MAX_PERMITS))),
            config,
        };
        // where every intent's key is: a server started elsewhere must find the same file
        let accounts: Vec<&str> = gateway.accounts().into_iter().map(Account::as_str).collect();
        tracing::info!(journal = %gateway.config.journal.display(), accounts = %accounts.join(", "),
            "the MCP server's journal of intents and tool calls");
        Ok(gateway)
    }

    pub fn calls(&self) -> &Calls {
        &self.calls
    }

    fn agent(&self, service: Service) -> &Agent {
        match service {
            Service::Tickets => &self.agents.tickets,
            Service::Payments => &self.agents.payments,
            Service::Deployments => &self.agents.deployments,
        }
    }

    /// The accounts the server acts for, each once: one, unless each
    /// service has a key of its own and no account is named.
    fn accounts(&self) -> Vec<&Account> {
        let mut accounts: Vec<&Account> = Vec::new();
        for service in Service::ALL {
            let account = self.agent(service).journal().account();
            if !accounts.contains(&account) {
                accounts.push(account);
            }
        }
        accounts
    }

    /// The account a call that asks no one service is journaled under: the
    /// server's, when it acts for one.
    fn sole_account(&self) -> Option<String> {
        match self.accounts().as_slice() {
            [account] => Some(account.to_string()),
            _ => None,
        }
    }

    /// Waits for the calls under way (a stopping server lets them finish).
    pub async fn finish_runs(&self) {
        self.runs.close();
        self.runs.wait().await;
    }

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

    /// A read tool: a GET of the endpoint with the arguments as its path and query.
    pub async fn read(
        &self,
        session: &Session,
        tool: &'static str,
        endpoint: &Read,
        mut args: JsonObject,
    ) -> Result<Answer, ToolError> {
        let mut call = ToolCall::new(session, tool);
        call.account = Some(self.agent(endpoint.service).journal().account().to_string());
        let result = async {
            let path = fill_route(endpoint.route, &mut args)?;
            let query = query_of(args, endpoint.query)?;
            self.get(endpoint.service, &path, &query).await
        }
        .await;
        self.record(call, &result).await;
        result
    }

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

    /// Asks `known` (or each service in turn) until one has it; a service
    /// that cannot be reached is passed over while another may answer.
    async fn find(&self, known: Option<Service>, path: &str, query: &[(String, String)]) -> Result<Answer, ToolError> {
        let services = match known {
            Some(service) => vec![service],
            None => Service::ALL.to_vec(),
        };
        let mut last = None;
        for service in services {
            let answer = self.get(service, path, query).await;
            let empty_list = answer
                .as_ref()
                .ok()
                .and_then(|a| a.resource.as_ref())
                .and_then(|r| r["data"].as_array())
                .is_some_and(Vec::is_empty);
            match answer {
                Ok(found) if found.outcome == Outcome::Found && !empty_list => return Ok(found),
                // an answer that found nothing beats a service that could not be asked
                Ok(answer) => last = Some(Ok(answer)),
                Err(error) if last.is_none() => last = Some(Err(error)),
                Err(_) => {}
            }
        }
        last.unwrap_or_else(|| Ok(Answer::not_found()))
    }

    async fn get(&self, service: Service, path: &str, query: &[(String, String)]) -> Result<Answer, ToolError> {
        let target = self.config.target(service);
        let response = self
            .http
            .get(format!("{}{path}", target.url))
            .bearer_auth(&target.api_key)
            .query(query)
            .send()
            .await
            .map_err(|e| unreachable_service(service, &e))?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let outcome = match status {
            200..=299 => Outcome::Found,
            404 => Outcome::NotFound,
            400..=499 => Outcome::Refused,
            _ => {
                return Err(ToolError::new(
                    "service_unreachable",
                    format!("{} answered {status}: try again later", service.as_str()),
                ));
            }
        };
        Ok(Answer {
            outcome,
            operation_id: None,
            idempotency_key: None,
            http_status: Some(status),
            resource: Some(body),
            next_step: if outcome == Outcome::Refused {
                NextStep::Stop
            } else {
                NextStep::Done
            },
            approval: None,
        })
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

    /// Journals a call with what it was answered.
    async fn record(&self, mut call: ToolCall, result: &Result<Answer, ToolError>) {
        match result {
            Ok(answer) => {
                call.idempotency_key = call.idempotency_key.or_else(|| answer.idempotency_key.clone());
                call.outcome = answer.outcome.as_str().to_owned();
                call.operation_id = answer.operation_id.clone();
                call.http_status = answer.http_status.map(i64::from);
                call.approval_id = answer.approval.as_ref().map(|a| a.approval_id.clone());
            }
            Err(error) => call.outcome = error.code.to_owned(),
        }
        if let Err(e) = self.calls.record(&call).await {
            tracing::error!(error = %e, tool = call.tool, "a tool call could not be journaled");
        }
    }
}

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

fn unreachable_service(service: Service, error: &reqwest::Error) -> ToolError {
    let why = if error.is_timeout() {
        "did not answer in time"
    } else {
        "could not be reached"
    };
    ToolError::new(
        "service_unreachable",
        format!("{} {why}: try again later", service.as_str()),
    )
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

fn take_string(args: &mut JsonObject, name: &str) -> Result<Option<String>, ToolError> {
    match args.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ToolError::invalid_input(format!("`{name}` must be a string"))),
    }
}

/// An id, key or intent to look something up by: a string, not empty.
fn take_id(args: &mut JsonObject, name: &str) -> Result<Option<String>, ToolError> {
    match take_string(args, name)? {
        Some(value) if value.is_empty() => Err(ToolError::invalid_input(format!("`{name}` must not be empty"))),
        value => Ok(value),
    }
}

/// The route with its `{…}` filled from the arguments (taken out of them).
fn fill_route(route: &str, args: &mut JsonObject) -> Result<String, ToolError> {
    let mut path = route.to_owned();
    for parameter in path_parameters(route) {
        let name = argument_for(parameter);
        let value = take_id(args, name)?.ok_or_else(|| ToolError::invalid_input(format!("`{name}` is required")))?;
        path = path.replace(&format!("{{{parameter}}}"), &path_segment(&value)?);
    }
    Ok(path)
}

/// An id as one path segment, percent-encoded: an id can never change the
/// route. `.` and `..`, which no encoding keeps from climbing, are refused.
fn path_segment(value: &str) -> Result<String, ToolError> {
    platform::path::segment(value).map_err(|e| ToolError::invalid_input(e.to_string()))
}

/// The remaining arguments as the query's pairs: only the endpoint's own
/// parameters, and only scalars.
fn query_of(args: JsonObject, allowed: &[&str]) -> Result<Vec<(String, String)>, ToolError> {
    args.into_iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(name, value)| {
            if !allowed.contains(&name.as_str()) {
                return Err(ToolError::invalid_input(format!("unknown argument `{name}`")));
            }
            match value {
                Value::String(s) => Ok((name, s)),
                Value::Number(n) => Ok((name, n.to_string())),
                _ => Err(ToolError::invalid_input(format!(
                    "`{name}` must be a string or a number"
                ))),
            }
        })
        .collect()
}

fn no_more(args: &JsonObject) -> Result<(), ToolError> {
    match args.keys().next() {
        Some(extra) => Err(ToolError::invalid_input(format!("unknown argument `{extra}`"))),
        None => Ok(()),
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

    #[test]
    fn a_path_parameter_is_one_segment_whatever_it_holds() {
        let mut args = JsonObject::new();
        args.insert("ticket_id".into(), json!("../operations?x=1"));
        let path = fill_route("/v1/tickets/{ticket_id}/comments", &mut args).unwrap();
        let parsed = reqwest::Url::parse(&format!("http://tickets.test{path}")).unwrap();
        assert_eq!(parsed.path(), "/v1/tickets/..%2Foperations%3Fx%3D1/comments");
        assert_eq!(parsed.query(), None);
        assert!(args.is_empty(), "the parameter is taken out of the body");
    }

    #[test]
    fn a_path_parameter_a_url_parser_reads_as_here_or_one_up_is_refused() {
        for id in [".", ".."] {
            let mut args = JsonObject::new();
            args.insert("ticket_id".into(), json!(id));
            let filled = fill_route("/v1/tickets/{ticket_id}/comments", &mut args);
            assert!(filled.is_err(), "{id:?} became {filled:?}");
        }
    }
}

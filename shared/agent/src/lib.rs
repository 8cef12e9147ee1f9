//! The agent side of the contract (docs/contract.md §9): a client that keeps
//! one intended action one operation across retries, timeouts and restarts.
//!
//! The caller names each operation (the task's own id for it) and gives what
//! it intends. [`Agent::execute`] then follows the article's rule:
//!
//! - the key is made once and stored in the [`journal`] **before the first
//!   send**; a restart of the agent finds it there and sends it again; the
//!   same name with another payload is refused before anything is sent;
//! - a known success is recorded as done and never sent again;
//! - a timeout or a connection failure is not a failure: the agent asks
//!   `GET /v1/operations?idempotency_key=` and retries **with the same key**
//!   only when that is safe (nothing was claimed, or the answer is stored);
//! - `request_in_progress`: it waits (`Retry-After`, and `Prefer: wait` on
//!   every send) and asks again;
//! - `idempotency_key_reused`: it stops and reports a conflict — a new
//!   intention needs a new name;
//! - a known business failure (any other 4xx): no retry;
//! - `awaiting_approval`: it reports the approval request and stops;
//! - `unknown`: it polls the operation's status, never sends again.
//!
//! Backoff (with jitter) spaces the attempts; it never replaces knowing the
//! state. Each run reports one [`Outcome`] with the operation id.

pub mod journal;

use std::{path::Path, time::Duration};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use journal::{Account, AttemptRecord, Entry, Journal};

/// What a run of an operation came to (docs/contract.md §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The service did it, now.
    Created,
    /// The service had done it: this is its first answer again.
    Replayed,
    /// The service found it done under another key (a ticket for the same alert event).
    MatchedExisting,
    /// Still running after every wait the agent was allowed.
    InProgress,
    /// The key names another request: stop; a new intention needs a new name.
    Conflict,
    /// A human must decide first; the report carries the approval request.
    AwaitingApproval,
    /// An external effect may or may not have happened; the service's
    /// reconciler finds out. Poll, never send again.
    Unknown,
    /// A known, final failure (a business refusal): no retry until the task changes.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Replayed => "replayed",
            Outcome::MatchedExisting => "matched_existing",
            Outcome::InProgress => "in_progress",
            Outcome::Conflict => "conflict",
            Outcome::AwaitingApproval => "awaiting_approval",
            Outcome::Unknown => "unknown",
            Outcome::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        serde_json::from_value(Value::String(s.to_owned())).ok()
    }

    /// Known for good: the agent never sends the operation again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Outcome::Created | Outcome::Replayed | Outcome::MatchedExisting | Outcome::Conflict | Outcome::Failed
        )
    }
}

/// How an intended request is sent: a POST with its key, or a PUT that
/// declares an end state (idempotent by its nature; the key still names it
/// in the journal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    Post,
    Put,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Post => "POST",
            Method::Put => "PUT",
        }
    }
}

/// One intended request: to which service, which path, with what body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub method: Method,
    /// `http://127.0.0.1:7001`
    pub base_url: String,
    /// `/v1/tickets`
    pub path: String,
    pub body: Value,
}

impl Request {
    pub fn post(base_url: impl Into<String>, path: impl Into<String>, body: Value) -> Request {
        Request::new(Method::Post, base_url, path, body)
    }

    pub fn put(base_url: impl Into<String>, path: impl Into<String>, body: Value) -> Request {
        Request::new(Method::Put, base_url, path, body)
    }

    pub fn new(method: Method, base_url: impl Into<String>, path: impl Into<String>, body: Value) -> Request {
        Request {
            method,
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            path: path.into(),
            body,
        }
    }

    /// The URL it goes to.
    pub fn target(&self) -> String {
        format!("{}{}", self.base_url, self.path)
    }
}

/// What a run reports.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub name: String,
    pub outcome: Outcome,
    pub idempotency_key: String,
    pub operation_id: Option<String>,
    /// The last answer's status and body, when there was one.
    pub status: Option<u16>,
    pub body: Option<Value>,
    /// Requests this run sent (the operation's own, not status questions).
    pub sends: u32,
    /// Whether the service answered anything this run (a send or a status
    /// question), or the journal knew the outcome: `false` means nothing is
    /// known of the operation beyond its key.
    pub answered: bool,
    /// In words, for a person.
    pub note: String,
}

/// How patient the agent is.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// How long one request may take before its answer counts as lost.
    pub request_timeout: Duration,
    /// Sends of the operation's request in one run, at most.
    pub max_sends: u32,
    /// The first pause between attempts; it doubles, with jitter, up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// `Prefer: wait=N` on every send: a duplicate that finds the operation
    /// running waits up to N seconds for its answer (0: none).
    pub prefer_wait_seconds: u8,
    /// How long to follow an operation whose work goes on after its answer
    /// (a 202) or whose outcome is unknown, polling its status, before
    /// reporting where it stands.
    pub follow_for: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            request_timeout: Duration::from_secs(10),
            max_sends: 6,
            backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            prefer_wait_seconds: 2,
            follow_for: Duration::ZERO,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The same name with another payload: refused locally, nothing sent.
    #[error("operation `{name}` was asked for with another payload before: a new intention needs a new operation name")]
    ChangedPayload { name: String },
    /// A key handed over for `name` is another operation's of the same
    /// account: refused locally, nothing sent.
    #[error(
        "the key handed over for operation `{name}` is another operation's in this journal: a new intention needs a new key"
    )]
    KeyOfAnotherOperation { name: String },
    /// `name` is in the journal under another account, and one of the two
    /// is only a mark of a key: most likely this agent's own operation,
    /// before its key was rotated or its account named. A new key for it
    /// could do the action twice, so nothing is sent.
    #[error(
        "operation `{name}` is in the journal under another key or account: if it is this agent's, name its account \
         (--account, AGENT_ACCOUNT) so its key is found; if not, give this operation another name"
    )]
    KnownUnderAnotherAccount { name: String },
    #[error("the agent's journal: {0}")]
    Journal(String),
    #[error("the operation status could not be read: {0}")]
    Status(String),
    /// What the command line was given cannot be used.
    #[error("{0}")]
    Usage(String),
}

impl From<sqlx::Error> for AgentError {
    fn from(error: sqlx::Error) -> Self {
        AgentError::Journal(error.to_string())
    }
}

/// An agent: its journal, its credential, its patience.
#[derive(Clone)]
pub struct Agent {
    journal: Journal,
    http: reqwest::Client,
    token: String,
    config: AgentConfig,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // the credential never reaches a log
        f.debug_struct("Agent")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What one answer means for the run.
enum Next {
    /// Known: record it and report it.
    Done(Outcome, String),
    /// Not done yet, and a later send with the same key is safe: wait this long.
    SendAgain(Duration, String),
    /// Its work goes on after the answer (or its outcome is unknown): follow its status.
    Follow(Outcome, String),
}

/// An operation as `GET /v1/operations` shows it.
#[derive(Debug, Clone, Deserialize)]
pub struct OperationStatus {
    pub operation_id: String,
    pub state: String,
    pub response_status: Option<u16>,
    pub external_ref: Option<String>,
}

#[derive(Deserialize)]
struct OperationList {
    data: Vec<OperationStatus>,
}

impl Agent {
    /// An agent with its journal at `journal` (made the first time), calling
    /// services with `token` as its bearer key; its operations are the key's
    /// ([`Account::of_key`]).
    pub async fn open(journal: &Path, token: impl Into<String>, config: AgentConfig) -> Result<Agent, AgentError> {
        let token = token.into();
        let journal = Journal::open(journal, Account::of_key(&token)).await?;
        Agent::new(journal, token, config)
    }

    /// An agent on a journal already open, for the journal's account: agents
    /// of one account share its names and keys, whatever key each calls
    /// with; another account's are never theirs.
    pub fn new(journal: Journal, token: impl Into<String>, config: AgentConfig) -> Result<Agent, AgentError> {
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .build()
            .map_err(|e| AgentError::Journal(e.to_string()))?;
        Ok(Agent {
            journal,
            http,
            token: token.into(),
            config,
        })
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Runs the operation `name` by the retry rule: see the module docs.
    pub async fn execute(&self, name: &str, request: &Request) -> Result<Report, AgentError> {
        let entry = self.journal.begin(name, request).await?;
        let key = entry.idempotency_key.clone();
        if let Some(known) = entry.state.filter(|s| s.is_final()) {
            return Ok(Report {
                name: name.to_owned(),
                outcome: known,
                idempotency_key: key,
                operation_id: entry.operation_id,
                status: entry.result_status,
                body: entry.result_body.as_deref().and_then(|b| serde_json::from_str(b).ok()),
                sends: 0,
                answered: true,
                note: "known from the journal: not sent again".into(),
            });
        }
        let mut run = Run {
            agent: self,
            name,
            key: &key,
            request,
            sends: 0,
            answered: false,
            pause: self.config.backoff,
            last: None,
        };
        run.go().await
    }

    /// The operation a key names at a service, if it claimed it.
    pub async fn status_by_key(&self, base_url: &str, key: &str) -> Result<Option<OperationStatus>, AgentError> {
        let response = self
            .http
            .get(format!("{base_url}/v1/operations"))
            .bearer_auth(&self.token)
            .query(&[("idempotency_key", key)])
            .send()
            .await
            .map_err(|e| AgentError::Status(e.to_string()))?;
        if !response.status().is_success() {
            return Err(AgentError::Status(format!("answered {}", response.status())));
        }
        let list: OperationList = response.json().await.map_err(|e| AgentError::Status(e.to_string()))?;
        Ok(list.data.into_iter().next())
    }

    /// An operation's status by its id: one path segment, whatever it holds.
    pub async fn status(&self, base_url: &str, operation_id: &str) -> Result<Value, AgentError> {
        let url = operation_url(base_url, operation_id)?;
        let response = self
            .http
            .get(url)
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| AgentError::Status(e.to_string()))?;
        response.json().await.map_err(|e| AgentError::Status(e.to_string()))
    }
}

/// `{base_url}/v1/operations/{operation_id}`, the id one percent-encoded
/// path segment (`/`, `?`, `#` and `%` too): never another route read with
/// the agent's key. `.` and `..` are refused, as a URL parser climbs with
/// them however they are encoded.
fn operation_url(base_url: &str, operation_id: &str) -> Result<reqwest::Url, AgentError> {
    if matches!(operation_id, "" | "." | "..") {
        return Err(AgentError::Status(format!("`{operation_id}` is not an operation id")));
    }
    let mut url = reqwest::Url::parse(base_url).map_err(|e| AgentError::Usage(format!("{base_url}: {e}")))?;
    url.path_segments_mut()
        .map_err(|()| AgentError::Usage(format!("{base_url} cannot take a path")))?
        .pop_if_empty()
        .extend(["v1", "operations", operation_id]);
    Ok(url)
}

/// One run of one operation.
struct Run<'a> {
    agent: &'a Agent,
    name: &'a str,
    key: &'a str,
    request: &'a Request,
    sends: u32,
    /// Whether the service answered anything: a send or a status question.
    answered: bool,
    pause: Duration,
    /// The last answer: status, body, operation id.
    last: Option<(u16, Value, Option<String>)>,
}

impl Run<'_> {
    async fn go(&mut self) -> Result<Report, AgentError> {
        let journal = &self.agent.journal;
        loop {
            if self.sends == self.agent.config.max_sends {
                let outcome = self.where_it_stands().await;
                return self
                    .report(outcome, "gave up sending: every send this run allowed was made")
                    .await;
            }
            self.sends += 1;
            let next = match self.send().await {
                Ok((status, replayed, retry_after, body, operation_id)) => {
                    self.answered = true;
                    journal
                        .record_attempt(self.name, "send", Some(status), &describe(status, replayed, &body))
                        .await?;
                    self.last = Some((status, body.clone(), operation_id));
                    read_answer(status, replayed, retry_after, &body)
                }
                Err(lost) => {
                    journal.record_attempt(self.name, "send", None, &lost).await?;
                    self.after_a_lost_answer(&lost).await?
                }
            };
            match next {
                Next::Done(outcome, note) => return self.report(outcome, &note).await,
                Next::Follow(outcome, note) => return self.follow(outcome, &note).await,
                Next::SendAgain(wait, why) => {
                    let wait = wait.max(self.backoff());
                    journal
                        .record_attempt(
                            self.name,
                            "wait",
                            None,
                            &format!("{why}; waiting {} ms", wait.as_millis()),
                        )
                        .await?;
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// One send of the operation's request, with its key.
    async fn send(&self) -> Result<(u16, bool, Option<u64>, Value, Option<String>), String> {
        let method = match self.request.method {
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
        };
        let mut request = self
            .agent
            .http
            .request(method, self.request.target())
            .bearer_auth(&self.agent.token)
            .header("idempotency-key", self.key)
            .json(&self.request.body);
        if self.agent.config.prefer_wait_seconds > 0 {
            request = request.header("prefer", format!("wait={}", self.agent.config.prefer_wait_seconds));
        }
        let response = request.send().await.map_err(|e| describe_lost(&e))?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let replayed = header("idempotent-replayed").as_deref() == Some("true");
        let retry_after = header("retry-after").and_then(|v| v.parse().ok());
        let operation_id = header("operation-id");
        // an answer whose body never arrives is as lost as one that never came
        let body = response.bytes().await.map_err(|e| describe_lost(&e))?;
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Ok((status, replayed, retry_after, body, operation_id))
    }

    /// The answer was lost: ask the service what became of the key before
    /// anything else.
    async fn after_a_lost_answer(&mut self, lost: &str) -> Result<Next, AgentError> {
        let status = self.agent.status_by_key(&self.request.base_url, self.key).await;
        self.answered |= status.is_ok();
        let (note, next) = match status {
            Err(e) => (
                format!("could not ask: {e}"),
                Next::SendAgain(Duration::ZERO, format!("{lost}; the service could not be asked either")),
            ),
            Ok(None) => (
                "the key was never claimed: sending it again is safe".to_owned(),
                Next::SendAgain(Duration::ZERO, format!("{lost}; nothing was claimed")),
            ),
            Ok(Some(operation)) => {
                let note = format!("{} is {}", operation.operation_id, operation.state);
                let next = match operation.state.as_str() {
                    // its work goes on, or nobody knows: follow it, never send again
                    "unknown" => Next::Follow(Outcome::Unknown, format!("{lost}; the operation's outcome is unknown")),
                    // the stored answer is there to be replayed by the same key
                    "completed" | "failed" | "rejected" | "awaiting_approval" => {
                        Next::SendAgain(Duration::ZERO, format!("{lost}; the answer is stored"))
                    }
                    _ => Next::SendAgain(Duration::ZERO, format!("{lost}; it is still running")),
                };
                self.last = self
                    .last
                    .take()
                    .or(Some((0, Value::Null, Some(operation.operation_id))));
                (note, next)
            }
        };
        self.agent.journal.record_attempt(self.name, "ask", None, &note).await?;
        Ok(next)
    }

    /// Polls the operation's status until it is known (or `follow_for` runs
    /// out), and reports it: accepted work that completes is `created`.
    async fn follow(&mut self, outcome: Outcome, note: &str) -> Result<Report, AgentError> {
        let deadline = tokio::time::Instant::now() + self.agent.config.follow_for;
        let mut outcome = outcome;
        let mut note = note.to_owned();
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(self.backoff()).await;
            let Ok(Some(operation)) = self.agent.status_by_key(&self.request.base_url, self.key).await else {
                continue;
            };
            self.answered = true;
            self.agent
                .journal
                .record_attempt(
                    self.name,
                    "ask",
                    None,
                    &format!("{} is {}", operation.operation_id, operation.state),
                )
                .await?;
            match operation.state.as_str() {
                "completed" => {
                    outcome = if outcome == Outcome::Unknown {
                        Outcome::Created
                    } else {
                        outcome
                    };
                    note = format!(
                        "its work ended: completed ({})",
                        operation.external_ref.as_deref().unwrap_or("-")
                    );
                    break;
                }
                "failed" | "rejected" => {
                    outcome = Outcome::Failed;
                    note = format!("its work ended: {}", operation.state);
                    break;
                }
                "unknown" => outcome = Outcome::Unknown,
                _ => {}
            }
        }
        self.report(outcome, &note).await
    }

    /// Where the operation stands when the agent stops sending.
    async fn where_it_stands(&mut self) -> Outcome {
        let status = self.agent.status_by_key(&self.request.base_url, self.key).await;
        self.answered |= status.is_ok();
        match status {
            Ok(Some(operation)) if operation.state == "unknown" => Outcome::Unknown,
            Ok(Some(operation)) if operation.state == "awaiting_approval" => Outcome::AwaitingApproval,
            _ => Outcome::InProgress,
        }
    }

    /// Doubles the pause each time, with jitter: between attempts, never instead of state.
    fn backoff(&mut self) -> Duration {
        let pause = self.pause.mul_f64(0.5 + fastrand::f64() / 2.0);
        self.pause = (self.pause * 2).min(self.agent.config.max_backoff);
        pause
    }

    async fn report(&mut self, outcome: Outcome, note: &str) -> Result<Report, AgentError> {
        let (status, body, operation_id) = match self.last.take() {
            Some((status, body, operation_id)) => (Some(status).filter(|s| *s > 0), Some(body), operation_id),
            None => (None, None, None),
        };
        let operation_id = operation_id.or_else(|| {
            body.as_ref()
                .and_then(|b| b["operation_id"].as_str().map(str::to_owned))
        });
        let stored_body = body.as_ref().map(Value::to_string);
        self.agent
            .journal
            .record_state(
                self.name,
                outcome,
                operation_id.as_deref(),
                status.zip(stored_body.as_deref()),
            )
            .await?;
        Ok(Report {
            name: self.name.to_owned(),
            outcome,
            idempotency_key: self.key.to_owned(),
            operation_id,
            status,
            body,
            sends: self.sends,
            answered: self.answered,
            note: note.to_owned(),
        })
    }
}

/// What an answer means (docs/contract.md §3, §9).
fn read_answer(status: u16, replayed: bool, retry_after: Option<u64>, body: &Value) -> Next {
    let code = body["code"].as_str().unwrap_or("");
    match status {
        202 if body["state"] == "awaiting_approval" => Next::Done(
            Outcome::AwaitingApproval,
            format!(
                "a human must approve {} first",
                body["approval_id"].as_str().unwrap_or("the request")
            ),
        ),
        // work that goes on after the answer: its status shows how it ends
        202 => Next::Follow(
            if replayed { Outcome::Replayed } else { Outcome::Created },
            "accepted: its work goes on".into(),
        ),
        200..=299 if body["outcome"] == "matched_existing" => {
            Next::Done(Outcome::MatchedExisting, "the service found it done already".into())
        }
        200..=299 if replayed => Next::Done(Outcome::Replayed, "the first answer, replayed".into()),
        // a PUT that declared the state it was already in
        200..=299 if body["changed"] == false => Next::Done(Outcome::MatchedExisting, "it was so already".into()),
        200..=299 => Next::Done(Outcome::Created, "done".into()),
        409 if code == "request_in_progress" => Next::SendAgain(
            Duration::from_secs(retry_after.unwrap_or(1)),
            "an earlier attempt is still running".into(),
        ),
        409 if code == "operation_outcome_unknown" => {
            Next::Follow(Outcome::Unknown, "its outcome is unknown: never sent again".into())
        }
        422 if code == "idempotency_key_reused" => Next::Done(
            Outcome::Conflict,
            "the key names another request: stop, a new intention needs a new name".into(),
        ),
        // a problem that asks to be retried later stores nothing against the key
        400..=499 if retry_after.is_some() => Next::SendAgain(
            Duration::from_secs(retry_after.unwrap_or(1)),
            format!("{status} {code}: asked to try again later"),
        ),
        400..=499 => Next::Done(
            Outcome::Failed,
            format!("{status} {code}: a known failure, not retried"),
        ),
        // a server error committed nothing: the same key runs it again
        _ => Next::SendAgain(Duration::ZERO, format!("{status}: a server error, nothing committed")),
    }
}

fn describe(status: u16, replayed: bool, body: &Value) -> String {
    let code = body["code"].as_str().map(|c| format!(" {c}")).unwrap_or_default();
    let replayed = if replayed { " (replayed)" } else { "" };
    format!("{status}{code}{replayed}")
}

fn describe_lost(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        "no answer in time".into()
    } else if error.is_connect() {
        "could not connect".into()
    } else {
        format!("the connection failed: {error}")
    }
}

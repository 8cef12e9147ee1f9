//! The agent side of the contract (docs/contract.md §9): a client that keeps
//! one intended action one operation across retries, timeouts and restarts.
//!
//! The caller names each operation (the task's own id for it) and gives what
//! it intends. [`Agent::execute`] then follows the article's rule:
//!
//! - the key is made once and stored in the [`journal`] **before the first
//!   send**; a restart of the agent finds it there and sends it again; the
//!   same name with another payload is refused before anything is sent,
//!   unless all the name came to was a refusal that claimed nothing (a 400
//!   for a bad body): then the fixed payload goes under the same key;
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
mod run;

use std::{path::Path, time::Duration};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use journal::{Account, AttemptRecord, Entry, Journal};
use run::Run;

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
        self.journal.rebind_unclaimed(name, request).await?;
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
        Run::new(self, name, &key, request).go().await
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

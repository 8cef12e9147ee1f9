//! A scenario file, as a newcomer reads it: a title, the lesson it teaches,
//! the sandbox's settings, the steps of the story (each says in words what
//! happens, then does one thing), and what must be true at the end —
//! checked against the services' own records.

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;
use serde_json::Value;

pub use crate::standby::StandbyKind;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Story {
    pub title: String,
    /// The one-line lesson it teaches.
    pub lesson: String,
    #[serde(default)]
    pub sandbox: Sandbox,
    #[serde(rename = "step")]
    pub steps: Vec<Step>,
    #[serde(default)]
    pub expect: Expectations,
    /// The file's name, without `.toml` (a matrix cell: `<route>/<template>`).
    #[serde(skip)]
    pub name: String,
    /// Where a matrix cell sits in the matrix.
    #[serde(skip)]
    pub cell: Option<Cell>,
}

/// A matrix cell's place: its route (the row), its test (the column) and,
/// when the test has several, which variant of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    pub route: String,
    pub test: String,
    pub variant: Option<String>,
}

/// How the sandbox runs for this story: environment variables of its own
/// (an approval policy, a claim mode, fail points…).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sandbox {
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// How many sandbox processes serve the services, on the same databases
    /// (1): with more, the network spreads requests over them, and a retry
    /// lands on another replica than its first attempt.
    pub replicas: Option<usize>,
    /// The services' databases on a PostgreSQL primary with a standby of
    /// this kind, for a story that fails the database over (PostgreSQL only).
    pub standby: Option<StandbyKind>,
}

/// One step: what happens, in words, and the one thing it does.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub say: String,
    pub fault: Option<Fault>,
    pub agent: Option<AgentStep>,
    pub agent_process: Option<AgentProcess>,
    pub burst: Option<Burst>,
    pub approve: Option<Approve>,
    pub restart: Option<Restart>,
    pub poll: Option<Poll>,
    pub held: Option<Held>,
    pub mcp: Option<McpCall>,
    /// The MCP server is killed (SIGKILL) if it runs, and started again on
    /// the same journal.
    pub restart_mcp: Option<bool>,
    /// Nothing happens for this many milliseconds (the network catches up).
    pub pause_ms: Option<u64>,
    pub expect: Option<StepExpect>,
}

/// Faults switched on (or off, with zeros) for the next steps.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// The network between the agent and a service (see `fault-proxy`).
    pub network: Option<NetworkFault>,
    /// The payment provider's `PUT /admin/faults` body.
    pub provider: Option<Value>,
    /// The deployment controller's `PUT /admin/faults` body.
    pub controller: Option<Value>,
    /// Either of them, by name: how a matrix template reaches the system a
    /// route delivers to.
    pub external: Option<ExternalFault>,
    /// The services' database (a story with a `[sandbox] standby`).
    pub database: Option<DatabaseFault>,
}

/// What befalls the primary and its standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatabaseFault {
    /// The standby has everything so far; then its replication is cut, and
    /// what the primary writes from now on is the primary's alone.
    StandbyFallsBehind,
    /// The primary is killed (SIGKILL), the standby is promoted, and the
    /// services' database address moves to it.
    PrimaryDies,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalFault {
    /// `payment provider` or `deployment controller`.
    pub system: String,
    /// Its `PUT /admin/faults` body.
    pub faults: Value,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkFault {
    pub service: String,
    #[serde(default)]
    pub drop_next_answers: u32,
    #[serde(default)]
    pub fail_next: u32,
    #[serde(default)]
    pub delay_ms: u64,
}

/// The agent (the library, in this process) runs one operation by name.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentStep {
    pub name: String,
    pub service: String,
    /// May name an earlier operation's answer: `/v1/payment_intents/{intent.id}/capture`.
    pub path: String,
    pub body: Value,
    /// Another agent, with a journal of its own (`main` by default).
    pub journal: Option<String>,
    /// Use the key of this earlier operation instead of a new one: an agent
    /// that copied a key it should not have.
    pub key_of: Option<String>,
    /// How long one request may take (2000 ms).
    pub timeout_ms: Option<u64>,
    /// Sends in this run, at most (6).
    pub max_sends: Option<u32>,
    /// Follow work that goes on after its answer for this long.
    pub follow_seconds: Option<f64>,
}

/// The `agent` command line as its own process, killed (or not) while it waits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentProcess {
    pub name: String,
    pub service: String,
    pub path: String,
    pub body: Value,
    /// SIGKILL the process this long after it started.
    pub kill_after_ms: Option<u64>,
    pub timeout_ms: Option<u64>,
}

/// An MCP client (rmcp's, over streamable HTTP) calls one tool of the MCP
/// server, a process of its own that reaches the services through the
/// network proxies. The call's `intent` names it for later steps and checks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpCall {
    pub tool: String,
    pub arguments: Value,
    /// The MCP server is killed (SIGKILL) this long after the call starts,
    /// while the call waits: the client never gets an answer.
    pub kill_server_after_ms: Option<u64>,
    /// The client ends its session this long after the call starts: it
    /// drops the call and its connection.
    pub end_session_after_ms: Option<u64>,
}

/// Many copies of one request with one key, all at once, not through the agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Burst {
    pub copies: usize,
    /// The agent operation whose key every copy carries (a new key, kept
    /// under this name, if the agent has not started it).
    pub operation: String,
    pub service: String,
    pub path: String,
    pub body: Value,
}

/// An approver approves what an operation asked for, echoing its fingerprint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approve {
    /// The agent operation whose approval request is approved.
    pub operation: String,
    pub service: String,
}

/// The agent polls an operation's status (`GET /v1/operations/{id}`), or
/// a resource at `path`, until its `field` is one of `until`, as an agent
/// does after a timeout.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Poll {
    /// An agent operation, by name: its status is polled.
    pub operation: Option<String>,
    /// Or a resource: `/v1/deployments/{target.id}`.
    pub path: Option<String>,
    pub service: String,
    /// The member read (`state`).
    pub field: Option<String>,
    /// The values it waits for; `"*"` is any value at all (the member is set).
    pub until: Vec<String>,
    /// How long to keep asking (30 s).
    pub seconds: Option<f64>,
}

/// Waits until the sandbox says it holds at this fail point (set with
/// `FAILPOINTS` in a restart): the crash that follows is known to come
/// exactly there.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Held {
    pub fail_point: String,
    /// How long to wait for it (15 s).
    pub seconds: Option<f64>,
}

/// The sandbox is killed (SIGKILL) and started again, with `env` changed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Restart {
    /// Variables to set (a value) or remove (an empty string).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Wait this long for the agent meanwhile (after the kill, before the start).
    pub wait_ms: Option<u64>,
}

/// What a step must come to.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepExpect {
    /// The agent's outcome (an MCP call's `outcome`): one of these.
    pub outcome: Option<Vec<String>>,
    /// The problem `code` of the last answer (an MCP tool error's `code`).
    pub code: Option<String>,
    /// The agent used the same key as this earlier operation.
    pub same_key_as: Option<String>,
    /// A burst: how many copies were answered as the first (`Idempotent-Replayed: false`) with a 2xx.
    pub first_answers: Option<usize>,
    /// A burst: the statuses every copy may have.
    pub statuses: Option<Vec<u16>>,
    /// An agent process: its exit code.
    pub exit_code: Option<i32>,
}

/// What must be true at the end, read from the services' own records.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectations {
    /// Tickets in the tickets service.
    pub tickets: Option<usize>,
    /// Charges the payment provider really made.
    pub provider_charges: Option<u64>,
    /// Refunds the payment provider really made.
    pub provider_refunds: Option<u64>,
    /// Rollouts the deployment controller really started.
    pub controller_rollouts: Option<u64>,
    /// Rollouts the deployment controller really stopped.
    pub controller_cancels: Option<u64>,
    /// Items of a service's list, as its API shows them.
    #[serde(default)]
    pub count: Vec<CountExpect>,
    /// Pending approvals at a service.
    pub pending_approvals: Option<PendingApprovals>,
    /// Events in a service's audit journal for an agent operation.
    #[serde(default)]
    pub journal: Vec<JournalExpect>,
    /// How many replicas an operation's requests (those with its key) reached.
    #[serde(default)]
    pub spread: Vec<SpreadExpect>,
}

/// How many items a list (`GET path`, its `data`) holds, counting only those
/// whose members equal `where`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountExpect {
    /// What is counted, in words: "comments on the ticket".
    pub what: String,
    pub service: String,
    pub path: String,
    #[serde(default, rename = "where")]
    pub matching: BTreeMap<String, String>,
    pub count: usize,
    /// Read as the approver (approvals), not the agent.
    #[serde(default)]
    pub as_approver: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingApprovals {
    pub service: String,
    pub count: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalExpect {
    /// The agent operation (by name) whose journal entries are read.
    pub operation: String,
    pub service: String,
    /// Events that must be there.
    #[serde(default)]
    pub includes: Vec<String>,
    /// Events that must not.
    #[serde(default)]
    pub excludes: Vec<String>,
}

impl Step {
    /// How many things the step does; a story says one thing per step.
    pub fn actions(&self) -> usize {
        [
            self.fault.is_some(),
            self.agent.is_some(),
            self.agent_process.is_some(),
            self.burst.is_some(),
            self.approve.is_some(),
            self.restart.is_some(),
            self.poll.is_some(),
            self.held.is_some(),
            self.mcp.is_some(),
            self.restart_mcp.is_some(),
            self.pause_ms.is_some(),
        ]
        .into_iter()
        .filter(|a| *a)
        .count()
    }
}

impl Story {
    /// What a story file must be beyond its syntax: one thing per step.
    pub fn check(&self) -> Result<(), String> {
        match self.steps.iter().find(|s| s.actions() != 1) {
            Some(step) => Err(format!("the step \"{}\" must do exactly one thing", step.say)),
            None => Ok(()),
        }
    }
}

impl Expectations {
    /// These expectations and `more`'s: where both say one thing, these win.
    pub fn and(self, more: Expectations) -> Expectations {
        Expectations {
            tickets: self.tickets.or(more.tickets),
            provider_charges: self.provider_charges.or(more.provider_charges),
            provider_refunds: self.provider_refunds.or(more.provider_refunds),
            controller_rollouts: self.controller_rollouts.or(more.controller_rollouts),
            controller_cancels: self.controller_cancels.or(more.controller_cancels),
            count: self.count.into_iter().chain(more.count).collect(),
            pending_approvals: self.pending_approvals.or(more.pending_approvals),
            journal: self.journal.into_iter().chain(more.journal).collect(),
            spread: self.spread.into_iter().chain(more.spread).collect(),
        }
    }
}

/// Every story in `dir`, by name.
pub fn load_all(dir: &Path) -> Result<Vec<Story>, String> {
    let mut stories = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut story: Story = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        story.name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        story.check().map_err(|e| format!("{}: {e}", path.display()))?;
        stories.push(story);
    }
    Ok(stories)
}

/// An operation's requests reached this many replicas.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpreadExpect {
    pub operation: String,
    pub service: String,
    pub replicas: usize,
}

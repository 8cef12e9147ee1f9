//! The calls themselves: a tool's arguments in, the service asked, an
//! [`Answer`] out — and every call journaled.
//!
//! A write goes through the agent client (docs/contract.md §9): the intent's
//! key is made once and stored before the first send, a lost answer is asked
//! about by key before anything is sent again, and the call runs to its end
//! even if the MCP client cancels it or goes away, so the next call with the
//! same intent finds its answer rather than a half-done request.

mod args;
mod lookup;
mod read;
mod write;

use std::sync::Arc;

use agent::{Account, Agent, AgentError, Journal};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::{
    answer::{Answer, ToolError},
    calls::{Calls, ToolCall},
    config::McpConfig,
    endpoints::Service,
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

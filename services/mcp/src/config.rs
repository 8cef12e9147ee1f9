//! Where the MCP server finds the services and with which keys it calls them.
//! The keys are the server's alone: no tool takes one and no answer shows one.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `MCP_TICKETS_URL`, `MCP_PAYMENTS_URL`, `MCP_DEPLOYMENTS_URL` | each service's base URL | the sandbox's ports |
//! | `MCP_API_KEY` | the key for every service | the demo agent key of `MCP_ACCOUNT` |
//! | `MCP_TICKETS_API_KEY`, … | one service's key, over `MCP_API_KEY` | |
//! | `MCP_ACCOUNT` | the sandbox account whose demo agent key is used (`acme`, `globex`) | `acme` |
//! | `MCP_JOURNAL` | the SQLite file of intents, keys and tool calls | `<RETRYSAFE_DATA_DIR>/mcp.db` |
//! | `MCP_ADDR` | where the sandbox serves streamable HTTP | `127.0.0.1:7004` |
//! | `MCP_ALLOWED_HOSTS` | `Host` values HTTP accepts, comma-separated | loopback only |
//!
//! Outside sandbox mode (`RETRYSAFE_SANDBOX=false`) there are no demo keys: a
//! key must be configured.

use std::{path::PathBuf, time::Duration};

use agent::AgentConfig;
use platform::{auth::DEMO_KEYS, auth::Role};

use crate::endpoints::Service;

/// The sandbox's port for streamable HTTP.
pub const DEFAULT_PORT: u16 = 7004;

/// One service as the MCP server calls it.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    pub api_key: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // a key never reaches a log
        f.debug_struct("Target").field("url", &self.url).finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
pub struct McpConfig {
    pub tickets: Target,
    pub payments: Target,
    pub deployments: Target,
    /// The deployments service's environments, for the tools' schemas.
    pub environments: Vec<String>,
    /// The file of intents, their keys, and the tool calls.
    pub journal: PathBuf,
    /// How patient one call is with a service (see `agent::AgentConfig`).
    pub agent: AgentConfig,
    /// `Host` values streamable HTTP accepts.
    pub allowed_hosts: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(String);

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl McpConfig {
    /// From the environment; `account` (`--account`) over `MCP_ACCOUNT`.
    pub fn from_env(account: Option<&str>) -> Result<McpConfig, ConfigError> {
        let sandbox =
            env("RETRYSAFE_SANDBOX").is_none_or(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes"));
        let account = account.map(str::to_owned).or_else(|| env("MCP_ACCOUNT"));
        let shared_key = match env("MCP_API_KEY") {
            Some(key) => Some(key),
            None if sandbox => Some(demo_agent_key(account.as_deref().unwrap_or("acme"))?),
            None => None,
        };
        let target = |service: Service, port: u16| -> Result<Target, ConfigError> {
            let upper = service.as_str().to_ascii_uppercase();
            let api_key = env(&format!("MCP_{upper}_API_KEY"))
                .or_else(|| shared_key.clone())
                .ok_or_else(|| {
                    ConfigError(format!(
                        "no API key for {}: set MCP_API_KEY or MCP_{upper}_API_KEY",
                        service.as_str()
                    ))
                })?;
            Ok(Target {
                url: env(&format!("MCP_{upper}_URL"))
                    .unwrap_or_else(|| format!("http://127.0.0.1:{port}"))
                    .trim_end_matches('/')
                    .to_owned(),
                api_key,
            })
        };
        let policy = deployments::domain::DeploymentsPolicy::from_env().map_err(ConfigError)?;
        Ok(McpConfig {
            tickets: target(Service::Tickets, tickets::DEFAULT_PORT)?,
            payments: target(Service::Payments, payments::DEFAULT_PORT)?,
            deployments: target(Service::Deployments, deployments::DEFAULT_PORT)?,
            environments: policy.environments,
            journal: env("MCP_JOURNAL")
                .map(PathBuf::from)
                .unwrap_or_else(|| platform::config::data_dir().join("mcp.db")),
            agent: AgentConfig {
                request_timeout: Duration::from_secs(10),
                ..AgentConfig::default()
            },
            allowed_hosts: env("MCP_ALLOWED_HOSTS")
                .map(|hosts| hosts.split(',').map(|h| h.trim().to_owned()).collect())
                .unwrap_or_else(|| vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]),
        })
    }

    pub fn target(&self, service: Service) -> &Target {
        match service {
            Service::Tickets => &self.tickets,
            Service::Payments => &self.payments,
            Service::Deployments => &self.deployments,
        }
    }
}

/// The sandbox's demo agent key of `account`.
fn demo_agent_key(account: &str) -> Result<String, ConfigError> {
    DEMO_KEYS
        .iter()
        .find(|k| k.account_id == account && k.role == Role::Agent)
        .map(|k| k.key.to_owned())
        .ok_or_else(|| ConfigError(format!("no demo account `{account}` (the sandbox has acme and globex)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_picks_its_demo_agent_key_and_an_unknown_account_is_refused() {
        let acme = McpConfig::from_env(None).unwrap();
        assert_eq!(acme.tickets.api_key, "demo-acme-agent");
        let globex = McpConfig::from_env(Some("globex")).unwrap();
        for service in Service::ALL {
            assert_eq!(globex.target(service).api_key, "demo-globex-agent");
        }
        let unknown = McpConfig::from_env(Some("initech")).unwrap_err();
        assert!(unknown.to_string().contains("acme and globex"));
    }

    #[test]
    fn a_target_never_shows_its_key() {
        let target = Target {
            url: "http://127.0.0.1:7001".into(),
            api_key: "secret-agent-key".into(),
        };
        assert!(!format!("{target:?}").contains("secret"));
    }
}

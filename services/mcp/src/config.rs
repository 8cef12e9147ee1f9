//! Where the MCP server finds the services and with which keys it calls them.
//! The keys are the server's alone: no tool takes one and no answer shows one.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `MCP_TICKETS_URL`, `MCP_PAYMENTS_URL`, `MCP_DEPLOYMENTS_URL` | each service's base URL | the sandbox's ports |
//! | `MCP_API_KEY` | the key for every service | the demo agent key of `MCP_ACCOUNT` (sandbox) |
//! | `MCP_TICKETS_API_KEY`, … | one service's key, over `MCP_API_KEY` | |
//! | `MCP_ACCOUNT` | the account the keys act for: intents are kept per account; without `MCP_API_KEY`, the sandbox account whose demo agent key is used (`acme`, `globex`) | `acme` in the sandbox |
//! | `MCP_JOURNAL` | the SQLite file of intents, keys and tool calls | `<RETRYSAFE_DATA_DIR>/mcp.db` |
//! | `MCP_ADDR` | where the sandbox serves streamable HTTP | `127.0.0.1:7004` |
//! | `MCP_ALLOWED_HOSTS` | `Host` values HTTP accepts, comma-separated | loopback only |
//! | `MCP_ALLOWED_ORIGINS` | `Origin` values HTTP accepts, comma-separated (`http://host:port`, `:*` for any port) | the loopback origins |
//! | `MCP_HTTP_TOKEN` | the bearer token an MCP client must present over HTTP, at least 32 characters; the server's own, never a service's key | none in the sandbox; required outside it |
//! | `MCP_MAX_RUNS` | write calls under way at once; past it a call waits for one to end | `64` |
//!
//! Demo keys are the sandbox's: the MCP server uses acme's unless told
//! otherwise (`--account`, `MCP_ACCOUNT`, `MCP_API_KEY`); with
//! `RETRYSAFE_SANDBOX=false` a key or an account must be named, and
//! streamable HTTP is not served without `MCP_HTTP_TOKEN`, whatever address
//! it listens on: a loopback port is open to every process and user of the
//! machine, and whoever calls the endpoint acts with the server's keys.

use std::{path::PathBuf, time::Duration};

use agent::AgentConfig;
use platform::{auth::DEMO_KEYS, auth::Role};

use crate::endpoints::Service;

/// The sandbox's port for streamable HTTP.
pub const DEFAULT_PORT: u16 = 7004;

/// The browser origins streamable HTTP accepts unless configured: pages
/// served from this machine (an MCP client's own page, as the MCP
/// Inspector's is); a request with no `Origin` (any client but a browser)
/// is not a cross-site one and passes.
pub const LOOPBACK_ORIGINS: [&str; 3] = ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"];

/// The default of `MCP_MAX_RUNS`.
pub const DEFAULT_MAX_RUNS: usize = 64;

/// The bearer token an MCP client presents over streamable HTTP: the
/// endpoint's own, so the services' keys never leave the server. Its
/// `Debug` never shows it.
#[derive(Clone)]
pub struct HttpToken(String);

impl HttpToken {
    /// The fewest characters a token has: one that can be guessed is none.
    pub const MIN_CHARS: usize = 32;

    pub fn new(token: impl Into<String>) -> Result<HttpToken, ConfigError> {
        let token = token.into();
        if token.chars().count() < Self::MIN_CHARS || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError(format!(
                "MCP_HTTP_TOKEN must be at least {} visible ASCII characters (`openssl rand -hex 32` makes one)",
                Self::MIN_CHARS
            )));
        }
        Ok(HttpToken(token))
    }

    /// Whether `presented` is this token, compared in a time that does not
    /// tell how much of it was right.
    pub fn matches(&self, presented: &str) -> bool {
        constant_time_eq::constant_time_eq(self.0.as_bytes(), presented.as_bytes())
    }
}

impl std::fmt::Debug for HttpToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpToken(***)")
    }
}

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
    /// The account the keys act for, when named (`--account`, `MCP_ACCOUNT`):
    /// intents are kept per account, so a rotated key keeps them; unnamed,
    /// they are kept per key.
    pub account: Option<String>,
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
    /// `Origin` values streamable HTTP accepts, when a request has one.
    pub allowed_origins: Vec<String>,
    /// The token streamable HTTP requires, if any.
    pub http_token: Option<HttpToken>,
    /// Sandbox mode: streamable HTTP may be served without a token.
    pub sandbox: bool,
    /// Write calls under way at once; past it a call waits for one to end.
    pub max_runs: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(String);

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl McpConfig {
    /// From the environment; `account` (`--account`) over `MCP_ACCOUNT`.
    /// `sandbox_default`: whether acme's demo key is used, unasked, when
    /// `RETRYSAFE_SANDBOX` is not set.
    pub fn from_env(account: Option<&str>, sandbox_default: bool) -> Result<McpConfig, ConfigError> {
        McpConfig::from_vars(account, sandbox_default, env)
    }

    /// From the variables `var` reads.
    pub fn from_vars(
        account: Option<&str>,
        sandbox_default: bool,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<McpConfig, ConfigError> {
        let sandbox = var("RETRYSAFE_SANDBOX").map_or(sandbox_default, |v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes")
        });
        let mut account = account.map(str::to_owned).or_else(|| var("MCP_ACCOUNT"));
        // a named account without a key is a choice of its demo key; only the sandbox has one unasked
        let shared_key = match (var("MCP_API_KEY"), &account) {
            (Some(key), _) => Some(key),
            (None, Some(account)) => Some(demo_agent_key(account)?),
            (None, None) if sandbox => {
                account = Some("acme".into());
                Some(demo_agent_key("acme")?)
            }
            (None, None) => None,
        };
        let target = |service: Service, port: u16| -> Result<Target, ConfigError> {
            let upper = service.as_str().to_ascii_uppercase();
            let api_key = var(&format!("MCP_{upper}_API_KEY"))
                .or_else(|| shared_key.clone())
                .ok_or_else(|| {
                    ConfigError(format!(
                        "no API key for {}: set MCP_API_KEY (or MCP_{upper}_API_KEY), or name a sandbox account with --account",
                        service.as_str()
                    ))
                })?;
            Ok(Target {
                url: var(&format!("MCP_{upper}_URL"))
                    .map_or_else(
                        || {
                            Ok(format!(
                                "http://127.0.0.1:{}",
                                platform::config::sandbox_port(port).map_err(|e| ConfigError(e.0))?
                            ))
                        },
                        Ok,
                    )?
                    .trim_end_matches('/')
                    .to_owned(),
                api_key,
            })
        };
        let policy = deployments::domain::DeploymentsPolicy::parse(
            &var("DEPLOYMENTS_ENVIRONMENTS").unwrap_or_else(|| "development,staging,production".into()),
            &var("DEPLOYMENTS_APPROVAL_ENVIRONMENTS").unwrap_or_else(|| "production".into()),
        )
        .map_err(ConfigError)?;
        let list = |name: &str| {
            var(name).map(|values| {
                values
                    .split(',')
                    .map(|v| v.trim().to_owned())
                    .filter(|v| !v.is_empty())
                    .collect::<Vec<_>>()
            })
        };
        let (tickets, payments, deployments) = (
            target(Service::Tickets, tickets::DEFAULT_PORT)?,
            target(Service::Payments, payments::DEFAULT_PORT)?,
            target(Service::Deployments, deployments::DEFAULT_PORT)?,
        );
        let http_token = var("MCP_HTTP_TOKEN").map(HttpToken::new).transpose()?;
        if let Some(token) = &http_token
            && [&tickets, &payments, &deployments]
                .iter()
                .any(|t| token.matches(&t.api_key))
        {
            return Err(ConfigError(
                "MCP_HTTP_TOKEN is a service's API key: the endpoint needs a token of its own, so that the keys stay in the server".into(),
            ));
        }
        let max_runs = match var("MCP_MAX_RUNS") {
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|max| *max > 0)
                .ok_or_else(|| ConfigError(format!("MCP_MAX_RUNS `{v}` is not a whole number above 0")))?,
            None => DEFAULT_MAX_RUNS,
        };
        Ok(McpConfig {
            account,
            tickets,
            payments,
            deployments,
            environments: policy.environments,
            journal: journal_path(&var)?,
            agent: AgentConfig {
                request_timeout: Duration::from_secs(10),
                ..AgentConfig::default()
            },
            allowed_hosts: list("MCP_ALLOWED_HOSTS")
                .unwrap_or_else(|| vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]),
            allowed_origins: list("MCP_ALLOWED_ORIGINS")
                .unwrap_or_else(|| LOOPBACK_ORIGINS.map(str::to_owned).to_vec()),
            http_token,
            sandbox,
            max_runs,
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

/// `MCP_JOURNAL`, or `mcp.db` in the data directory, made absolute: a
/// server an MCP client starts from another directory finds the same file,
/// and with it every intent's key.
pub fn journal_path(var: &impl Fn(&str) -> Option<String>) -> Result<PathBuf, ConfigError> {
    let path = var("MCP_JOURNAL").map(PathBuf::from).unwrap_or_else(|| {
        var("RETRYSAFE_DATA_DIR")
            .map_or_else(|| PathBuf::from(".sandbox"), PathBuf::from)
            .join("mcp.db")
    });
    std::path::absolute(&path).map_err(|e| ConfigError(format!("MCP_JOURNAL {}: {e}", path.display())))
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
    use std::collections::HashMap;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn an_account_picks_its_demo_agent_key_and_an_unknown_account_is_refused() {
        let sandbox = McpConfig::from_vars(None, true, vars(&[])).unwrap();
        assert_eq!(sandbox.tickets.api_key, "demo-acme-agent");
        let globex = McpConfig::from_vars(Some("globex"), false, vars(&[])).unwrap();
        for service in Service::ALL {
            assert_eq!(globex.target(service).api_key, "demo-globex-agent");
        }
        let unknown = McpConfig::from_vars(Some("initech"), true, vars(&[])).unwrap_err();
        assert!(unknown.to_string().contains("acme and globex"));
    }

    #[test]
    fn outside_the_sandbox_a_key_must_be_configured_and_one_service_may_have_its_own() {
        let none = McpConfig::from_vars(None, false, vars(&[])).unwrap_err();
        assert!(none.to_string().contains("MCP_API_KEY"));
        let off = McpConfig::from_vars(None, true, vars(&[("RETRYSAFE_SANDBOX", "false")]));
        assert!(off.is_err(), "RETRYSAFE_SANDBOX=false: no demo keys");
        let keyed = McpConfig::from_vars(
            None,
            false,
            vars(&[("MCP_API_KEY", "rs_live_a"), ("MCP_PAYMENTS_API_KEY", "rs_live_b")]),
        )
        .unwrap();
        assert_eq!(keyed.tickets.api_key, "rs_live_a");
        assert_eq!(keyed.payments.api_key, "rs_live_b");
    }

    #[test]
    fn the_journal_path_is_absolute_wherever_the_server_is_started() {
        let config = McpConfig::from_vars(None, true, vars(&[("RETRYSAFE_DATA_DIR", "data")])).unwrap();
        assert!(config.journal.is_absolute());
        assert!(config.journal.ends_with("data/mcp.db"));
    }

    #[test]
    fn the_http_token_is_long_its_own_and_never_shown() {
        let token = "t".repeat(HttpToken::MIN_CHARS);
        let config = McpConfig::from_vars(None, true, vars(&[("MCP_HTTP_TOKEN", &token)])).unwrap();
        let configured = config.http_token.unwrap();
        assert!(configured.matches(&token));
        assert!(!configured.matches(&token[1..]));
        assert!(!format!("{configured:?}").contains(&token));

        let short = McpConfig::from_vars(None, true, vars(&[("MCP_HTTP_TOKEN", "secret")])).unwrap_err();
        assert!(short.to_string().contains("at least 32"), "{short}");
        let key = "rs_live_0123456789abcdef0123456789abcdef";
        let a_service_key =
            McpConfig::from_vars(None, false, vars(&[("MCP_API_KEY", key), ("MCP_HTTP_TOKEN", key)])).unwrap_err();
        assert!(a_service_key.to_string().contains("of its own"), "{a_service_key}");
    }

    #[test]
    fn streamable_http_takes_loopback_origins_unless_configured() {
        let sandbox = McpConfig::from_vars(None, true, vars(&[])).unwrap();
        assert_eq!(sandbox.allowed_origins, LOOPBACK_ORIGINS);
        assert!(sandbox.http_token.is_none() && sandbox.sandbox);
        let configured = McpConfig::from_vars(
            None,
            true,
            vars(&[("MCP_ALLOWED_ORIGINS", "https://a.example:443, https://b.example:*")]),
        )
        .unwrap();
        assert_eq!(
            configured.allowed_origins,
            ["https://a.example:443", "https://b.example:*"]
        );
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

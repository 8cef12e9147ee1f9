//! A whole Retrysafe world in process — the three services on fresh
//! databases, the simulated payment provider and deployment controller, all
//! on loopback ports — and an MCP client of no one's making but rmcp's,
//! talking to the MCP server over an in-memory pipe.

#![allow(dead_code)]

use std::{path::PathBuf, time::Duration};

use agent::AgentConfig;
use fault_proxy::FaultProxy;
use idempotency::IdempotencyConfig;
use mcp::{Gateway, McpConfig, McpServer, config::Target, schema::Documents};
use platform::{
    Backend,
    config::{ConnectionLimits, ServiceConfig},
    testing::TestDb,
};
use rmcp::{
    RoleClient, ServiceExt,
    model::{CallToolRequestParams, CallToolResult},
    service::RunningService,
};
use serde_json::{Map, Value, json};

pub use platform::testing::ACME_AGENT;
#[allow(unused_imports)]
pub use platform::testing::{ACME_APPROVER, GLOBEX_AGENT};

pub struct World {
    pub tickets: String,
    pub payments: String,
    pub deployments: String,
    /// A proxy in front of tickets, for faults between the MCP server and it.
    pub tickets_proxy: FaultProxy,
    pub controller: deploy_controller::Controller,
    pub journal: tempfile::TempDir,
    _dbs: Vec<TestDb>,
}

fn service_config(service: &'static str, db: &TestDb) -> ServiceConfig {
    ServiceConfig {
        service,
        listen: "127.0.0.1:0".parse().unwrap(),
        database_url: db.url.clone(),
        sandbox: true,
        max_connections: 5,
        limits: ConnectionLimits::default(),
    }
}

async fn listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

impl World {
    /// The three services on `backend`, the simulators beside them.
    pub async fn start(backend: Backend) -> World {
        World::start_with_step(backend, Duration::from_millis(50)).await
    }

    /// … with each phase of a rollout taking `step`.
    pub async fn start_with_step(backend: Backend, step: Duration) -> World {
        let (provider_listener, provider) = listener().await;
        tokio::spawn(payment_provider::serve(
            provider_listener,
            payment_provider::Provider::default(),
            Default::default(),
            std::future::pending(),
        ));
        let controller = deploy_controller::Controller::open(deploy_controller::ControllerConfig {
            step,
            ..Default::default()
        })
        .unwrap();
        let (controller_listener, controller_url) = listener().await;
        tokio::spawn(deploy_controller::serve(
            controller_listener,
            controller.clone(),
            Default::default(),
            std::future::pending(),
        ));

        let dbs = vec![
            TestDb::new(backend).await,
            TestDb::new(backend).await,
            TestDb::new(backend).await,
        ];
        let idempotency = IdempotencyConfig::default();
        let (tickets_listener, tickets) = listener().await;
        tokio::spawn(tickets::serve(
            service_config("tickets", &dbs[0]),
            idempotency.clone(),
            Default::default(),
            Some(tickets_listener),
            std::future::pending(),
        ));
        let (payments_listener, payments) = listener().await;
        let mut payments_settings = payments::Settings {
            policy: Default::default(),
            provider: Default::default(),
            outbox: Default::default(),
        };
        payments_settings.provider.url = provider;
        tokio::spawn(payments::serve(
            service_config("payments", &dbs[1]),
            idempotency.clone(),
            payments_settings,
            Some(payments_listener),
            std::future::pending(),
        ));
        let (deployments_listener, deployments) = listener().await;
        let mut deployments_settings = deployments::Settings {
            watch_every: Duration::from_millis(50),
            ..Default::default()
        };
        deployments_settings.controller.url = controller_url;
        tokio::spawn(deployments::serve(
            service_config("deployments", &dbs[2]),
            idempotency,
            deployments_settings,
            Some(deployments_listener),
            std::future::pending(),
        ));
        let world = World {
            tickets_proxy: FaultProxy::start(tickets.clone()).await.unwrap(),
            tickets,
            payments,
            deployments,
            controller,
            journal: tempfile::tempdir().unwrap(),
            _dbs: dbs,
        };
        for service in [&world.tickets, &world.payments, &world.deployments] {
            wait_until_up(service).await;
        }
        world
    }

    /// The MCP server's configuration: the demo agent key of `acme`, a
    /// journal that outlives each server (a restart finds it), and patience
    /// measured for tests.
    pub fn config(&self) -> McpConfig {
        let target = |url: &str| Target {
            url: url.to_owned(),
            api_key: ACME_AGENT.to_owned(),
        };
        McpConfig {
            account: Some("acme".into()),
            tickets: target(&self.tickets_proxy.url),
            payments: target(&self.payments),
            deployments: target(&self.deployments),
            environments: deployments::domain::DeploymentsPolicy::default().environments,
            journal: self.journal_path(),
            agent: AgentConfig {
                request_timeout: Duration::from_millis(1500),
                backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(200),
                ..AgentConfig::default()
            },
            allowed_hosts: vec!["127.0.0.1".into()],
            allowed_origins: mcp::config::LOOPBACK_ORIGINS.map(str::to_owned).to_vec(),
            http_token: None,
            sandbox: true,
            max_runs: mcp::config::DEFAULT_MAX_RUNS,
        }
    }

    /// … acting for another account, with its key, on the same journal.
    pub fn config_for(&self, account: &str, api_key: &str) -> McpConfig {
        let mut config = self.config();
        config.account = Some(account.to_owned());
        for target in [&mut config.tickets, &mut config.payments, &mut config.deployments] {
            target.api_key = api_key.to_owned();
        }
        config
    }

    pub fn journal_path(&self) -> PathBuf {
        self.journal.path().join("mcp.db")
    }

    /// An MCP server on this world and a client connected to it.
    pub async fn connect(&self) -> Client {
        self.connect_with(self.config()).await
    }

    pub async fn connect_with(&self, config: McpConfig) -> Client {
        let documents = Documents::new(&config.environments);
        let gateway = Gateway::open(config).await.unwrap();
        let server = McpServer::new(gateway.clone(), &documents);
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let running = server.serve(server_io).await.unwrap();
            let _ = running.waiting().await;
        });
        let client = ().serve(client_io).await.unwrap();
        Client { client, gateway }
    }

    /// GET on a service with a key, over plain HTTP.
    pub async fn get(&self, url: &str, path: &str, key: &str) -> Value {
        reqwest::Client::new()
            .get(format!("{url}{path}"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn post(&self, url: &str, path: &str, key: &str, body: Value) -> (u16, Value) {
        let response = reqwest::Client::new()
            .post(format!("{url}{path}"))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
    }

    /// The tickets of `project`, as the service lists them.
    pub async fn tickets_in(&self, project: &str) -> Vec<Value> {
        let list = self
            .get(&self.tickets, &format!("/v1/tickets?project={project}"), ACME_AGENT)
            .await;
        list["data"].as_array().cloned().unwrap_or_default()
    }
}

async fn wait_until_up(url: &str) {
    for _ in 0..200 {
        if reqwest::get(format!("{url}/healthz"))
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} never came up");
}

/// An rmcp client, and the server's gateway (to read its call journal).
pub struct Client {
    pub client: RunningService<RoleClient, ()>,
    pub gateway: Gateway,
}

/// A tool call's result, read.
#[derive(Debug)]
pub struct Called {
    pub is_error: bool,
    /// `structuredContent`, or the error's JSON.
    pub json: Value,
}

impl Called {
    pub fn outcome(&self) -> &str {
        assert!(!self.is_error, "expected an answer, got a tool error: {}", self.json);
        self.json["outcome"].as_str().unwrap()
    }

    pub fn next_step(&self) -> &str {
        self.json["next_step"].as_str().unwrap()
    }

    pub fn error_code(&self) -> &str {
        assert!(self.is_error, "expected a tool error, got an answer: {}", self.json);
        self.json["code"].as_str().unwrap()
    }

    pub fn str(&self, member: &str) -> String {
        self.json[member]
            .as_str()
            .unwrap_or_else(|| panic!("no `{member}` in {}", self.json))
            .to_owned()
    }
}

impl Client {
    pub async fn call(&self, tool: &str, arguments: Value) -> Called {
        let Value::Object(arguments) = arguments else {
            panic!("arguments are an object")
        };
        let result = self
            .client
            .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments))
            .await
            .unwrap();
        read(result)
    }
}

pub fn read(result: CallToolResult) -> Called {
    let is_error = result.is_error == Some(true);
    let json = match (&result.structured_content, is_error) {
        (Some(structured), false) => structured.clone(),
        _ => {
            let text = result
                .content
                .iter()
                .find_map(|c| c.as_text().map(|t| t.text.clone()))
                .expect("a text content");
            serde_json::from_str(&text).unwrap()
        }
    };
    Called { is_error, json }
}

/// A project name no other test uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

pub fn args(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => panic!("an object"),
    }
}

/// A digest of an artifact that exists nowhere but is well formed.
pub fn digest(seed: &str) -> String {
    use std::fmt::Write;
    let mut hex = String::new();
    for byte in seed.bytes().cycle().take(32) {
        let _ = write!(hex, "{byte:02x}");
    }
    format!("sha256:{hex}")
}

pub fn ticket(intent: &str, project: &str, title: &str) -> Value {
    json!({"intent": intent, "project": project, "title": title})
}

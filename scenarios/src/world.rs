//! The world a story plays in: the real sandbox as its own process (every
//! service) on fresh databases and free ports, the simulated payment provider
//! and deployment controller as processes of their own (as external systems
//! are: a crash of the services does not take them down), a fault proxy in
//! front of each service, the agent's journals, and — when a story calls a
//! tool — the MCP server as a process of its own, reaching the services
//! through the proxies. The sandbox and the MCP server are killed and started
//! again when a story says so; everything is cleaned up after.
//!
//! A story may ask for replicas: more sandbox processes on the same
//! databases, each proxy spreading its service's requests over them (a retry
//! goes to another replica than the one its key last reached). A restart
//! restarts the first; the others run on.
//!
//! A story may ask for a standby: the services' databases then live on a
//! PostgreSQL primary with a streaming standby of the story's own, reached
//! through an address that a failover moves (see `standby`).

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use fault_proxy::FaultProxy;

use crate::standby::{Replicated, StandbyKind};
use serde_json::Value;
use tokio::process::{Child, Command};

/// Which database the services run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// The services an agent talks to, each behind its proxy.
pub const SERVICES: [&str; 3] = ["tickets", "payments", "deployments"];

/// The sandbox's settings for every story: an outbox and a controller fast
/// enough that a story takes seconds, and pools small enough that several
/// stories can share one PostgreSQL server.
const FAST: [(&str, &str); 6] = [
    ("RETRYSAFE_OUTBOX_TIMEOUT_SECONDS", "1"),
    ("RETRYSAFE_OUTBOX_LEASE_SECONDS", "3"),
    ("RETRYSAFE_RECONCILE_AFTER_SECONDS", "0.5"),
    ("RETRYSAFE_LEASE_SECONDS", "3"),
    ("DEPLOY_CONTROLLER_STEP_MS", "300"),
    ("RETRYSAFE_DB_CONNECTIONS", "5"),
];

/// The programs a world runs, all in one directory.
pub const PROGRAMS: [&str; 5] = ["sandbox", "agent", "payment-provider", "deploy-controller", "mcp"];

pub struct World {
    binaries: PathBuf,
    pub agent_binary: PathBuf,
    sandbox: Option<Child>,
    /// Replicas beyond the first, on the same databases.
    replicas: Vec<Child>,
    /// The payment provider and the deployment controller, never killed by a story.
    _external: Vec<Child>,
    /// The MCP server, once a story calls a tool.
    mcp: Option<Child>,
    /// Where it listens: `http://127.0.0.1:<port>/mcp`.
    pub mcp_url: String,
    mcp_addr: String,
    /// How much of the sandbox's log was written before its latest start.
    log_before_start: u64,
    env: BTreeMap<String, String>,
    /// `tickets` → `http://127.0.0.1:<port>`: the services themselves.
    pub services: HashMap<&'static str, String>,
    /// The proxies agents go through, by service.
    pub proxies: HashMap<&'static str, FaultProxy>,
    pub provider: String,
    pub controller: String,
    /// Where this world keeps its files: SQLite databases, the agents' journals, the sandbox's log.
    pub dir: tempfile::TempDir,
    postgres: Option<(String, String)>,
    /// The primary and standby the services' databases live on, if the story asked for them.
    pub standby: Option<Replicated>,
    http: reqwest::Client,
}

impl World {
    /// Starts a fresh sandbox with the story's `env`, as `replicas`
    /// processes, its databases on a primary with a `standby` if one is
    /// asked for (PostgreSQL only: the caller makes sure).
    pub async fn start(
        backend: Backend,
        binaries: &Path,
        env: &BTreeMap<String, String>,
        replicas: usize,
        standby: Option<StandbyKind>,
    ) -> Result<World, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut ports = Vec::new();
        for _ in 0..10 {
            ports.push(free_port()?);
        }
        let address = |port: u16| format!("127.0.0.1:{port}");
        let mut settings: BTreeMap<String, String> = [
            ("TICKETS_ADDR", address(ports[0])),
            ("PAYMENTS_ADDR", address(ports[1])),
            ("DEPLOYMENTS_ADDR", address(ports[2])),
            ("CONSOLE_ADDR", address(ports[3])),
            // the sandbox's own simulators listen here, unused: the services call the external ones
            ("PAYMENT_PROVIDER_ADDR", address(ports[4])),
            ("DEPLOY_CONTROLLER_ADDR", address(ports[5])),
            ("PAYMENTS_PROVIDER_URL", format!("http://{}", address(ports[6]))),
            ("DEPLOYMENTS_CONTROLLER_URL", format!("http://{}", address(ports[7]))),
            // the sandbox's own MCP server, unused: stories call the standalone one
            ("MCP_ADDR", address(ports[8])),
            ("RETRYSAFE_DATA_DIR", dir.path().display().to_string()),
            ("LOG_FORMAT", "json".into()),
            ("RUST_LOG", "info".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain(FAST.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
        .collect();
        let standby = match standby {
            Some(kind) => Some(Replicated::start(kind, &SERVICES).await?),
            None => None,
        };
        let postgres = match (backend, &standby) {
            (_, Some(standby)) => {
                for service in SERVICES {
                    let variable = format!("{}_DATABASE_URL", service.to_ascii_uppercase());
                    settings.insert(variable, standby.url(service));
                }
                None
            }
            (Backend::Sqlite, None) => None,
            (Backend::Postgres, None) => {
                let name = format!("rs_scn_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
                let admin = postgres_admin_url();
                settings.insert("DATABASE_URL".into(), with_database(&admin, &name));
                Some((admin, name))
            }
        };
        settings.extend(env.clone());
        let services: HashMap<&'static str, String> = SERVICES
            .iter()
            .zip(&ports)
            .map(|(service, port)| (*service, format!("http://{}", address(*port))))
            .collect();
        // every replica beyond the first: its own ports, the same databases and simulators
        let mut replica_settings = Vec::new();
        for _ in 1..replicas.max(1) {
            let mut replica = settings.clone();
            for name in [
                "TICKETS_ADDR",
                "PAYMENTS_ADDR",
                "DEPLOYMENTS_ADDR",
                "CONSOLE_ADDR",
                "PAYMENT_PROVIDER_ADDR",
                "DEPLOY_CONTROLLER_ADDR",
                "MCP_ADDR",
            ] {
                replica.insert(name.to_owned(), address(free_port()?));
            }
            replica_settings.push(replica);
        }
        let mut proxies = HashMap::new();
        for service in SERVICES {
            let variable = format!("{}_ADDR", service.to_ascii_uppercase());
            let behind: Vec<String> = std::iter::once(services[service].clone())
                .chain(replica_settings.iter().map(|r| format!("http://{}", r[&variable])))
                .collect();
            let proxy = FaultProxy::spread(behind).await.map_err(|e| e.to_string())?;
            proxies.insert(service, proxy);
        }
        let external = vec![
            spawn(
                &binaries.join("payment-provider"),
                &[],
                &[("PAYMENT_PROVIDER_ADDR", address(ports[6]))],
                dir.path(),
                "payment-provider.log",
            )?,
            spawn(
                &binaries.join("deploy-controller"),
                &[],
                &[
                    ("DEPLOY_CONTROLLER_ADDR", address(ports[7])),
                    (
                        "DEPLOY_CONTROLLER_STEP_MS",
                        settings["DEPLOY_CONTROLLER_STEP_MS"].clone(),
                    ),
                ],
                dir.path(),
                "deploy-controller.log",
            )?,
        ];
        let mut world = World {
            binaries: binaries.to_owned(),
            agent_binary: binaries.join("agent"),
            sandbox: None,
            replicas: Vec::new(),
            _external: external,
            mcp: None,
            mcp_url: format!("http://{}/mcp", address(ports[9])),
            mcp_addr: address(ports[9]),
            log_before_start: 0,
            env: settings,
            services,
            proxies,
            provider: format!("http://{}", address(ports[6])),
            controller: format!("http://{}", address(ports[7])),
            dir,
            postgres,
            standby,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| e.to_string())?,
        };
        world.launch().await?;
        for (n, settings) in replica_settings.iter().enumerate() {
            world.launch_replica(n + 2, settings).await?;
        }
        Ok(world)
    }

    /// Starts replica `n` (2 and up) with `settings`, once the first has
    /// migrated the databases, and waits until its services answer.
    async fn launch_replica(&mut self, n: usize, settings: &BTreeMap<String, String>) -> Result<(), String> {
        let env: Vec<(&str, String)> = settings
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let log = format!("sandbox-{n}.log");
        let mut replica = spawn(&self.binaries.join("sandbox"), &[], &env, self.dir.path(), &log)?;
        let services: Vec<String> = SERVICES
            .iter()
            .map(|service| format!("http://{}", settings[&format!("{}_ADDR", service.to_ascii_uppercase())]))
            .collect();
        let answered = until_ready(&self.http, &mut replica, &services, &self.dir.path().join(&log)).await;
        self.replicas.push(replica);
        answered
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("sandbox.log")
    }

    /// Starts the sandbox process and waits until every part answers.
    async fn launch(&mut self) -> Result<(), String> {
        self.log_before_start = std::fs::metadata(self.log_path()).map_or(0, |m| m.len());
        let settings: Vec<(&str, String)> = self
            .env
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let mut sandbox = spawn(
            &self.binaries.join("sandbox"),
            &[],
            &settings,
            self.dir.path(),
            "sandbox.log",
        )?;
        let parts: Vec<String> = self
            .services
            .values()
            .cloned()
            .chain([self.provider.clone(), self.controller.clone()])
            .collect();
        let answered = until_ready(&self.http, &mut sandbox, &parts, &self.log_path()).await;
        self.sandbox = Some(sandbox);
        answered
    }

    /// Waits until the running sandbox logs that it holds at `fail_point`.
    pub async fn held_at(&self, fail_point: &str, wait: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let log = std::fs::read(self.log_path()).map_err(|e| e.to_string())?;
            let since_start = String::from_utf8_lossy(log.get(self.log_before_start as usize..).unwrap_or_default());
            let held = since_start
                .lines()
                .any(|line| line.contains("fail point reached") && line.contains(&format!("\"{fail_point}\"")));
            if held {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "the sandbox did not reach the fail point {fail_point} within {wait:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: no clean-up, no graceful shutdown.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.sandbox.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Kills the sandbox and starts it again with `changes` to its environment
    /// (an empty value removes a variable).
    pub async fn restart(&mut self, changes: &BTreeMap<String, String>, wait: Duration) -> Result<(), String> {
        self.kill().await;
        for (name, value) in changes {
            if value.is_empty() {
                self.env.remove(name);
            } else {
                self.env.insert(name.clone(), value.clone());
            }
        }
        tokio::time::sleep(wait).await;
        self.launch().await
    }

    /// Starts the MCP server (if it is not running) and waits until it answers.
    pub async fn start_mcp(&mut self) -> Result<(), String> {
        if self.mcp.is_some() {
            return Ok(());
        }
        let dir = self.dir.path();
        let env = [
            ("MCP_ADDR", self.mcp_addr.clone()),
            ("MCP_TICKETS_URL", self.proxies["tickets"].url.clone()),
            ("MCP_PAYMENTS_URL", self.proxies["payments"].url.clone()),
            ("MCP_DEPLOYMENTS_URL", self.proxies["deployments"].url.clone()),
            ("MCP_JOURNAL", self.mcp_journal().display().to_string()),
            ("MCP_ACCOUNT", "acme".into()),
            ("RETRYSAFE_DATA_DIR", dir.display().to_string()),
            ("LOG_FORMAT", "json".into()),
        ];
        let child = spawn(&self.binaries.join("mcp"), &["http"], &env, dir, "mcp.log")?;
        let mcp = self.mcp.insert(child);
        let up = async {
            loop {
                if let Ok(Some(status)) = mcp.try_wait() {
                    return Err(format!("the MCP server exited ({status}): see mcp.log"));
                }
                // any HTTP answer at all: it listens
                if self.http.get(&self.mcp_url).send().await.is_ok() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), up)
            .await
            .map_err(|_| "the MCP server did not answer within 30 s".to_owned())?
    }

    /// SIGKILL for the MCP server.
    pub async fn kill_mcp(&mut self) {
        if let Some(mut child) = self.mcp.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// The MCP server's journal of intents, keys and tool calls.
    pub fn mcp_journal(&self) -> PathBuf {
        self.dir.path().join("mcp.db")
    }

    /// `mcp journal`: every tool call, as JSON.
    pub async fn mcp_calls(&self) -> Vec<Value> {
        let output = Command::new(self.binaries.join("mcp"))
            .arg("journal")
            .env("MCP_JOURNAL", self.mcp_journal())
            .env_remove("DATABASE_URL")
            .output()
            .await;
        let Ok(output) = output else { return Vec::new() };
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    pub fn service(&self, name: &str) -> Result<&'static str, String> {
        SERVICES
            .into_iter()
            .find(|s| *s == name)
            .ok_or_else(|| format!("no service `{name}`: tickets, payments or deployments"))
    }

    /// A GET as `bearer`, its JSON.
    pub async fn get(&self, url: &str, bearer: &str) -> Result<Value, String> {
        let response = self
            .http
            .get(url)
            .bearer_auth(bearer)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        response.json().await.map_err(|e| format!("GET {url}: {e}"))
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Stops the sandbox (the external systems die with the world) and drops the story's PostgreSQL databases.
    pub async fn finish(mut self) {
        self.kill().await;
        for mut replica in std::mem::take(&mut self.replicas) {
            let _ = replica.start_kill();
            let _ = replica.wait().await;
        }
        self.kill_mcp().await;
        if let Some((admin, name)) = &self.postgres {
            let drop = async {
                use sqlx::{Connection, Executor};
                let mut connection = sqlx::PgConnection::connect(admin).await?;
                for service in SERVICES {
                    let sql = format!("DROP DATABASE IF EXISTS \"{name}_{service}\" WITH (FORCE)");
                    connection.execute(sqlx::AssertSqlSafe(sql)).await?;
                }
                Ok::<_, sqlx::Error>(())
            };
            if let Err(e) = drop.await {
                eprintln!("could not drop the story's databases {name}_*: {e}");
            }
        }
    }
}

/// Waits until each of `urls` answers `/healthz`, for a minute at most; a
/// sandbox that exits first is an error with the last lines of its `log`.
async fn until_ready(http: &reqwest::Client, sandbox: &mut Child, urls: &[String], log: &Path) -> Result<(), String> {
    let ready = async {
        for url in urls {
            loop {
                if let Ok(Some(status)) = sandbox.try_wait() {
                    let words = std::fs::read_to_string(log).unwrap_or_default();
                    let last: Vec<&str> = words.lines().rev().take(5).collect();
                    return Err(format!(
                        "the sandbox exited ({status}); its last words: {}",
                        last.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    ));
                }
                if http
                    .get(format!("{url}/healthz"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(60), ready)
        .await
        .map_err(|_| format!("the sandbox did not answer within a minute: see {}", log.display()))?
}

/// Starts `binary` with `args` in `dir` with `env` (and none of this process's database
/// or fail point settings), its output appended to `log` there.
fn spawn(binary: &Path, args: &[&str], env: &[(&str, String)], dir: &Path, log: &str) -> Result<Child, String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(log))
        .map_err(|e| e.to_string())?;
    Command::new(binary)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("FAILPOINTS")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().map_err(|e| e.to_string())?))
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{}: {e} (is it built?)", binary.display()))
}

/// A port free now, below Linux's ephemeral range (32768 and up): a port
/// from that range can be taken by any outgoing connection while the sandbox
/// is down between a kill and its restart.
/// Never the same port twice in one run: a port is only tried, not held, so
/// two picks of one number would both look free.
fn free_port() -> Result<u16, String> {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..200 {
        let port = fastrand::u16(20_000..32_000);
        if !handed_out.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.push(port);
            return Ok(port);
        }
    }
    Err("no free port between 20000 and 32000".into())
}

/// `TEST_DATABASE_URL`, else `DATABASE_URL`, else the local server.
pub fn postgres_admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .ok()
        .filter(|u| u.starts_with("postgres"))
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let server = match base.rfind('/') {
        Some(i) if i > "postgres://".len() => &base[..i],
        _ => base,
    };
    match query {
        Some(query) => format!("{server}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}

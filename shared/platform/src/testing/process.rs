//! Service binaries run as real processes: started and killed for tests of
//! crashes, asked for their `--help`, and made to store API keys.

use super::{ACME_APPROVER, TestClient, TestDb};
use crate::db::Backend;

/// A service binary running as a real process, for tests that kill it
/// (docs/contract.md §5's crashes): started with JSON logs on `127.0.0.1:0`,
/// its address read from its "listening" line, its stdout drained so it never
/// blocks, and killed with SIGKILL — no clean-up, no graceful shutdown.
#[derive(Debug)]
pub struct ServiceProcess {
    child: tokio::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    log: tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
    /// Every log line read so far.
    seen: Vec<serde_json::Value>,
}

impl ServiceProcess {
    /// Starts `binary` (a `CARGO_BIN_EXE_…` path) of service `service` with
    /// `env`, in sandbox mode (the demo keys), without any `DATABASE_URL` or
    /// `FAILPOINTS` of the test's own environment, and waits for
    /// "`<service>` listening".
    pub async fn start(binary: &str, service: &str, env: &[(&str, &str)]) -> ServiceProcess {
        let addr_variable = format!("{}_ADDR", service.to_ascii_uppercase());
        ServiceProcess::start_with(binary, &addr_variable, &format!("{service} listening"), env).await
    }

    /// Like [`ServiceProcess::start`], for a binary whose listen address is
    /// `addr_variable` and which logs `listening` (with its `addr`) once it serves.
    pub async fn start_with(
        binary: &str,
        addr_variable: &str,
        listening: &str,
        env: &[(&str, &str)],
    ) -> ServiceProcess {
        use tokio::io::AsyncBufReadExt;
        let mut command = tokio::process::Command::new(binary);
        command
            .env_remove("DATABASE_URL")
            .env_remove("FAILPOINTS")
            .env(addr_variable, "127.0.0.1:0")
            .env("RETRYSAFE_SANDBOX", "true")
            .env("LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        let mut child = command.spawn().unwrap_or_else(|e| panic!("{binary} starts: {e}"));
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let (sender, log) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) {
                    let _ = sender.send(entry);
                }
            }
        });
        let mut process = ServiceProcess {
            child,
            base: String::new(),
            log,
            seen: Vec::new(),
        };
        let listening = process.wait_for(listening).await;
        let addr = listening["addr"]
            .as_str()
            .expect("the listening line names the address");
        process.base = format!("http://{addr}");
        process
    }

    /// The first log line from now on whose message starts with `message`
    /// (within a minute).
    pub async fn wait_for(&mut self, message: &str) -> serde_json::Value {
        let (log, seen) = (&mut self.log, &mut self.seen);
        let found = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            while let Some(entry) = log.recv().await {
                seen.push(entry.clone());
                if entry["message"].as_str().is_some_and(|m| m.starts_with(message)) {
                    return entry;
                }
            }
            panic!("the process exited before logging `{message}`");
        });
        found
            .await
            .unwrap_or_else(|_| panic!("no `{message}` in the log within a minute"))
    }

    /// The first log line whose message starts with `message`, among those
    /// read already (before "listening", say) or within a minute.
    pub async fn logged(&mut self, message: &str) -> serde_json::Value {
        let earlier = self
            .seen
            .iter()
            .find(|entry| entry["message"].as_str().is_some_and(|m| m.starts_with(message)));
        match earlier {
            Some(entry) => entry.clone(),
            None => self.wait_for(message).await,
        }
    }

    /// A client of the process, over HTTP.
    pub fn client(&self) -> TestClient {
        TestClient::http(&self.base)
    }

    /// SIGTERM: the process shuts down as it does in production (its log
    /// goes on until it [`exited`](ServiceProcess::exited)).
    pub fn terminate(&self) {
        let pid = self.child.id().expect("the process runs");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM is sent");
    }

    /// Waits (up to a minute) for the process to end by itself; its exit code.
    pub async fn exited(mut self) -> Option<i32> {
        let status = tokio::time::timeout(std::time::Duration::from_secs(60), self.child.wait())
            .await
            .expect("the process ends within a minute")
            .expect("the process is reaped");
        status.code()
    }

    /// SIGKILL, and the process is gone.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL is sent");
        let status = self.child.wait().await.expect("the process is reaped");
        assert!(!status.success(), "killed, not exited");
    }
}

/// `binary --help`: its output, once it has exited 0.
pub fn help_of(binary: &str) -> String {
    let output = std::process::Command::new(binary)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("{binary} starts: {e}"));
    assert!(output.status.success(), "--help exits 0: {output:?}");
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

/// What every service binary's `create-api-key` must do: keys it makes
/// outside sandbox mode act with their roles on the real process (an
/// approver reads approvals, an agent may not), and no demo key works there.
pub async fn keys_made_by_create_api_key_act_with_their_roles(binary: &str, service: &str, backend: Backend) {
    let db = TestDb::new(backend).await;
    let approver = create_api_key(binary, service, &db.url, ["acme", "alice", "approver"]);
    let agent = create_api_key(binary, service, &db.url, ["acme", "bot", "agent"]);
    let database_url = format!("{}_DATABASE_URL", service.to_ascii_uppercase());
    let process = ServiceProcess::start(
        binary,
        service,
        &[(&database_url, &db.url), ("RETRYSAFE_SANDBOX", "false")],
    )
    .await;

    let client = process.client();
    let status_for = async |key: &str| client.get("/v1/approvals", key).await.status.as_u16();
    assert_eq!(status_for(&approver).await, 200, "an approver reads approvals");
    assert_eq!(status_for(&agent).await, 403, "an agent may not");
    assert_eq!(status_for(ACME_APPROVER).await, 401, "no demo keys outside the sandbox");
    process.kill().await;
}

/// `binary create-api-key <account> <principal> <role>` of service `service`
/// on the database at `database_url`, outside sandbox mode: the key it prints.
pub fn create_api_key(binary: &str, service: &str, database_url: &str, principal: [&str; 3]) -> String {
    let output = std::process::Command::new(binary)
        .arg("create-api-key")
        .args(principal)
        .env_remove("DATABASE_URL")
        .env_remove("RETRYSAFE_SANDBOX")
        .env(format!("{}_DATABASE_URL", service.to_ascii_uppercase()), database_url)
        .output()
        .unwrap_or_else(|e| panic!("{binary} starts: {e}"));
    assert!(output.status.success(), "create-api-key exits 0: {output:?}");
    let key = String::from_utf8(output.stdout).expect("the key is UTF-8");
    key.trim().to_owned()
}

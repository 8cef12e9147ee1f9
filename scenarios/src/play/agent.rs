//! Agent steps: the agent library in this process, or the `agent` command line
//! as a process of its own, and the checks of what an operation came to.

use std::time::Duration;

use agent::{Agent, AgentConfig, AgentError, Request};
use serde_json::Value;

use super::{AGENT_KEY, Known, Stage};
use crate::story::{AgentProcess, AgentStep, StepExpect};

impl Stage<'_> {
    pub(super) async fn open_agent(&self, journal: &str, config: AgentConfig) -> Result<Agent, String> {
        Agent::open(&self.world.dir.path().join(format!("{journal}.db")), AGENT_KEY, config)
            .await
            .map_err(|e| e.to_string())
    }

    pub(super) async fn agent(&mut self, step: &AgentStep, expect: Option<&StepExpect>) -> Result<(), String> {
        let service = self.world.service(&step.service)?;
        let journal = step.journal.clone().unwrap_or_else(|| "main".into());
        if !self.journals.contains(&journal) {
            self.journals.push(journal.clone());
        }
        let config = AgentConfig {
            request_timeout: Duration::from_millis(step.timeout_ms.unwrap_or(2000)),
            max_sends: step.max_sends.unwrap_or(6),
            backoff: Duration::from_millis(100),
            follow_for: Duration::from_secs_f64(step.follow_seconds.unwrap_or(0.0)),
            ..AgentConfig::default()
        };
        let agent = self.open_agent(&journal, config).await?;
        let request = Request::post(
            self.world.proxies[service].url.clone(),
            self.fill_text(&step.path),
            self.fill(&step.body),
        );
        if let Some(other) = &step.key_of {
            let key = self
                .known
                .get(other)
                .map(|k| k.key.clone())
                .ok_or_else(|| format!("no earlier operation `{other}` to take a key from"))?;
            agent
                .journal()
                .adopt(&step.name, &key, &request)
                .await
                .map_err(|e| e.to_string())?;
        }
        let ran = agent.execute(&step.name, &request).await;
        agent.journal().close().await;
        let report = match ran {
            Ok(report) => report,
            Err(AgentError::ChangedPayload { name }) => {
                self.check_outcome(&step.name, expect, "refused_locally", None, None);
                self.note(
                    "agent",
                    &format!("{name}: refused before sending: another payload under this name"),
                );
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        };
        let body = report.body.clone().unwrap_or(Value::Null);
        self.known.insert(
            step.name.clone(),
            Known {
                key: report.idempotency_key.clone(),
                operation_id: report.operation_id.clone(),
                body: body.clone(),
            },
        );
        self.check_outcome(
            &step.name,
            expect,
            report.outcome.as_str(),
            body["code"].as_str(),
            Some(&report.idempotency_key),
        );
        Ok(())
    }

    /// The step's expectations of an agent run.
    pub(super) fn check_outcome(
        &mut self,
        name: &str,
        expect: Option<&StepExpect>,
        outcome: &str,
        code: Option<&str>,
        key: Option<&str>,
    ) {
        let Some(expect) = expect else { return };
        if let Some(outcomes) = &expect.outcome {
            self.check(
                format!("the agent's `{name}` comes to"),
                outcomes.join(" or "),
                outcome.into(),
                outcomes.iter().any(|o| o == outcome),
            );
        }
        if let Some(expected) = &expect.code {
            self.check(
                format!("the answer to `{name}` says"),
                expected.clone(),
                code.unwrap_or("-").into(),
                code == Some(expected.as_str()),
            );
        }
        if let Some(other) = &expect.same_key_as {
            let earlier = self.known.get(other).map(|k| k.key.clone()).unwrap_or_default();
            self.check(
                format!("`{name}` is sent with the key of `{other}`"),
                earlier.clone(),
                key.unwrap_or("-").into(),
                key == Some(earlier.as_str()),
            );
        }
    }

    /// The `agent` command line, as a process of its own: killed while it waits, or run to its end.
    pub(super) async fn agent_process(
        &mut self,
        step: &AgentProcess,
        expect: Option<&StepExpect>,
    ) -> Result<(), String> {
        let service = self.world.service(&step.service)?;
        let journal = self.world.dir.path().join("main.db");
        let timeout = Duration::from_millis(step.timeout_ms.unwrap_or(2000));
        let mut command = tokio::process::Command::new(&self.world.agent_binary);
        command
            .arg("--journal")
            .arg(&journal)
            .arg("--token")
            .arg(AGENT_KEY)
            .arg("--timeout")
            .arg(timeout.as_secs_f64().to_string())
            .args(["run", &step.name, "--url", &self.world.proxies[service].url])
            .args(["--path", &self.fill_text(&step.path)])
            .args(["--data", &self.fill(&step.body).to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .map_err(|e| format!("{}: {e} (is it built?)", self.world.agent_binary.display()))?;
        self.note("agent", &format!("the `agent` process starts: run {}", step.name));
        let exit_code = match step.kill_after_ms {
            Some(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let _ = child.start_kill();
                let _ = child.wait().await;
                self.note("agent", "the `agent` process is killed (SIGKILL) while it waits");
                None
            }
            None => {
                let output = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
                    .await
                    .map_err(|_| "the agent process ran for more than 90 s".to_owned())?
                    .map_err(|e| e.to_string())?;
                let report: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
                self.note(
                    "agent",
                    &format!(
                        "the `agent` process ends: {}",
                        report["outcome"].as_str().unwrap_or("-")
                    ),
                );
                if let Some(expect) = expect {
                    self.check_outcome(
                        &step.name,
                        Some(expect),
                        report["outcome"].as_str().unwrap_or("-"),
                        report["body"]["code"].as_str(),
                        report["idempotency_key"].as_str(),
                    );
                }
                output.status.code()
            }
        };
        // what the journal file knows of it, whatever became of the process
        let agent = self.open_agent("main", AgentConfig::default()).await?;
        let entry = agent.journal().entry(&step.name).await.map_err(|e| e.to_string())?;
        agent.journal().close().await;
        if let Some(entry) = entry {
            let earlier = self.known.get(&step.name).cloned();
            if let Some(expect) = expect
                && expect.same_key_as.as_deref() == Some(step.name.as_str())
                && let Some(earlier) = &earlier
            {
                self.check(
                    format!(
                        "the restarted `agent` sends `{}` with the key it stored before",
                        step.name
                    ),
                    earlier.key.clone(),
                    entry.idempotency_key.clone(),
                    earlier.key == entry.idempotency_key,
                );
            }
            self.known.insert(
                step.name.clone(),
                Known {
                    key: entry.idempotency_key,
                    operation_id: entry.operation_id,
                    body: entry
                        .result_body
                        .as_deref()
                        .and_then(|b| serde_json::from_str(b).ok())
                        .unwrap_or(Value::Null),
                },
            );
        }
        if let Some(expected) = expect.and_then(|e| e.exit_code) {
            self.check(
                format!("the `agent` process for `{}` exits with", step.name),
                expected.to_string(),
                exit_code.map_or("-".into(), |c| c.to_string()),
                exit_code == Some(expected),
            );
        }
        Ok(())
    }
}

//! Playing a story: each step in a fresh world, each expectation checked
//! against the services' own records, and every party's record of what
//! happened gathered into one timeline.

use std::{collections::HashMap, path::Path, time::Duration};

use agent::{Agent, AgentConfig, AgentError, Request};
use fault_proxy::ProxyFaults;
use futures::future::join_all;
use serde_json::{Value, json};

use crate::{
    story::{
        AgentProcess, AgentStep, Approve, Burst, CountExpect, Expectations, Fault, Held, McpCall, Poll, StepExpect,
        Story,
    },
    world::{Backend, SERVICES, World},
};

const AGENT_KEY: &str = "demo-acme-agent";
const APPROVER_KEY: &str = "demo-acme-approver";

/// One expectation and whether it held.
#[derive(Debug, Clone)]
pub struct Check {
    pub what: String,
    pub expected: String,
    pub got: String,
    pub held: bool,
}

/// Something one party did, for the timeline.
#[derive(Debug, Clone)]
pub struct Event {
    /// RFC 3339, UTC, microseconds: they sort as text.
    pub at: String,
    pub lane: String,
    pub text: String,
}

/// A story played on one backend.
#[derive(Debug)]
pub struct Played {
    pub story: Story,
    pub backend: Backend,
    pub checks: Vec<Check>,
    pub timeline: Vec<Event>,
    /// Why it could not be played to the end.
    pub error: Option<String>,
}

impl Played {
    /// Played to the end, and every check held; a story that checked nothing proves nothing.
    pub fn passed(&self) -> bool {
        self.error.is_none() && !self.checks.is_empty() && self.checks.iter().all(|c| c.held)
    }
}

/// What an agent operation came to, kept for later steps and checks.
#[derive(Debug, Clone, Default)]
struct Known {
    key: String,
    operation_id: Option<String>,
    body: Value,
}

/// One answer to a copy in a burst.
#[derive(Debug)]
struct Answer {
    status: u16,
    replayed: bool,
    operation_id: Option<String>,
    body: Value,
}

impl Answer {
    /// A 2xx that is not a replay: the copy that ran.
    fn is_first(&self) -> bool {
        (200..300).contains(&self.status) && !self.replayed
    }
}

struct Stage<'a> {
    world: &'a mut World,
    known: HashMap<String, Known>,
    checks: Vec<Check>,
    notes: Vec<Event>,
    journals: Vec<String>,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

pub async fn play(story: Story, backend: Backend, binaries: &Path) -> Played {
    let replicas = story.sandbox.replicas.unwrap_or(1);
    let mut world = match World::start(backend, binaries, &story.sandbox.env, replicas).await {
        Ok(world) => world,
        Err(error) => {
            return Played {
                story,
                backend,
                checks: vec![],
                timeline: vec![],
                error: Some(error),
            };
        }
    };
    let mut stage = Stage {
        world: &mut world,
        known: HashMap::new(),
        checks: vec![],
        notes: vec![],
        journals: vec!["main".into()],
    };
    let mut error = None;
    for step in &story.steps {
        stage.note("story", &step.say);
        let done = if let Some(fault) = &step.fault {
            stage.fault(fault).await
        } else if let Some(agent) = &step.agent {
            stage.agent(agent, step.expect.as_ref()).await
        } else if let Some(process) = &step.agent_process {
            stage.agent_process(process, step.expect.as_ref()).await
        } else if let Some(burst) = &step.burst {
            stage.burst(burst, step.expect.as_ref()).await
        } else if let Some(approve) = &step.approve {
            stage.approve(approve).await
        } else if let Some(poll) = &step.poll {
            stage.poll(poll).await
        } else if let Some(held) = &step.held {
            stage.held(held).await
        } else if let Some(call) = &step.mcp {
            stage.mcp(call, step.expect.as_ref()).await
        } else if step.restart_mcp.is_some() {
            stage.world.kill_mcp().await;
            stage.note("story", "the MCP server is killed (SIGKILL) and started again");
            stage.world.start_mcp().await
        } else if let Some(ms) = step.pause_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(())
        } else if let Some(restart) = &step.restart {
            stage.note("story", "the sandbox is killed (SIGKILL)");
            let wait = Duration::from_millis(restart.wait_ms.unwrap_or(0));
            let restarted = stage.world.restart(&restart.env, wait).await;
            stage.note("story", "the sandbox is started again");
            restarted
        } else {
            Ok(())
        };
        if let Err(e) = done {
            error = Some(format!("step \"{}\": {e}", step.say));
            break;
        }
    }
    if error.is_none()
        && let Err(e) = stage.expectations(&story.expect).await
    {
        error = Some(e);
    }
    let timeline = stage.timeline().await;
    let checks = stage.checks;
    world.finish().await;
    Played {
        story,
        backend,
        checks,
        timeline,
        error,
    }
}

impl Stage<'_> {
    fn note(&mut self, lane: &str, text: &str) {
        self.notes.push(Event {
            at: now(),
            lane: lane.into(),
            text: text.into(),
        });
    }

    fn check(&mut self, what: String, expected: String, got: String, held: bool) {
        self.checks.push(Check {
            what,
            expected,
            got,
            held,
        });
    }

    /// `{intent.id}` in a path or a body: a member of an earlier operation's answer.
    fn fill(&self, value: &Value) -> Value {
        match value {
            Value::String(text) => Value::String(self.fill_text(text)),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.fill(v)).collect()),
            Value::Object(members) => Value::Object(members.iter().map(|(k, v)| (k.clone(), self.fill(v))).collect()),
            other => other.clone(),
        }
    }

    fn fill_text(&self, text: &str) -> String {
        let mut filled = text.to_owned();
        for (name, known) in &self.known {
            if let Value::Object(members) = &known.body {
                for (member, value) in members {
                    if let Some(value) = value.as_str() {
                        filled = filled.replace(&format!("{{{name}.{member}}}"), value);
                    }
                }
            }
        }
        filled
    }

    async fn fault(&mut self, fault: &Fault) -> Result<(), String> {
        if let Some(network) = &fault.network {
            let service = self.world.service(&network.service)?;
            self.world.proxies[service].set_faults(ProxyFaults {
                drop_next_answers: network.drop_next_answers,
                fail_next: network.fail_next,
                delay_ms: network.delay_ms,
            });
            self.note(
                "story",
                &format!(
                    "fault on the network to {service}: drop_next_answers {}, fail_next {}, delay_ms {}",
                    network.drop_next_answers, network.fail_next, network.delay_ms
                ),
            );
        }
        let external = match &fault.external {
            None => (None, None),
            Some(external) if external.system == "payment provider" => (Some(&external.faults), None),
            Some(external) if external.system == "deployment controller" => (None, Some(&external.faults)),
            Some(external) => {
                return Err(format!(
                    "no external system `{}`: payment provider or deployment controller",
                    external.system
                ));
            }
        };
        for (system, url, faults) in [
            (
                "payment provider",
                self.world.provider.clone(),
                fault.provider.as_ref().or(external.0),
            ),
            (
                "deployment controller",
                self.world.controller.clone(),
                fault.controller.as_ref().or(external.1),
            ),
        ] {
            let Some(faults) = faults else { continue };
            let answer = self
                .world
                .http()
                .put(format!("{url}/admin/faults"))
                .json(faults)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !answer.status().is_success() {
                return Err(format!("the {system} refused the faults: {}", answer.status()));
            }
            self.note("story", &format!("fault at the {system}: {faults}"));
        }
        Ok(())
    }

    async fn open_agent(&self, journal: &str, config: AgentConfig) -> Result<Agent, String> {
        Agent::open(&self.world.dir.path().join(format!("{journal}.db")), AGENT_KEY, config)
            .await
            .map_err(|e| e.to_string())
    }

    async fn agent(&mut self, step: &AgentStep, expect: Option<&StepExpect>) -> Result<(), String> {
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
    fn check_outcome(
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
    async fn agent_process(&mut self, step: &AgentProcess, expect: Option<&StepExpect>) -> Result<(), String> {
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

    /// An MCP client calls a tool: to its end, or until the server is killed
    /// or the client goes away, as the step says.
    async fn mcp(&mut self, call: &McpCall, expect: Option<&StepExpect>) -> Result<(), String> {
        use rmcp::{ServiceExt, model::CallToolRequestParams, transport::StreamableHttpClientTransport};

        self.world.start_mcp().await?;
        let arguments = match self.fill(&call.arguments) {
            Value::Object(arguments) => arguments,
            _ => return Err("an MCP call's arguments are an object".into()),
        };
        let intent = arguments
            .get("intent")
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_owned();
        let client =
            ().serve(StreamableHttpClientTransport::from_uri(self.world.mcp_url.as_str()))
                .await
                .map_err(|e| format!("the MCP client could not connect: {e}"))?;
        self.note("agent", &format!("MCP tools/call {} (intent `{intent}`)", call.tool));
        let request = CallToolRequestParams::new(call.tool.clone()).with_arguments(arguments);
        let calling = client.call_tool(request);
        let result = match (call.kill_server_after_ms, call.end_session_after_ms) {
            (Some(ms), _) => {
                tokio::select! {
                    result = calling => Some(result),
                    () = tokio::time::sleep(Duration::from_millis(ms)) => None,
                }
            }
            (None, Some(ms)) => tokio::time::timeout(Duration::from_millis(ms), calling).await.ok(),
            (None, None) => Some(calling.await),
        };
        let interrupted = call.kill_server_after_ms.or(call.end_session_after_ms).is_some();
        if interrupted && result.is_some() {
            // the step's fault never happened: what follows would prove nothing
            self.check(
                format!("the MCP call `{intent}` is still waiting when it is interrupted"),
                "no answer yet".into(),
                "it had been answered".into(),
                false,
            );
        }
        let Some(result) = result else {
            if call.kill_server_after_ms.is_some() {
                self.world.kill_mcp().await;
                self.note("story", "the MCP server is killed (SIGKILL) while the call waits");
            } else {
                drop(client);
                self.note("agent", "the MCP session ends in the middle of the call");
            }
            return Ok(());
        };
        drop(client);
        let result = result.map_err(|e| format!("tools/call {}: {e}", call.tool))?;
        let is_error = result.is_error == Some(true);
        let answer = match (&result.structured_content, is_error) {
            (Some(structured), false) => structured.clone(),
            _ => result
                .content
                .iter()
                .find_map(|c| c.as_text().and_then(|t| serde_json::from_str(&t.text).ok()))
                .unwrap_or(Value::Null),
        };
        let outcome = if is_error {
            "tool_error"
        } else {
            answer["outcome"].as_str().unwrap_or("-")
        };
        self.note(
            "agent",
            &format!(
                "MCP answer: {outcome}{}",
                answer["next_step"]
                    .as_str()
                    .map(|s| format!(" · next: {s}"))
                    .unwrap_or_default()
            ),
        );
        let key = answer["idempotency_key"].as_str().map(str::to_owned);
        if let Some(key) = &key {
            self.known.insert(
                intent.clone(),
                Known {
                    key: key.clone(),
                    operation_id: answer["operation_id"].as_str().map(str::to_owned),
                    body: answer["resource"].clone(),
                },
            );
        }
        let code = if is_error {
            answer["code"].as_str()
        } else {
            answer["resource"]["code"].as_str()
        };
        self.check_outcome(&intent, expect, outcome, code, key.as_deref());
        Ok(())
    }

    /// Many copies of one request with one key, at once: the key of the
    /// agent operation the burst names, made now if the agent has none yet.
    async fn burst(&mut self, burst: &Burst, expect: Option<&StepExpect>) -> Result<(), String> {
        let service = self.world.service(&burst.service)?;
        let url = format!("{}{}", self.world.services[service], self.fill_text(&burst.path));
        let body = self.fill(&burst.body);
        let key = match self.known.get(&burst.operation) {
            Some(known) => known.key.clone(),
            None => uuid::Uuid::new_v4().to_string(),
        };
        let http = self.world.http().clone();
        let answers = join_all((0..burst.copies).map(|_| {
            let (http, url, body, key) = (http.clone(), url.clone(), body.clone(), key.clone());
            async move {
                let response = http
                    .post(&url)
                    .bearer_auth(AGENT_KEY)
                    .header("idempotency-key", key)
                    .json(&body)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let header = |name: &str| {
                    response
                        .headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let replayed = header("idempotent-replayed").is_some_and(|v| v == "true");
                let operation_id = header("operation-id");
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                Ok::<_, String>(Answer {
                    status,
                    replayed,
                    operation_id,
                    body,
                })
            }
        }))
        .await;
        let answers: Vec<Answer> = answers.into_iter().collect::<Result<_, _>>()?;
        let firsts: Vec<&Answer> = answers.iter().filter(|a| a.is_first()).collect();
        let mut statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
        statuses.sort_unstable();
        statuses.dedup();
        self.note(
            "story",
            &format!(
                "{} copies answered: {} first answer, {} replays; statuses {statuses:?}",
                answers.len(),
                firsts.len(),
                answers.iter().filter(|a| a.replayed).count()
            ),
        );
        // what the agent would know of it: the first answer, or any that names the operation
        let known = firsts
            .first()
            .copied()
            .or_else(|| answers.iter().find(|a| a.operation_id.is_some()));
        let earlier = self.known.get(&burst.operation).cloned().unwrap_or_default();
        self.known.insert(
            burst.operation.clone(),
            Known {
                key: key.clone(),
                operation_id: known.and_then(|a| a.operation_id.clone()).or(earlier.operation_id),
                body: known.map_or(earlier.body, |a| a.body.clone()),
            },
        );
        let Some(expect) = expect else { return Ok(()) };
        if let Some(expected) = expect.first_answers {
            self.check(
                format!("copies of `{}` answered as the first", burst.operation),
                expected.to_string(),
                firsts.len().to_string(),
                firsts.len() == expected,
            );
        }
        if let Some(allowed) = &expect.statuses {
            self.check(
                format!("every copy of `{}` is answered with", burst.operation),
                format!("{allowed:?}"),
                format!("{statuses:?}"),
                statuses.iter().all(|s| allowed.contains(s)),
            );
        }
        Ok(())
    }

    /// Asks for an operation's status (or a resource) until the field it
    /// watches is one of `until`; every value seen goes on the timeline.
    /// The last value is checked.
    async fn poll(&mut self, poll: &Poll) -> Result<(), String> {
        let service = self.world.service(&poll.service)?;
        let (watched, path) = match (&poll.operation, &poll.path) {
            (Some(operation), None) => {
                let operation_id = self
                    .known
                    .get(operation)
                    .and_then(|k| k.operation_id.clone())
                    .ok_or_else(|| format!("`{operation}` has no operation id to poll"))?;
                (format!("`{operation}`"), format!("/v1/operations/{operation_id}"))
            }
            (None, Some(path)) => {
                let path = self.fill_text(path);
                (path.clone(), path)
            }
            _ => return Err("a poll names an operation or a path, one of them".into()),
        };
        let field = poll.field.as_deref().unwrap_or("state");
        let url = format!("{}{path}", self.world.services[service]);
        let wanted = |value: &str| poll.until.iter().any(|u| u == value || (u == "*" && value != "-"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(poll.seconds.unwrap_or(30.0));
        let mut seen = String::new();
        let mut value = String::new();
        while tokio::time::Instant::now() < deadline {
            let answer = self.world.get(&url, AGENT_KEY).await?;
            value = match &answer[field] {
                Value::Null => "-".to_owned(),
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            if !seen.ends_with(&value) {
                self.note("agent", &format!("{watched} · polls its {field}: {value}"));
                seen = if seen.is_empty() {
                    value.clone()
                } else {
                    format!("{seen} → {value}")
                };
            }
            if wanted(&value) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.check(
            format!("{watched}'s {field} polled until"),
            poll.until.join(" or "),
            seen,
            wanted(&value),
        );
        Ok(())
    }

    /// Waits until the sandbox holds at the fail point; an error if it never gets there.
    async fn held(&mut self, held: &Held) -> Result<(), String> {
        let wait = Duration::from_secs_f64(held.seconds.unwrap_or(15.0));
        self.world.held_at(&held.fail_point, wait).await?;
        self.note(
            "story",
            &format!("the sandbox holds at the fail point {}", held.fail_point),
        );
        Ok(())
    }

    /// The approver decides on what an earlier operation asked for, with the fingerprint it showed.
    async fn approve(&mut self, approve: &Approve) -> Result<(), String> {
        let service = self.world.service(&approve.service)?;
        let request = self
            .known
            .get(&approve.operation)
            .map(|k| k.body.clone())
            .ok_or_else(|| format!("no earlier operation `{}`", approve.operation))?;
        let approval_id = request["approval_id"]
            .as_str()
            .ok_or_else(|| format!("`{}` asked for no approval", approve.operation))?;
        let answer = self
            .world
            .http()
            .post(format!(
                "{}/v1/approvals/{approval_id}/decision",
                self.world.services[service]
            ))
            .bearer_auth(APPROVER_KEY)
            .json(&json!({"decision": "approve", "fingerprint": request["fingerprint"]}))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !answer.status().is_success() {
            return Err(format!("the approval was refused: {}", answer.status()));
        }
        self.note(
            "approver",
            &format!("approves {approval_id} (fingerprint {})", request["fingerprint"]),
        );
        Ok(())
    }

    /// The story's last word, read from the services' own records.
    async fn expectations(&mut self, expect: &Expectations) -> Result<(), String> {
        // the outbox and the watcher may still be finishing what the story started
        tokio::time::sleep(Duration::from_millis(300)).await;
        if let Some(expected) = expect.tickets {
            let tickets = self
                .world
                .get(
                    &format!("{}/v1/tickets?limit=200", self.world.services["tickets"]),
                    AGENT_KEY,
                )
                .await?;
            let got = tickets["data"].as_array().map_or(0, Vec::len);
            self.check(
                "tickets in the tickets service".into(),
                expected.to_string(),
                got.to_string(),
                got == expected,
            );
        }
        let provider = self.world.provider.clone();
        let controller = self.world.controller.clone();
        for (expected, url, member, what) in [
            (
                expect.provider_charges,
                &provider,
                "charges_made",
                "charges the payment provider really made",
            ),
            (
                expect.provider_refunds,
                &provider,
                "refunds_made",
                "refunds the payment provider really made",
            ),
            (
                expect.controller_rollouts,
                &controller,
                "rollouts_started",
                "rollouts the deployment controller really started",
            ),
            (
                expect.controller_cancels,
                &controller,
                "rollouts_cancelled",
                "rollouts the deployment controller really stopped",
            ),
        ] {
            let Some(expected) = expected else { continue };
            let stats = self.world.get(&format!("{url}/admin/stats"), AGENT_KEY).await?;
            let got = stats[member].as_u64().unwrap_or(0);
            self.check(what.into(), expected.to_string(), got.to_string(), got == expected);
        }
        for count in &expect.count {
            self.count(count).await?;
        }
        if let Some(pending) = &expect.pending_approvals {
            let service = self.world.service(&pending.service)?;
            let approvals = self
                .world
                .get(
                    &format!("{}/v1/approvals?state=pending", self.world.services[service]),
                    APPROVER_KEY,
                )
                .await?;
            let got = approvals["data"].as_array().map_or(0, Vec::len);
            self.check(
                format!("approvals pending at {service}"),
                pending.count.to_string(),
                got.to_string(),
                got == pending.count,
            );
        }
        for spread in &expect.spread {
            let service = self.world.service(&spread.service)?;
            let key = self
                .known
                .get(&spread.operation)
                .map(|k| k.key.clone())
                .ok_or_else(|| format!("no operation `{}`", spread.operation))?;
            let mut reached: Vec<usize> = self.world.proxies[service]
                .passed()
                .iter()
                .filter(|p| p.idempotency_key.as_deref() == Some(key.as_str()))
                .filter_map(|p| p.replica)
                .collect();
            reached.sort_unstable();
            reached.dedup();
            self.check(
                format!("replicas of {service} that `{}`'s requests reached", spread.operation),
                spread.replicas.to_string(),
                reached.len().to_string(),
                reached.len() == spread.replicas,
            );
        }
        for journal in &expect.journal {
            let service = self.world.service(&journal.service)?;
            let operation_id = self
                .known
                .get(&journal.operation)
                .and_then(|k| k.operation_id.clone())
                .ok_or_else(|| format!("`{}` has no operation id", journal.operation))?;
            let entries = self
                .world
                .get(
                    &format!(
                        "{}/v1/audit?operation_id={operation_id}&limit=200",
                        self.world.services[service]
                    ),
                    APPROVER_KEY,
                )
                .await?;
            let events: Vec<String> = entries["data"]
                .as_array()
                .map(|entries| {
                    entries
                        .iter()
                        .filter_map(|e| e["event"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            for event in &journal.includes {
                self.check(
                    format!("{service}'s journal of `{}` records `{event}`", journal.operation),
                    "present".into(),
                    events.join(", "),
                    events.contains(event),
                );
            }
            for event in &journal.excludes {
                self.check(
                    format!("{service}'s journal of `{}` has no `{event}`", journal.operation),
                    "absent".into(),
                    events.join(", "),
                    !events.contains(event),
                );
            }
        }
        Ok(())
    }

    /// Counts a list's items that match, as the API shows them.
    async fn count(&mut self, count: &CountExpect) -> Result<(), String> {
        let service = self.world.service(&count.service)?;
        let url = format!("{}{}", self.world.services[service], self.fill_text(&count.path));
        let bearer = if count.as_approver { APPROVER_KEY } else { AGENT_KEY };
        let list = self.world.get(&url, bearer).await?;
        let items = list["data"]
            .as_array()
            .ok_or_else(|| format!("GET {url}: no `data` list in {list}"))?;
        let got = items
            .iter()
            .filter(|item| {
                count
                    .matching
                    .iter()
                    .all(|(member, value)| item[member.as_str()] == value.as_str())
            })
            .count();
        self.check(
            count.what.clone(),
            count.count.to_string(),
            got.to_string(),
            got == count.count,
        );
        Ok(())
    }

    /// Every party's record, merged in time order: the story, the agents,
    /// the network, each service's audit journal, the provider, the controller.
    async fn timeline(&mut self) -> Vec<Event> {
        let mut events = std::mem::take(&mut self.notes);
        for journal in self.journals.clone() {
            if let Ok(agent) = self.open_agent(&journal, AgentConfig::default()).await {
                for attempt in agent.journal().attempts(None).await.unwrap_or_default() {
                    let status = attempt.status.map(|s| format!(" {s}")).unwrap_or_default();
                    events.push(Event {
                        at: attempt.at,
                        lane: if journal == "main" {
                            "agent".into()
                        } else {
                            format!("agent ({journal})")
                        },
                        text: format!("{} · {}{status} · {}", attempt.name, attempt.action, attempt.note),
                    });
                }
                agent.journal().close().await;
            }
        }
        for call in self.world.mcp_calls().await {
            let text = |member: &str| call[member].as_str().unwrap_or("-").to_owned();
            events.push(Event {
                at: text("at"),
                lane: "mcp server".into(),
                text: format!(
                    "{} · intent {} · {} · key {} · {}",
                    text("tool"),
                    text("intent"),
                    text("outcome"),
                    text("idempotency_key"),
                    text("operation_id")
                ),
            });
        }
        for service in SERVICES {
            for passed in self.world.proxies[service].passed() {
                events.push(Event {
                    at: passed.at,
                    lane: format!("network → {service}"),
                    text: format!(
                        "{} {} key {} · {}{}",
                        passed.method,
                        passed.path,
                        passed.idempotency_key.as_deref().unwrap_or("-"),
                        passed.fate,
                        passed.status.map(|s| format!(" ({s})")).unwrap_or_default()
                    ),
                });
            }
            let url = format!("{}/v1/audit?limit=200", self.world.services[service]);
            if let Ok(entries) = self.world.get(&url, APPROVER_KEY).await {
                for entry in entries["data"].as_array().into_iter().flatten() {
                    events.push(Event {
                        at: entry["at"].as_str().unwrap_or_default().to_owned(),
                        lane: service.into(),
                        text: format!(
                            "{} · {} · key {} · by {}{}",
                            entry["event"].as_str().unwrap_or("-"),
                            entry["operation_id"].as_str().unwrap_or("-"),
                            entry["idempotency_key"].as_str().unwrap_or("-"),
                            entry["principal_id"].as_str().unwrap_or("-"),
                            entry["external_ref"]
                                .as_str()
                                .map(|r| format!(" · {r}"))
                                .unwrap_or_default()
                        ),
                    });
                }
            }
        }
        for (lane, url) in [
            ("payment provider", self.world.provider.clone()),
            ("deployment controller", self.world.controller.clone()),
        ] {
            if let Ok(list) = self.world.get(&format!("{url}/admin/events"), AGENT_KEY).await {
                for event in list.as_array().into_iter().flatten() {
                    events.push(Event {
                        at: event["at"].as_str().unwrap_or_default().to_owned(),
                        lane: lane.into(),
                        text: format!(
                            "{}{}",
                            event["what"].as_str().unwrap_or("-"),
                            event["key"].as_str().map(|k| format!(" · key {k}")).unwrap_or_default()
                        ),
                    });
                }
            }
        }
        events.sort_by(|a, b| a.at.cmp(&b.at));
        events
    }
}

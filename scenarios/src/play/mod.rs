//! Playing a story: each step in a fresh world, each expectation checked
//! against the services' own records, and every party's record of what
//! happened gathered into one timeline.

mod agent;
mod burst;
mod expect;
mod fault;
mod mcp;
mod timeline;
mod wait;

use std::{collections::HashMap, path::Path, time::Duration};

use serde_json::Value;

use crate::{
    story::Story,
    world::{Backend, World},
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
    /// Why it was not played at all: it needs what this run does not have
    /// (a standby on SQLite). Not a failure.
    pub skipped: Option<String>,
}

impl Played {
    /// Played to the end, and every check held; a story that checked nothing
    /// proves nothing. A skipped story failed nothing.
    pub fn passed(&self) -> bool {
        self.skipped.is_some()
            || (self.error.is_none() && !self.checks.is_empty() && self.checks.iter().all(|c| c.held))
    }

    /// In one word, as the runner and the report say it.
    pub fn verdict(&self) -> &'static str {
        match (self.skipped.is_some(), self.passed()) {
            (true, _) => "skipped",
            (false, true) => "passed",
            (false, false) => "FAILED",
        }
    }
}

/// Why `story` cannot be played on `backend` here, if it cannot: a standby
/// is a PostgreSQL server's, made from PostgreSQL's programs. Under CI,
/// programs that are missing are a failure, not a reason to skip.
fn cannot_play(story: &Story, backend: Backend) -> Result<Option<String>, String> {
    if story.sandbox.standby.is_none() {
        return Ok(None);
    }
    if backend == Backend::Sqlite {
        return Ok(Some(
            "a standby is a PostgreSQL server's: this story plays on --backend postgres".into(),
        ));
    }
    match crate::standby::programs_missing() {
        Some(missing) if std::env::var("CI").is_ok_and(|v| v == "true") => Err(missing),
        Some(missing) => Ok(Some(format!("{missing}: the standby cannot be made"))),
        None => Ok(None),
    }
}

/// What an agent operation came to, kept for later steps and checks.
#[derive(Debug, Clone, Default)]
struct Known {
    key: String,
    operation_id: Option<String>,
    body: Value,
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
    let unplayed = |story, error, skipped| Played {
        story,
        backend,
        checks: vec![],
        timeline: vec![],
        error,
        skipped,
    };
    match cannot_play(&story, backend) {
        Ok(None) => {}
        Ok(Some(why)) => return unplayed(story, None, Some(why)),
        Err(error) => return unplayed(story, Some(error), None),
    }
    let replicas = story.sandbox.replicas.unwrap_or(1);
    let started = World::start(backend, binaries, &story.sandbox.env, replicas, story.sandbox.standby).await;
    let mut world = match started {
        Ok(world) => world,
        Err(error) => return unplayed(story, Some(error), None),
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
        skipped: None,
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
}

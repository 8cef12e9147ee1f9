//! One run of one operation by the retry rule (see the crate's map): send
//! with the key, read the answer, ask after a lost one, wait, follow the
//! status of work that goes on, and record what it came to.

use std::time::Duration;

use serde_json::Value;

use crate::{Agent, AgentError, Method, Outcome, Report, Request};

/// What one answer means for the run.
enum Next {
    /// Known: record it and report it.
    Done(Outcome, String),
    /// Not done yet, and a later send with the same key is safe: wait this long.
    SendAgain(Duration, String),
    /// Its work goes on after the answer (or its outcome is unknown): follow its status.
    Follow(Outcome, String),
}

/// One run of one operation.
pub(crate) struct Run<'a> {
    agent: &'a Agent,
    name: &'a str,
    key: &'a str,
    request: &'a Request,
    sends: u32,
    /// Whether the service answered anything: a send or a status question.
    answered: bool,
    pause: Duration,
    /// The last answer: status, body, operation id.
    last: Option<(u16, Value, Option<String>)>,
}

impl<'a> Run<'a> {
    pub(crate) fn new(agent: &'a Agent, name: &'a str, key: &'a str, request: &'a Request) -> Run<'a> {
        Run {
            agent,
            name,
            key,
            request,
            sends: 0,
            answered: false,
            pause: agent.config.backoff,
            last: None,
        }
    }

    pub(crate) async fn go(&mut self) -> Result<Report, AgentError> {
        let journal = &self.agent.journal;
        loop {
            if self.sends == self.agent.config.max_sends {
                let outcome = self.where_it_stands().await;
                return self
                    .report(outcome, "gave up sending: every send this run allowed was made")
                    .await;
            }
            self.sends += 1;
            let next = match self.send().await {
                Ok((status, replayed, retry_after, body, operation_id)) => {
                    self.answered = true;
                    journal
                        .record_attempt(self.name, "send", Some(status), &describe(status, replayed, &body))
                        .await?;
                    self.last = Some((status, body.clone(), operation_id));
                    read_answer(status, replayed, retry_after, &body)
                }
                Err(lost) => {
                    journal.record_attempt(self.name, "send", None, &lost).await?;
                    self.after_a_lost_answer(&lost).await?
                }
            };
            match next {
                Next::Done(outcome, note) => return self.report(outcome, &note).await,
                Next::Follow(outcome, note) => return self.follow(outcome, &note).await,
                Next::SendAgain(wait, why) => {
                    let wait = wait.max(self.backoff());
                    journal
                        .record_attempt(
                            self.name,
                            "wait",
                            None,
                            &format!("{why}; waiting {} ms", wait.as_millis()),
                        )
                        .await?;
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// One send of the operation's request, with its key.
    async fn send(&self) -> Result<(u16, bool, Option<u64>, Value, Option<String>), String> {
        let method = match self.request.method {
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
        };
        let mut request = self
            .agent
            .http
            .request(method, self.request.target())
            .bearer_auth(&self.agent.token)
            .header("idempotency-key", self.key)
            .json(&self.request.body);
        if self.agent.config.prefer_wait_seconds > 0 {
            request = request.header("prefer", format!("wait={}", self.agent.config.prefer_wait_seconds));
        }
        let response = request.send().await.map_err(|e| describe_lost(&e))?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let replayed = header("idempotent-replayed").as_deref() == Some("true");
        let retry_after = header("retry-after").and_then(|v| v.parse().ok());
        let operation_id = header("operation-id");
        // an answer whose body never arrives is as lost as one that never came
        let body = response.bytes().await.map_err(|e| describe_lost(&e))?;
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Ok((status, replayed, retry_after, body, operation_id))
    }

    /// The answer was lost: ask the service what became of the key before
    /// anything else.
    async fn after_a_lost_answer(&mut self, lost: &str) -> Result<Next, AgentError> {
        let status = self.agent.status_by_key(&self.request.base_url, self.key).await;
        self.answered |= status.is_ok();
        let (note, next) = match status {
            Err(e) => (
                format!("could not ask: {e}"),
                Next::SendAgain(Duration::ZERO, format!("{lost}; the service could not be asked either")),
            ),
            Ok(None) => (
                "the key was never claimed: sending it again is safe".to_owned(),
                Next::SendAgain(Duration::ZERO, format!("{lost}; nothing was claimed")),
            ),
            Ok(Some(operation)) => {
                let note = format!("{} is {}", operation.operation_id, operation.state);
                let next = match operation.state.as_str() {
                    // its work goes on, or nobody knows: follow it, never send again
                    "unknown" => Next::Follow(Outcome::Unknown, format!("{lost}; the operation's outcome is unknown")),
                    // the stored answer is there to be replayed by the same key
                    "completed" | "failed" | "rejected" | "awaiting_approval" => {
                        Next::SendAgain(Duration::ZERO, format!("{lost}; the answer is stored"))
                    }
                    _ => Next::SendAgain(Duration::ZERO, format!("{lost}; it is still running")),
                };
                self.last = self
                    .last
                    .take()
                    .or(Some((0, Value::Null, Some(operation.operation_id))));
                (note, next)
            }
        };
        self.agent.journal.record_attempt(self.name, "ask", None, &note).await?;
        Ok(next)
    }

    /// Polls the operation's status until it is known (or `follow_for` runs
    /// out), and reports it: accepted work that completes is `created`.
    async fn follow(&mut self, outcome: Outcome, note: &str) -> Result<Report, AgentError> {
        let deadline = tokio::time::Instant::now() + self.agent.config.follow_for;
        let mut outcome = outcome;
        let mut note = note.to_owned();
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(self.backoff()).await;
            let Ok(Some(operation)) = self.agent.status_by_key(&self.request.base_url, self.key).await else {
                continue;
            };
            self.answered = true;
            self.agent
                .journal
                .record_attempt(
                    self.name,
                    "ask",
                    None,
                    &format!("{} is {}", operation.operation_id, operation.state),
                )
                .await?;
            match operation.state.as_str() {
                "completed" => {
                    outcome = if outcome == Outcome::Unknown {
                        Outcome::Created
                    } else {
                        outcome
                    };
                    note = format!(
                        "its work ended: completed ({})",
                        operation.external_ref.as_deref().unwrap_or("-")
                    );
                    break;
                }
                "failed" | "rejected" => {
                    outcome = Outcome::Failed;
                    note = format!("its work ended: {}", operation.state);
                    break;
                }
                "unknown" => outcome = Outcome::Unknown,
                _ => {}
            }
        }
        self.report(outcome, &note).await
    }

    /// Where the operation stands when the agent stops sending.
    async fn where_it_stands(&mut self) -> Outcome {
        let status = self.agent.status_by_key(&self.request.base_url, self.key).await;
        self.answered |= status.is_ok();
        match status {
            Ok(Some(operation)) if operation.state == "unknown" => Outcome::Unknown,
            Ok(Some(operation)) if operation.state == "awaiting_approval" => Outcome::AwaitingApproval,
            _ => Outcome::InProgress,
        }
    }

    /// Doubles the pause each time, with jitter: between attempts, never instead of state.
    fn backoff(&mut self) -> Duration {
        let pause = self.pause.mul_f64(0.5 + fastrand::f64() / 2.0);
        self.pause = (self.pause * 2).min(self.agent.config.max_backoff);
        pause
    }

    async fn report(&mut self, outcome: Outcome, note: &str) -> Result<Report, AgentError> {
        let (status, body, operation_id) = match self.last.take() {
            Some((status, body, operation_id)) => (Some(status).filter(|s| *s > 0), Some(body), operation_id),
            None => (None, None, None),
        };
        let operation_id = operation_id.or_else(|| {
            body.as_ref()
                .and_then(|b| b["operation_id"].as_str().map(str::to_owned))
        });
        let stored_body = body.as_ref().map(Value::to_string);
        self.agent
            .journal
            .record_state(
                self.name,
                outcome,
                operation_id.as_deref(),
                status.zip(stored_body.as_deref()),
            )
            .await?;
        Ok(Report {
            name: self.name.to_owned(),
            outcome,
            idempotency_key: self.key.to_owned(),
            operation_id,
            status,
            body,
            sends: self.sends,
            answered: self.answered,
            note: note.to_owned(),
        })
    }
}

/// What an answer means (docs/contract.md §3, §9).
fn read_answer(status: u16, replayed: bool, retry_after: Option<u64>, body: &Value) -> Next {
    let code = body["code"].as_str().unwrap_or("");
    match status {
        202 if body["state"] == "awaiting_approval" => Next::Done(
            Outcome::AwaitingApproval,
            format!(
                "a human must approve {} first",
                body["approval_id"].as_str().unwrap_or("the request")
            ),
        ),
        // work that goes on after the answer: its status shows how it ends
        202 => Next::Follow(
            if replayed { Outcome::Replayed } else { Outcome::Created },
            "accepted: its work goes on".into(),
        ),
        200..=299 if body["outcome"] == "matched_existing" => {
            Next::Done(Outcome::MatchedExisting, "the service found it done already".into())
        }
        200..=299 if replayed => Next::Done(Outcome::Replayed, "the first answer, replayed".into()),
        // a PUT that declared the state it was already in
        200..=299 if body["changed"] == false => Next::Done(Outcome::MatchedExisting, "it was so already".into()),
        200..=299 => Next::Done(Outcome::Created, "done".into()),
        409 if code == "request_in_progress" => Next::SendAgain(
            Duration::from_secs(retry_after.unwrap_or(1)),
            "an earlier attempt is still running".into(),
        ),
        409 if code == "operation_outcome_unknown" => {
            Next::Follow(Outcome::Unknown, "its outcome is unknown: never sent again".into())
        }
        422 if code == "idempotency_key_reused" => Next::Done(
            Outcome::Conflict,
            "the key names another request: stop, a new intention needs a new name".into(),
        ),
        // a problem that asks to be retried later stores nothing against the key
        400..=499 if retry_after.is_some() => Next::SendAgain(
            Duration::from_secs(retry_after.unwrap_or(1)),
            format!("{status} {code}: asked to try again later"),
        ),
        400..=499 => Next::Done(
            Outcome::Failed,
            format!("{status} {code}: a known failure, not retried"),
        ),
        // a server error committed nothing: the same key runs it again
        _ => Next::SendAgain(Duration::ZERO, format!("{status}: a server error, nothing committed")),
    }
}

fn describe(status: u16, replayed: bool, body: &Value) -> String {
    let code = body["code"].as_str().map(|c| format!(" {c}")).unwrap_or_default();
    let replayed = if replayed { " (replayed)" } else { "" };
    format!("{status}{code}{replayed}")
}

fn describe_lost(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        "no answer in time".into()
    } else if error.is_connect() {
        "could not connect".into()
    } else {
        format!("the connection failed: {error}")
    }
}

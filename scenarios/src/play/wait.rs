//! Steps that wait on the services: a poll until a field settles, a hold
//! at a fail point, and the approver's decision.

use std::time::Duration;

use serde_json::{Value, json};

use super::{AGENT_KEY, APPROVER_KEY, Stage};
use crate::story::{Approve, Held, Poll};

impl Stage<'_> {
    /// Asks for an operation's status (or a resource) until the field it
    /// watches is one of `until`; every value seen goes on the timeline.
    /// The last value is checked.
    pub(super) async fn poll(&mut self, poll: &Poll) -> Result<(), String> {
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
    pub(super) async fn held(&mut self, held: &Held) -> Result<(), String> {
        let wait = Duration::from_secs_f64(held.seconds.unwrap_or(15.0));
        self.world.held_at(&held.fail_point, wait).await?;
        self.note(
            "story",
            &format!("the sandbox holds at the fail point {}", held.fail_point),
        );
        Ok(())
    }

    /// The approver decides on what an earlier operation asked for, with the fingerprint it showed.
    pub(super) async fn approve(&mut self, approve: &Approve) -> Result<(), String> {
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
}

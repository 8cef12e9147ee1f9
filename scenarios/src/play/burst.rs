//! A burst: many copies of one request with one key, sent at once.

use futures::future::join_all;
use serde_json::Value;

use super::{AGENT_KEY, Known, Stage};
use crate::story::{Burst, StepExpect};

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

impl Stage<'_> {
    /// Many copies of one request with one key, at once: the key of the
    /// agent operation the burst names, made now if the agent has none yet.
    pub(super) async fn burst(&mut self, burst: &Burst, expect: Option<&StepExpect>) -> Result<(), String> {
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
}

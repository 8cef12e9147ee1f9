//! The services' API as the console calls it — one page of a list, one
//! posted action — with the signed-in person's key, and what a service
//! refused, in words a person can act on.

use serde_json::Value;

use super::{Console, PAGE_SIZE, ServiceLink, session::Session, url_encoded};

/// One page of a service's approvals.
pub(super) struct ApprovalPage {
    pub(super) data: Vec<Value>,
    pub(super) next_cursor: Option<String>,
    /// In the state asked for, on every page.
    pub(super) total: i64,
}

/// One page of a service's operations that need a person.
pub(super) struct OperationPage {
    pub(super) data: Vec<Value>,
    pub(super) next_cursor: Option<String>,
}

impl Console {
    /// POSTs `body` to `path` of `service` with the session's key: done, or
    /// what went wrong as `words` put it.
    pub(super) async fn act(
        &self,
        service: &ServiceLink,
        session: &Session,
        path: &str,
        body: &Value,
        words: fn(&str, u16, &Value) -> String,
    ) -> Result<(), String> {
        let sent = self
            .http
            .post(format!("{}{path}", service.url))
            .bearer_auth(session.key.expose())
            .json(body)
            .send()
            .await;
        match sent {
            Ok(answer) if answer.status().is_success() => Ok(()),
            Ok(answer) => {
                let status = answer.status().as_u16();
                let problem: Value = answer.json().await.unwrap_or_default();
                Err(words(&service.name, status, &problem))
            }
            Err(e) => Err(unreachable_service(service, &e)),
        }
    }

    /// Whether some service takes this key as an approver's or an admin's
    /// (both may read approvals), or what each one said. Each service keeps
    /// its own keys — `create-api-key` stores one in one service's database
    /// — so one that takes it is enough: the page then shows what the others
    /// say, and every action is still each service's to allow.
    pub(super) async fn verify(&self, key: &str) -> Result<(), Vec<String>> {
        let mut refusals = Vec::new();
        for service in &self.config.services {
            match self.approvals(service, key, Some("pending"), None, 1).await {
                Ok(_) => return Ok(()),
                Err(failure) => refusals.push(failure.into_words()),
            }
        }
        if refusals.is_empty() {
            refusals.push("This console knows no service to check the key with.".to_owned());
        }
        Err(refusals)
    }

    /// One page of the account's approvals in a service (`state`: all when `None`).
    pub(super) async fn approvals(
        &self,
        service: &ServiceLink,
        key: &str,
        state: Option<&str>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ApprovalPage, Failure> {
        let mut query = format!("/v1/approvals?limit={limit}");
        if let Some(state) = state {
            query.push_str(&format!("&state={state}"));
        }
        let body = self.list(service, key, &query, cursor).await?;
        Ok(ApprovalPage {
            data: body["data"].as_array().cloned().unwrap_or_default(),
            next_cursor: body["next_cursor"].as_str().map(str::to_owned),
            total: body["total"].as_i64().unwrap_or(0),
        })
    }

    /// One page of the account's operations in a service that need a person
    /// (`need`: `state=unknown` or `outbox=dead`).
    pub(super) async fn operations(
        &self,
        service: &ServiceLink,
        key: &str,
        need: &str,
        cursor: Option<&str>,
    ) -> Result<OperationPage, Failure> {
        let query = format!("/v1/operations?{need}&limit={PAGE_SIZE}");
        let body = self.list(service, key, &query, cursor).await?;
        Ok(OperationPage {
            data: body["data"].as_array().cloned().unwrap_or_default(),
            next_cursor: body["next_cursor"].as_str().map(str::to_owned),
        })
    }

    /// GETs one page of a list (`query`: its path and parameters) with `key`.
    async fn list(
        &self,
        service: &ServiceLink,
        key: &str,
        query: &str,
        cursor: Option<&str>,
    ) -> Result<Value, Failure> {
        let mut url = format!("{}{query}", service.url);
        if let Some(cursor) = cursor.filter(|c| !c.is_empty()) {
            url.push_str(&format!("&cursor={}", url_encoded(cursor)));
        }
        let answer = self
            .http
            .get(&url)
            .bearer_auth(key)
            .send()
            .await
            .map_err(|e| Failure::Unreachable(unreachable_service(service, &e)))?;
        let status = answer.status().as_u16();
        let body: Value = answer.json().await.unwrap_or_default();
        if status != 200 {
            return Err(Failure::Refused(in_words(&service.name, status, &body)));
        }
        Ok(body)
    }
}

/// Why a service gave no list, in words for the page.
pub(super) enum Failure {
    Unreachable(String),
    Refused(String),
}

impl Failure {
    pub(super) fn into_words(self) -> String {
        match self {
            Failure::Unreachable(words) | Failure::Refused(words) => words,
        }
    }
}

/// What went wrong, as a person would want to be told.
pub(super) fn in_words(service: &str, status: u16, problem: &Value) -> String {
    let detail = problem["detail"].as_str().unwrap_or("");
    match problem["code"].as_str().unwrap_or("") {
        "unauthenticated" => format!("{service} did not accept this API key. Use another key."),
        "forbidden" => format!(
            "{service} does not let this key decide: only an approver may, and never on an operation they requested themselves."
        ),
        "approval_fingerprint_mismatch" => format!(
            "{service} refused the decision: the request waiting is not the one this page showed you. Reload the page and look again before deciding."
        ),
        "invalid_state" => format!("Someone already decided on this approval in {service}: {detail}."),
        "approval_expired" => format!(
            "This approval in {service} expired before anyone decided; the operation will not run. The agent has to send a new request."
        ),
        "not_found" => format!("{service} has no such approval in this account."),
        _ if detail.is_empty() => format!("{service} answered with status {status}."),
        _ => format!("{service} answered with status {status}: {detail}"),
    }
}

/// A refused resolution or redelivery, as a person would want to be told;
/// what it shares with a refused decision is said as [`in_words`] says it.
pub(super) fn settling_in_words(service: &str, status: u16, problem: &Value) -> String {
    let detail = problem["detail"].as_str().unwrap_or("");
    match problem["code"].as_str().unwrap_or("") {
        "forbidden" => format!("{service} does not let this key do that: {detail}."),
        "invalid_state" => format!(
            "{service} refused: {detail}. Someone may have settled it or sent it again meanwhile; the lists below are as they are now."
        ),
        "invalid_request" => format!(
            "{service} refused the form: {}.",
            field_problems(problem).unwrap_or_else(|| detail.to_owned())
        ),
        "not_found" => format!("{service} has no such operation in this account."),
        "external_ref_mismatch" => format!(
            "{service} refused: the external system does not hold {} as this operation's work. Check that the reference is this operation's, not another's. Nothing changed; the attempt is in the journal.",
            problem["external_ref"].as_str().unwrap_or("that reference")
        ),
        "external_outcome_exists" => format!("{service} did not settle it as failed: {detail}."),
        "external_system_unavailable" => format!(
            "{service} could not ask the external system whether that is so, and writes nothing it cannot check. Nothing changed; try again in a few seconds."
        ),
        _ => in_words(service, status, problem),
    }
}

/// A problem's `errors[]` as "field message; …", if it names any.
fn field_problems(problem: &Value) -> Option<String> {
    let errors = problem["errors"].as_array().filter(|e| !e.is_empty())?;
    let each: Vec<String> = errors
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["field"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            )
        })
        .collect();
    Some(each.join("; "))
}

fn unreachable_service(service: &ServiceLink, error: &reqwest::Error) -> String {
    let why = if error.is_timeout() {
        "it did not answer in time"
    } else {
        "it did not answer"
    };
    format!(
        "Could not reach {} at {}: {why}. Is it running?",
        service.name, service.url
    )
}

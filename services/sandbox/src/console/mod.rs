//! The approval console (docs/contract.md §6): a web page where a human sees
//! the pending approvals of every running service — what each would do, to
//! what, with which fingerprint, who asked and until when — and approves or
//! rejects them, page by page, with the counts of what waits. Every approval is
//! listed too, with who decided and when. It also lists what the outbox could
//! not settle by itself — operations whose outcome is unknown, deliveries that
//! are dead — for an admin to settle with evidence or send again.
//!
//! The console is just another client of the public API: it has no database,
//! and acts with the signed-in approver's or admin's own API key. The key
//! stays on the server: signing in verifies it with the services and opens a
//! session ([`session`]); the browser holds only the session's opaque id, in
//! an HttpOnly, SameSite=Strict cookie. Pages are rendered on the server with
//! plain HTML forms and one stylesheet of its own: no script, nothing from a
//! CDN, so it works with no network and its Content-Security-Policy can
//! forbid everything else — framing included.

mod session;

use std::time::Duration;

use axum::{
    Form, Router,
    extract::{Query, State},
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    middleware,
    response::{Html, IntoResponse, Redirect, Response},
    routing::{get, post},
};
use idempotency::approval::Revealed;
use platform::{auth::ApiKey, service::escape};
use serde::Deserialize;
use serde_json::Value;

pub use session::SessionLimits;
use session::{Session, Sessions};

/// The sandbox's console port (docs/contract.md §12).
pub const DEFAULT_PORT: u16 = 7000;

/// How many approvals, or operations, one page lists.
pub const PAGE_SIZE: usize = 20;

const SESSION_COOKIE: &str = "retrysafe_console_session";

/// A service whose approvals the console shows.
#[derive(Debug, Clone)]
pub struct ServiceLink {
    pub name: String,
    /// e.g. `http://127.0.0.1:7001`
    pub url: String,
}

#[derive(Debug, Clone, Default)]
pub struct ConsoleConfig {
    pub services: Vec<ServiceLink>,
    /// Pre-filled in the sign-in form (the sandbox's demo approver); never sent anywhere by itself.
    pub suggested_key: Option<String>,
    pub session: SessionLimits,
}

#[derive(Clone)]
struct Console {
    config: ConsoleConfig,
    http: reqwest::Client,
    sessions: Sessions,
}

pub fn router(config: ConsoleConfig) -> Router {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default();
    let sessions = Sessions::new(config.session);
    Router::new()
        .route("/", get(page))
        .route("/key", post(sign_in))
        .route("/forget", post(sign_out))
        .route("/decide", post(decide))
        .route("/resolve", post(resolve))
        .route("/redeliver", post(redeliver))
        .route("/console.css", get(stylesheet))
        .route("/healthz", get(|| async { "ok" }))
        .fallback(not_found)
        .with_state(Console { config, http, sessions })
        .layer(middleware::map_response(protect))
}

/// Serves the console, its connections held to `limits`, until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: ConsoleConfig,
    limits: platform::config::ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing::info!(addr = %listener.local_addr()?, "approval console listening");
    Ok(platform::serve(listener, router(config), limits, shutdown).await?)
}

/// On every answer, pages, redirects and errors alike: no other page may
/// frame the console (a framed page can be clicked through unseen), nothing
/// but its own stylesheet and forms may run or load, and nothing it shows is
/// kept in a cache.
async fn protect(mut response: Response) -> Response {
    const HEADERS: [(HeaderName, &str); 5] = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    for (name, value) in HEADERS {
        response.headers_mut().insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Html(layout(&error_box("There is no such page in the console."), false)),
    )
        .into_response()
}

async fn stylesheet() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// Which page of which service to show, and what just happened.
#[derive(Debug, Default, Deserialize)]
struct PageQuery {
    service: Option<String>,
    /// The pending list's page.
    cursor: Option<String>,
    /// The list of every approval's page.
    history: Option<String>,
    /// The page of operations whose outcome is unknown.
    unknown: Option<String>,
    /// The page of operations whose delivery is dead.
    dead: Option<String>,
    done: Option<String>,
    approval: Option<String>,
    operation: Option<String>,
}

impl PageQuery {
    /// The first page of everything in `service`.
    fn of(service: &str) -> Self {
        PageQuery {
            service: Some(service.to_owned()),
            ..PageQuery::default()
        }
    }
}

async fn page(State(console): State<Console>, headers: HeaderMap, Query(query): Query<PageQuery>) -> Html<String> {
    let Some(session) = console.session(&headers) else {
        return Html(layout(&sign_in_form(console.config.suggested_key.as_deref()), false));
    };
    let notice = console.notice(&query);
    Html(console.render(&session, &query, notice.as_deref(), None).await)
}

#[derive(Debug, Deserialize)]
struct SignInForm {
    key: String,
}

/// Verifies the key with the services and opens a session for it; the key
/// itself never goes back to the browser.
async fn sign_in(State(console): State<Console>, headers: HeaderMap, Form(form): Form<SignInForm>) -> Response {
    if let Some(refused) = refuse_cross_origin(&headers) {
        return refused;
    }
    let key = form.key.trim();
    let try_again = |problems: &[String]| {
        let boxes: String = problems.iter().map(|problem| error_box(problem)).collect();
        Html(layout(&format!("{boxes}{}", sign_in_form(None)), false)).into_response()
    };
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return try_again(&["An API key is one word of letters, digits, - and _, like demo-acme-approver.".to_owned()]);
    }
    if let Err(problems) = console.verify(key).await {
        return try_again(&problems);
    }
    let id = console.sessions.start(ApiKey::new(key));
    let cookie = format!(
        "{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        console.sessions.limits().absolute.as_secs()
    );
    with_cookie(Redirect::to("/").into_response(), &cookie)
}

async fn sign_out(State(console): State<Console>, headers: HeaderMap) -> Response {
    if let Some(refused) = refuse_cross_origin(&headers) {
        return refused;
    }
    if let Some(id) = session_id(&headers) {
        console.sessions.end(&id);
    }
    let cookie = format!("{SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    with_cookie(Redirect::to("/").into_response(), &cookie)
}

#[derive(Debug, Deserialize)]
struct DecideForm {
    service: String,
    approval_id: String,
    fingerprint: String,
    decision: String,
    /// The session's form token: the form was one this console rendered for this session.
    #[serde(default)]
    form_token: String,
}

async fn decide(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(form): Form<DecideForm>,
) -> Result<Response, TurnedAway> {
    let session = console.form_session(&headers, &form.form_token)?;
    if !is_approval_id(&form.approval_id) {
        let problem = "That is not an approval id (apr_ and 32 hex digits); reload the page.";
        return Ok(console
            .with_problem(&session, &PageQuery::of(&form.service), problem)
            .await);
    }
    let service = console.service_for(&session, &form.service).await?;
    let decision = if form.decision == "approve" {
        "approve"
    } else {
        "reject"
    };
    let path = format!("/v1/approvals/{}/decision", form.approval_id);
    let body = serde_json::json!({"decision": decision, "fingerprint": form.fingerprint});
    Ok(match console.act(service, &session, &path, &body, in_words).await {
        Ok(()) => {
            let done = if decision == "approve" { "approved" } else { "rejected" };
            let target = format!(
                "/?done={done}&approval={}&service={}",
                url_encoded(&form.approval_id),
                url_encoded(&service.name),
            );
            Redirect::to(&target).into_response()
        }
        Err(problem) => {
            console
                .with_problem(&session, &PageQuery::of(&service.name), &problem)
                .await
        }
    })
}

/// How a person found an operation whose outcome is unknown ended at the external system.
#[derive(Debug, Deserialize)]
struct ResolveForm {
    service: String,
    operation_id: String,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    evidence: String,
    #[serde(default)]
    external_ref: String,
    #[serde(default)]
    form_token: String,
}

/// Settles an operation whose outcome is unknown with the service's
/// resolution endpoint; the service decides who may, and what it needs.
async fn resolve(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(form): Form<ResolveForm>,
) -> Result<Response, TurnedAway> {
    let (session, service) = console
        .operation_form(&headers, &form.form_token, &form.service, &form.operation_id)
        .await?;
    let Some(outcome) = ["completed", "failed"].into_iter().find(|o| *o == form.outcome) else {
        let problem = "Say how the operation ended: completed or failed.";
        return Ok(console
            .with_problem(&session, &PageQuery::of(&service.name), problem)
            .await);
    };
    // an empty reference is no reference, and then no member: `completed` without
    // one is what a person settles when the external system can no longer be asked
    let mut body = serde_json::json!({"outcome": outcome, "evidence": form.evidence});
    if let Some(external_ref) = Some(form.external_ref.trim()).filter(|r| !r.is_empty()) {
        body["external_ref"] = external_ref.into();
    }
    let path = format!("/v1/operations/{}/resolution", form.operation_id);
    Ok(console
        .settle(&session, service, &path, &body, outcome, &form.operation_id)
        .await)
}

#[derive(Debug, Deserialize)]
struct RedeliverForm {
    service: String,
    operation_id: String,
    #[serde(default)]
    form_token: String,
}

/// Gives an operation's dead delivery back to its outbox with the service's redelivery endpoint.
async fn redeliver(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(form): Form<RedeliverForm>,
) -> Result<Response, TurnedAway> {
    let (session, service) = console
        .operation_form(&headers, &form.form_token, &form.service, &form.operation_id)
        .await?;
    let path = format!("/v1/operations/{}/redelivery", form.operation_id);
    Ok(console
        .settle(
            &session,
            service,
            &path,
            &serde_json::json!({}),
            "resent",
            &form.operation_id,
        )
        .await)
}

fn refused(problem: &str) -> Response {
    (StatusCode::FORBIDDEN, Html(layout(&error_box(problem), false))).into_response()
}

/// The answer to a posted form the console does not act on (boxed: a
/// `Response` is large, and this travels through `?`).
struct TurnedAway(Box<Response>);

impl From<Response> for TurnedAway {
    fn from(response: Response) -> Self {
        TurnedAway(Box::new(response))
    }
}

impl IntoResponse for TurnedAway {
    fn into_response(self) -> Response {
        *self.0
    }
}

/// One page of a service's approvals.
struct ApprovalPage {
    data: Vec<Value>,
    next_cursor: Option<String>,
    /// In the state asked for, on every page.
    total: i64,
}

/// One page of a service's operations that need a person.
struct OperationPage {
    data: Vec<Value>,
    next_cursor: Option<String>,
}

impl Console {
    fn knows(&self, service: &str) -> bool {
        self.config.services.iter().any(|s| s.name == service)
    }

    /// The live session the request's cookie names.
    fn session(&self, headers: &HeaderMap) -> Option<Session> {
        self.sessions.find(&session_id(headers)?)
    }

    /// The session a posted form acts for, or the answer that turns it away:
    /// a form from another origin, no session (sign in first), or a form this
    /// console did not render for this session.
    fn form_session(&self, headers: &HeaderMap, form_token: &str) -> Result<Session, TurnedAway> {
        if let Some(refused) = refuse_cross_origin(headers) {
            return Err(refused.into());
        }
        let Some(session) = self.session(headers) else {
            return Err(Redirect::to("/").into_response().into());
        };
        if form_token != session.form_token {
            return Err(refused("This form is not one the console gave this session; reload the page.").into());
        }
        Ok(session)
    }

    /// The service a form names, or the page saying there is none.
    async fn service_for(&self, session: &Session, name: &str) -> Result<&ServiceLink, TurnedAway> {
        match self.config.services.iter().find(|s| s.name == name) {
            Some(service) => Ok(service),
            None => {
                let problem = format!("There is no service called “{name}” in this sandbox.");
                Err(self.with_problem(session, &PageQuery::default(), &problem).await.into())
            }
        }
    }

    /// The session and service of a form about one operation; the operation
    /// id goes into the service's URL, so only what the services make is taken.
    async fn operation_form(
        &self,
        headers: &HeaderMap,
        form_token: &str,
        service: &str,
        operation_id: &str,
    ) -> Result<(Session, &ServiceLink), TurnedAway> {
        let session = self.form_session(headers, form_token)?;
        if !is_operation_id(operation_id) {
            let problem = "That is not an operation id (op_ and 32 hex digits); reload the page.";
            return Err(self
                .with_problem(&session, &PageQuery::of(service), problem)
                .await
                .into());
        }
        let service = self.service_for(&session, service).await?;
        Ok((session, service))
    }

    /// Sends a resolution or a redelivery, then back to the page with `done`'s
    /// notice, or the page with the service's refusal in words.
    async fn settle(
        &self,
        session: &Session,
        service: &ServiceLink,
        path: &str,
        body: &Value,
        done: &str,
        operation_id: &str,
    ) -> Response {
        match self.act(service, session, path, body, settling_in_words).await {
            Ok(()) => {
                let target = format!(
                    "/?done={done}&operation={}&service={}",
                    url_encoded(operation_id),
                    url_encoded(&service.name),
                );
                Redirect::to(&target).into_response()
            }
            Err(problem) => {
                self.with_problem(session, &PageQuery::of(&service.name), &problem)
                    .await
            }
        }
    }

    /// POSTs `body` to `path` of `service` with the session's key: done, or
    /// what went wrong as `words` put it.
    async fn act(
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

    /// The page as `query` asks, with a problem on top.
    async fn with_problem(&self, session: &Session, query: &PageQuery, problem: &str) -> Response {
        Html(self.render(session, query, None, Some(problem)).await).into_response()
    }

    /// What this console just did, in words; nothing for a query it could not
    /// have sent (an unknown service, something that is not an id).
    fn notice(&self, query: &PageQuery) -> Option<String> {
        let service = query.service.as_deref().filter(|s| self.knows(s))?;
        let approval = query.approval.as_deref().filter(|a| is_approval_id(a));
        let operation = query.operation.as_deref().filter(|o| is_operation_id(o));
        let text = match (query.done.as_deref()?, approval, operation) {
            ("approved", Some(approval), _) => format!(
                "Approved {approval} of {service}. The operation runs when the agent retries it with the same key, if what you were shown still holds then (the release a deployment replaces); if not, it never runs, and a new request asks you again."
            ),
            ("rejected", Some(approval), _) => {
                format!("Rejected {approval} of {service}. The operation will never run.")
            }
            ("completed", _, Some(operation)) => format!(
                "Settled {operation} of {service} as completed. A retry with its key still gets the answer it was first given."
            ),
            ("failed", _, Some(operation)) => format!(
                "Settled {operation} of {service} as failed: the external system holds nothing for it. A retry with its key still gets the answer it was first given."
            ),
            ("resent", _, Some(operation)) => format!(
                "Gave {operation} of {service} back to its outbox: it asks the external system first, and sends it again only if it finds no trace of it."
            ),
            _ => return None,
        };
        Some(text)
    }

    /// Whether some service takes this key as an approver's or an admin's
    /// (both may read approvals), or what each one said. Each service keeps
    /// its own keys — `create-api-key` stores one in one service's database
    /// — so one that takes it is enough: the page then shows what the others
    /// say, and every action is still each service's to allow.
    async fn verify(&self, key: &str) -> Result<(), Vec<String>> {
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

    /// The page: each service with its count of pending approvals, then one
    /// service's pending approvals with their decision buttons, its
    /// operations whose outcome is unknown and its dead deliveries with what
    /// an admin may do about them, then all of its approvals, each list a
    /// page at a time.
    async fn render(
        &self,
        session: &Session,
        query: &PageQuery,
        notice: Option<&str>,
        problem: Option<&str>,
    ) -> String {
        let key = session.key.expose();
        let mut problems: Vec<String> = problem.map(str::to_owned).into_iter().collect();
        let mut counts = Vec::new();
        for service in &self.config.services {
            match self.approvals(service, key, Some("pending"), None, 1).await {
                Ok(page) => counts.push((service, Some(page.total))),
                Err(failure) => {
                    problems.push(failure.into_words());
                    counts.push((service, None));
                }
            }
        }
        // the service asked for, else the first with something waiting
        let selected = query
            .service
            .as_deref()
            .and_then(|name| counts.iter().find(|(s, _)| s.name == name))
            .or_else(|| counts.iter().find(|(_, n)| n.is_some_and(|n| n > 0)))
            .or(counts.first());

        let mut body = String::new();
        if let Some(notice) = notice {
            body.push_str(&format!("<p class=\"notice\" role=\"status\">{}</p>", escape(notice)));
        }
        for problem in &problems {
            body.push_str(&error_box(problem));
        }
        let waiting: i64 = counts.iter().filter_map(|(_, n)| *n).sum();
        body.push_str(&format!(
            "<h2>Waiting for a decision</h2><p id=\"pending-total\">{waiting} waiting in all.</p><nav class=\"services\">"
        ));
        for (service, count) in &counts {
            let class = if selected.is_some_and(|(s, _)| s.name == service.name) {
                " class=\"selected\""
            } else {
                ""
            };
            body.push_str(&format!(
                "<a href=\"/?service={}\"{class} data-service=\"{name}\">{name} <span class=\"count\">{}</span></a>",
                url_encoded(&service.name),
                count.map_or("?".to_owned(), |n| n.to_string()),
                name = escape(&service.name),
            ));
        }
        body.push_str("</nav>");
        // a service that did not answer is already explained above
        if let Some((service, Some(_))) = selected {
            let sections = [
                self.pending_section(service, key, session, query).await,
                self.unknown_section(service, key, session, query).await,
                self.dead_section(service, key, session, query).await,
                self.history_section(service, key, query).await,
            ];
            for section in sections {
                match section {
                    Ok(section) => body.push_str(&section),
                    Err(failure) => body.push_str(&error_box(&failure.into_words())),
                }
            }
        }
        body.push_str(
            "<form method=\"post\" action=\"/forget\" class=\"forget\"><button type=\"submit\" id=\"sign-out\">Sign out</button></form>",
        );
        layout(&body, true)
    }

    async fn pending_section(
        &self,
        service: &ServiceLink,
        key: &str,
        session: &Session,
        query: &PageQuery,
    ) -> Result<String, Failure> {
        let page = self
            .approvals(service, key, Some("pending"), query.cursor.as_deref(), PAGE_SIZE)
            .await?;
        let mut section = format!(
            "<section id=\"pending\"><p class=\"page-info\" id=\"pending-page\">{} of {} waiting in {}{}.</p>",
            page.data.len(),
            page.total,
            escape(&service.name),
            if query.cursor.is_some() { ", a later page" } else { "" },
        );
        if page.data.is_empty() {
            section.push_str("<p class=\"empty\" id=\"no-pending\">Nothing is waiting for a decision.</p>");
        }
        for approval in &page.data {
            section.push_str(&pending_card(&service.name, approval, &session.form_token));
        }
        section.push_str(&page_links(
            service,
            page.next_cursor.as_deref(),
            query.cursor.is_some(),
            "pending",
            "cursor",
        ));
        section.push_str("</section>");
        Ok(section)
    }

    async fn unknown_section(
        &self,
        service: &ServiceLink,
        key: &str,
        session: &Session,
        query: &PageQuery,
    ) -> Result<String, Failure> {
        let page = self
            .operations(service, key, "state=unknown", query.unknown.as_deref())
            .await?;
        let mut section = format!(
            "<section id=\"unknown-operations\"><h2>Outcome unknown in {}</h2>",
            escape(&service.name)
        );
        if page.data.is_empty() {
            section.push_str("<p class=\"empty\" id=\"no-unknown\">No operation waits for someone to settle it.</p>");
        } else {
            section.push_str(
                "<p>The service could not learn how these ended at the external system. Look there, then say what you found: only an admin may settle them.</p>",
            );
        }
        for operation in &page.data {
            section.push_str(&unknown_card(&service.name, operation, &session.form_token));
        }
        section.push_str(&page_links(
            service,
            page.next_cursor.as_deref(),
            query.unknown.is_some(),
            "unknown",
            "unknown",
        ));
        section.push_str("</section>");
        Ok(section)
    }

    async fn dead_section(
        &self,
        service: &ServiceLink,
        key: &str,
        session: &Session,
        query: &PageQuery,
    ) -> Result<String, Failure> {
        let page = self
            .operations(service, key, "outbox=dead", query.dead.as_deref())
            .await?;
        let mut section = format!(
            "<section id=\"dead-deliveries\"><h2>Dead deliveries in {}</h2>",
            escape(&service.name)
        );
        if page.data.is_empty() {
            section.push_str("<p class=\"empty\" id=\"no-dead\">No delivery has failed too often.</p>");
        } else {
            section.push_str(
                "<p>These failed too often and are no longer tried. Sending one again asks the external system first, and sends it only if there is no trace of it; only an admin may.</p>\
                 <table id=\"dead\"><tr><th>operation</th><th>what</th><th>state</th><th>last error</th><th></th></tr>",
            );
            for operation in &page.data {
                section.push_str(&dead_row(&service.name, operation, &session.form_token));
            }
            section.push_str("</table>");
        }
        section.push_str(&page_links(
            service,
            page.next_cursor.as_deref(),
            query.dead.is_some(),
            "dead",
            "dead",
        ));
        section.push_str("</section>");
        Ok(section)
    }

    async fn history_section(&self, service: &ServiceLink, key: &str, query: &PageQuery) -> Result<String, Failure> {
        let page = self
            .approvals(service, key, None, query.history.as_deref(), PAGE_SIZE)
            .await?;
        let mut section = format!(
            "<h2>Every approval in {}</h2><p class=\"page-info\" id=\"history-page\">{} of {}, oldest first.</p>",
            escape(&service.name),
            page.data.len(),
            page.total,
        );
        if page.data.is_empty() {
            section.push_str("<p class=\"empty\">No approvals yet.</p>");
        } else {
            section.push_str(
                "<table id=\"decided\"><tr><th>what</th><th>state</th><th>decided by</th><th>when</th><th>approval</th></tr>",
            );
            for approval in &page.data {
                section.push_str(&history_row(approval));
            }
            section.push_str("</table>");
        }
        section.push_str(&page_links(
            service,
            page.next_cursor.as_deref(),
            query.history.is_some(),
            "history",
            "history",
        ));
        Ok(section)
    }

    /// One page of the account's approvals in a service (`state`: all when `None`).
    async fn approvals(
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
    async fn operations(
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
enum Failure {
    Unreachable(String),
    Refused(String),
}

impl Failure {
    fn into_words(self) -> String {
        match self {
            Failure::Unreachable(words) | Failure::Refused(words) => words,
        }
    }
}

/// "First page" and "Next page" links of one list; the other list starts over.
fn page_links(service: &ServiceLink, next: Option<&str>, later_page: bool, list: &str, parameter: &str) -> String {
    let base = format!("/?service={}", url_encoded(&service.name));
    let mut links = String::new();
    if later_page {
        links.push_str(&format!("<a href=\"{base}\" id=\"first-{list}\">First page</a>"));
    }
    if let Some(next) = next {
        links.push_str(&format!(
            "<a href=\"{base}&amp;{parameter}={}\" id=\"next-{list}\">Next page →</a>",
            url_encoded(next)
        ));
    }
    if links.is_empty() {
        links
    } else {
        format!("<p class=\"pages\">{links}</p>")
    }
}

/// What went wrong, as a person would want to be told.
fn in_words(service: &str, status: u16, problem: &Value) -> String {
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
fn settling_in_words(service: &str, status: u16, problem: &Value) -> String {
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

/// A summary value as HTML: hidden characters written out as escapes and,
/// if there were any, the field marked so nobody reads past it.
fn shown(value: &Value) -> String {
    let revealed = Revealed::of(value.as_str().unwrap_or(""));
    if revealed.escaped {
        format!(
            "<span class=\"has-hidden\">{}</span><span class=\"hidden-mark\" title=\"characters that do not show, or that reorder the text, are written as \\u escapes\">⚠ contains hidden characters</span>",
            escape(&revealed.text)
        )
    } else {
        escape(&revealed.text)
    }
}

/// [`shown`], or `absent` in words when the service gave nothing.
fn shown_or(value: &Value, absent: &str) -> String {
    if value.is_null() { escape(absent) } else { shown(value) }
}

fn has_hidden(value: &Value) -> bool {
    match value {
        Value::String(text) => text.chars().any(idempotency::approval::is_hidden),
        Value::Object(map) => map
            .iter()
            .any(|(name, value)| name.chars().any(idempotency::approval::is_hidden) || has_hidden(value)),
        _ => false,
    }
}

fn pending_card(service: &str, approval: &Value, form_token: &str) -> String {
    let summary = &approval["summary"];
    let identifiers: String = summary["identifiers"]
        .as_object()
        .map(|map| {
            map.iter()
                .map(|(name, value)| {
                    format!(
                        "<tr><th>{}</th><td>{}</td></tr>",
                        shown(&Value::from(name.as_str())),
                        shown(value)
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let warning = if has_hidden(summary) || has_hidden(&approval["requested_by"]) {
        "<p class=\"hidden-warning\" role=\"alert\">⚠ This request contains hidden characters (control, bidirectional or invisible): they are shown as \\u escapes in the marked fields. Look closely before deciding.</p>"
    } else {
        ""
    };
    let id = escape(approval["approval_id"].as_str().unwrap_or(""));
    let hidden = format!(
        "<input type=\"hidden\" name=\"service\" value=\"{}\"><input type=\"hidden\" name=\"approval_id\" value=\"{id}\">\
         <input type=\"hidden\" name=\"fingerprint\" value=\"{}\"><input type=\"hidden\" name=\"form_token\" value=\"{}\">",
        escape(service),
        escape(approval["fingerprint"].as_str().unwrap_or("")),
        escape(form_token),
    );
    format!(
        r#"<section class="approval" id="approval-{id}" data-approval="{id}">
<h3>{action} — {target}</h3>{warning}
<p class="consequences">{consequences}</p>
<table class="identifiers">{identifiers}
<tr><th>service</th><td>{service}</td></tr>
<tr><th>route</th><td><code>{route}</code></td></tr>
<tr><th>requested by</th><td>{requested_by}</td></tr>
<tr><th>expires</th><td>{expires_at}</td></tr>
<tr><th>fingerprint</th><td><code class="fingerprint">{fingerprint}</code></td></tr>
<tr><th>approval</th><td><code>{id}</code> for operation <code>{operation}</code></td></tr>
</table>
<div class="decide">
<form method="post" action="/decide">{hidden}<button type="submit" name="decision" value="approve" class="approve" id="approve-{id}">Approve</button></form>
<form method="post" action="/decide">{hidden}<button type="submit" name="decision" value="reject" class="reject" id="reject-{id}">Reject</button></form>
</div>
</section>"#,
        action = shown(&summary["action"]),
        target = shown(&summary["target"]),
        consequences = shown(&summary["consequences"]),
        service = escape(service),
        route = shown(&approval["route"]),
        requested_by = shown(&approval["requested_by"]),
        expires_at = shown(&approval["expires_at"]),
        fingerprint = shown(&approval["fingerprint"]),
        operation = shown(&approval["operation_id"]),
    )
}

/// The hidden fields of a form about one operation.
fn operation_fields(service: &str, operation_id: &str, form_token: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"service\" value=\"{}\"><input type=\"hidden\" name=\"operation_id\" value=\"{}\">\
         <input type=\"hidden\" name=\"form_token\" value=\"{}\">",
        escape(service),
        escape(operation_id),
        escape(form_token),
    )
}

/// An operation whose outcome is unknown, and the form that settles it.
fn unknown_card(service: &str, operation: &Value, form_token: &str) -> String {
    let id = operation["operation_id"].as_str().unwrap_or("");
    format!(
        r#"<section class="operation" id="unknown-{id}" data-operation="{id}">
<h3><code>{method} {route}</code> — outcome unknown</h3>
<table class="identifiers">
<tr><th>operation</th><td><code>{id}</code></td></tr>
<tr><th>idempotency key</th><td><code>{key}</code></td></tr>
<tr><th>acting on</th><td>{resource_type} <code>{resource_id}</code></td></tr>
<tr><th>created</th><td>{created_at}</td></tr>
<tr><th>external reference</th><td>{external_ref}</td></tr>
<tr><th>last error</th><td>{last_error}</td></tr>
</table>
<form method="post" action="/resolve" class="resolve">{fields}
<fieldset><legend>How did it end at the external system?</legend>
<label><input type="radio" name="outcome" value="completed" required> completed — it took effect there</label>
<label><input type="radio" name="outcome" value="failed"> failed — it did not take effect</label>
</fieldset>
<label>Evidence: what you found, and where (required)<textarea name="evidence" rows="3" maxlength="2000" required></textarea></label>
<label>External reference: the external system's id for it (letters, digits, _ and -), which is checked there before anything is written. Leave it empty with completed only when the external system can no longer be asked: then nothing acts on it there in this operation's name<input name="external_ref" maxlength="200" pattern="[A-Za-z0-9_\-]+" autocomplete="off"></label>
<button type="submit" class="settle" id="resolve-{id}">Settle</button>
</form>
</section>"#,
        id = escape(id),
        method = shown(&operation["method"]),
        route = shown(&operation["route"]),
        key = shown(&operation["idempotency_key"]),
        resource_type = shown_or(&operation["resource"]["type"], "nothing known yet"),
        resource_id = shown(&operation["resource"]["id"]),
        created_at = shown(&operation["created_at"]),
        external_ref = shown_or(&operation["external_ref"], "none known"),
        last_error = shown_or(&operation["last_error"], "none"),
        fields = operation_fields(service, id, form_token),
    )
}

/// An operation whose delivery is dead, and the button that sends it again.
fn dead_row(service: &str, operation: &Value, form_token: &str) -> String {
    let id = operation["operation_id"].as_str().unwrap_or("");
    format!(
        "<tr data-operation=\"{id}\"><td><code>{id}</code></td><td><code>{} {}</code><br>key <code>{}</code></td>\
         <td class=\"state {state}\">{state}</td><td>{}</td><td><form method=\"post\" action=\"/redeliver\">{}\
         <button type=\"submit\" id=\"redeliver-{id}\">Send again</button></form></td></tr>",
        shown(&operation["method"]),
        shown(&operation["route"]),
        shown(&operation["idempotency_key"]),
        shown_or(&operation["last_error"], "none"),
        operation_fields(service, id, form_token),
        id = escape(id),
        state = escape(operation["state"].as_str().unwrap_or("")),
    )
}

fn history_row(approval: &Value) -> String {
    let summary = &approval["summary"];
    let by = match approval["decided_by"].as_str() {
        Some(_) => shown(&approval["decided_by"]),
        None if approval["state"] == "expired" => "nobody (expired)".to_owned(),
        None => String::new(),
    };
    format!(
        "<tr data-approval=\"{id}\"><td>{} — {}</td><td class=\"state {state}\">{state}</td><td>{by}</td><td>{}</td><td><code>{id}</code></td></tr>",
        shown(&summary["action"]),
        shown(&summary["target"]),
        shown(&approval["decided_at"]),
        id = escape(approval["approval_id"].as_str().unwrap_or("")),
        state = escape(approval["state"].as_str().unwrap_or("")),
    )
}

fn sign_in_form(suggested: Option<&str>) -> String {
    format!(
        r#"<h2>Who is deciding?</h2>
<p>Sign in with an approver's or an admin's API key: both see what waits, and only an admin may settle an operation or send a delivery again. The console checks it with the services and keeps it on the server; this browser gets only a session that ends after a while without use, or when you sign out.</p>
<form method="post" action="/key" class="key"><label>API key <input name="key" id="key" type="password" autocomplete="off" value="{}"></label>
<button type="submit" id="use-key">Sign in</button></form>"#,
        escape(suggested.unwrap_or(""))
    )
}

fn error_box(problem: &str) -> String {
    format!("<p class=\"problem\" role=\"alert\">{}</p>", escape(problem))
}

fn layout(body: &str, signed_in: bool) -> String {
    let who = if signed_in {
        "<p class=\"who\">signed in with an approver's or an admin's key</p>"
    } else {
        ""
    };
    format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Retrysafe approvals</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/console.css">
</head><body>
<h1>Retrysafe approvals</h1>{who}
{body}
</body></html>"#
    )
}

const STYLE: &str = "body { font: 15px/1.45 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #1d2430; }
h1 { margin-bottom: .2rem; } .who { color: #667; margin-top: 0; }
.approval, .operation { border: 1px solid #c9d1dc; border-radius: 8px; padding: .2rem 1.2rem 1rem; margin: 1rem 0; background: #fbfcfe; }
.approval h3, .operation h3 { margin-bottom: .2rem; } .consequences { color: #8a4b00; margin-top: 0; }
table { border-collapse: collapse; } th { text-align: left; color: #556; font-weight: 600; padding: .15rem 1rem .15rem 0; vertical-align: top; }
td { padding: .15rem 1rem .15rem 0; } #decided td, #decided th, #dead td, #dead th { border-bottom: 1px solid #e3e7ee; padding: .3rem .8rem .3rem 0; }
code { font: 13px ui-monospace, monospace; } .fingerprint { word-break: break-all; }
.decide { display: flex; gap: .6rem; margin-top: .8rem; } .decide form { margin: 0; }
button { font: inherit; padding: .35rem 1rem; border-radius: 6px; border: 1px solid #889; background: #fff; cursor: pointer; }
.approve { background: #1f7a3a; border-color: #1f7a3a; color: #fff; } .reject { background: #fff; border-color: #a02020; color: #a02020; }
.notice { background: #e8f5ec; border: 1px solid #9cd1ac; padding: .6rem 1rem; border-radius: 6px; }
.problem { background: #fdecec; border: 1px solid #e3a3a3; padding: .6rem 1rem; border-radius: 6px; }
.state.approved { color: #1f7a3a; } .state.rejected, .state.expired { color: #a02020; } .empty { color: #667; }
.state.unknown { color: #8a4b00; } .resolve fieldset { border: 0; padding: 0; margin: .8rem 0 .4rem; } .resolve legend { font-weight: 600; padding: 0; }
.resolve label { display: block; margin: .3rem 0; } .resolve textarea, .resolve input:not([type=radio]) { display: block; width: 100%; box-sizing: border-box; font: inherit; margin-top: .2rem; }
.settle { background: #1d2430; border-color: #1d2430; color: #fff; margin-top: .4rem; }
.forget { margin-top: 2rem; }
.services { display: flex; gap: .4rem; margin: 1rem 0; } .services a { padding: .3rem .8rem; border: 1px solid #c9d1dc; border-radius: 6px; text-decoration: none; color: inherit; }
.services a.selected { background: #1d2430; color: #fff; border-color: #1d2430; } .count { font-weight: 600; }
.pages { display: flex; gap: 1rem; margin: .6rem 0 1.4rem; }
.has-hidden { background: #fff3cd; outline: 1px solid #d39e00; border-radius: 3px; padding: 0 .2rem; }
.hidden-mark, .hidden-warning { color: #8a4b00; font-weight: 600; } .hidden-mark { margin-left: .4rem; white-space: nowrap; }
";

/// `apr_` and 32 lowercase hex digits: what the services make, and nothing
/// that could change the decision's URL.
fn is_approval_id(id: &str) -> bool {
    is_id(id, "apr_")
}

/// `op_` and 32 lowercase hex digits (a v7 UUID): what the services make, and
/// nothing that could change the resolution's or redelivery's URL.
fn is_operation_id(id: &str) -> bool {
    is_id(id, "op_")
}

fn is_id(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix)
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// A form posted from another origin — another site, or another port of this
/// host, which `SameSite` counts as the same site — is refused: it could
/// decide with the approver's cookie, or plant its own key.
fn refuse_cross_origin(headers: &HeaderMap) -> Option<Response> {
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let same_origin = match (value("sec-fetch-site"), value("origin"), value("host")) {
        (Some(site), _, _) => site == "same-origin" || site == "none",
        (None, Some(origin), Some(host)) => origin == format!("http://{host}"),
        // no browser sent this (a script): it holds no one's cookie
        (None, _, _) => true,
    };
    (!same_origin).then(|| {
        (
            axum::http::StatusCode::FORBIDDEN,
            Html(layout(
                &error_box("This form was sent from another page; the console accepts its own forms only."),
                false,
            )),
        )
            .into_response()
    })
}

fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == SESSION_COOKIE && !value.is_empty())
        .map(|(_, value)| value.to_owned())
}

fn with_cookie(mut response: Response, cookie: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

fn url_encoded(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

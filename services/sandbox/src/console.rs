//! The approval console (docs/contract.md §6): a web page where a human sees
//! the pending approvals of every running service — what each would do, to
//! what, with which fingerprint, who asked and until when — and approves or
//! rejects them, page by page, with the counts of what waits. Every approval is
//! listed too, with who decided and when.
//!
//! The console is just another client of the public API: it has no database,
//! and acts with the approver's own API key. The key stays on the server:
//! signing in verifies it with the services and opens a session
//! ([`session`]); the browser holds only the session's opaque id, in an
//! HttpOnly, SameSite=Strict cookie. Pages are rendered on the server with
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

/// How many approvals one page lists.
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
        .route("/console.css", get(stylesheet))
        .route("/healthz", get(|| async { "ok" }))
        .fallback(not_found)
        .with_state(Console { config, http, sessions })
        .layer(middleware::map_response(protect))
}

/// Serves the console until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: ConsoleConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing::info!(addr = %listener.local_addr()?, "approval console listening");
    Ok(platform::serve(listener, router(config), Default::default(), shutdown).await?)
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
    done: Option<String>,
    approval: Option<String>,
}

async fn page(State(console): State<Console>, headers: HeaderMap, Query(query): Query<PageQuery>) -> Html<String> {
    let Some(session) = console.session(&headers) else {
        return Html(layout(&sign_in_form(console.config.suggested_key.as_deref()), false));
    };
    // only notices this console could have sent: a known service, an approval id
    let notice = match (query.done.as_deref(), &query.approval, &query.service) {
        (Some(done @ ("approved" | "rejected")), Some(approval), Some(service))
            if console.knows(service) && is_approval_id(approval) =>
        {
            Some(format!(
                "{} {approval} of {service}.{}",
                if done == "approved" { "Approved" } else { "Rejected" },
                if done == "approved" {
                    " The operation runs when the agent retries it with the same key."
                } else {
                    " The operation will never run."
                }
            ))
        }
        _ => None,
    };
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
    let try_again =
        |problem: &str| Html(layout(&format!("{}{}", error_box(problem), sign_in_form(None)), false)).into_response();
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return try_again("An API key is one word of letters, digits, - and _, like demo-acme-approver.");
    }
    if let Err(problem) = console.verify(key).await {
        return try_again(&problem);
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

async fn decide(State(console): State<Console>, headers: HeaderMap, Form(form): Form<DecideForm>) -> Response {
    if let Some(refused) = refuse_cross_origin(&headers) {
        return refused;
    }
    let Some(session) = console.session(&headers) else {
        return Redirect::to("/").into_response();
    };
    if form.form_token != session.form_token {
        return refused("This form is not one the console gave this session; reload the page.");
    }
    let shown = PageQuery {
        service: Some(form.service.clone()),
        ..PageQuery::default()
    };
    if !is_approval_id(&form.approval_id) {
        let problem = "That is not an approval id (apr_ and 32 hex digits); reload the page.";
        return Html(console.render(&session, &shown, None, Some(problem)).await).into_response();
    }
    let Some(service) = console.config.services.iter().find(|s| s.name == form.service) else {
        let problem = format!("There is no service called “{}” in this sandbox.", form.service);
        return Html(
            console
                .render(&session, &PageQuery::default(), None, Some(&problem))
                .await,
        )
        .into_response();
    };
    let decision = if form.decision == "approve" {
        "approve"
    } else {
        "reject"
    };
    let url = format!("{}/v1/approvals/{}/decision", service.url, form.approval_id);
    let sent = console
        .http
        .post(&url)
        .bearer_auth(session.key.expose())
        .json(&serde_json::json!({"decision": decision, "fingerprint": form.fingerprint}))
        .send()
        .await;
    let problem = match sent {
        Ok(answer) if answer.status().is_success() => {
            let done = if decision == "approve" { "approved" } else { "rejected" };
            let target = format!(
                "/?done={done}&approval={}&service={}",
                url_encoded(&form.approval_id),
                url_encoded(&service.name),
            );
            return Redirect::to(&target).into_response();
        }
        Ok(answer) => {
            let status = answer.status().as_u16();
            let body: Value = answer.json().await.unwrap_or_default();
            in_words(&service.name, status, &body)
        }
        Err(e) => unreachable_service(service, &e),
    };
    Html(console.render(&session, &shown, None, Some(&problem)).await).into_response()
}

fn refused(problem: &str) -> Response {
    (StatusCode::FORBIDDEN, Html(layout(&error_box(problem), false))).into_response()
}

/// One page of a service's approvals.
struct ApprovalPage {
    data: Vec<Value>,
    next_cursor: Option<String>,
    /// In the state asked for, on every page.
    total: i64,
}

impl Console {
    fn knows(&self, service: &str) -> bool {
        self.config.services.iter().any(|s| s.name == service)
    }

    /// The live session the request's cookie names.
    fn session(&self, headers: &HeaderMap) -> Option<Session> {
        self.sessions.find(&session_id(headers)?)
    }

    /// Whether the services take this key as an approver's: the first service
    /// that answers decides.
    async fn verify(&self, key: &str) -> Result<(), String> {
        let mut unreachable = "This console knows no service to check the key with.".to_owned();
        for service in &self.config.services {
            match self.approvals(service, key, Some("pending"), None, 1).await {
                Ok(_) => return Ok(()),
                Err(Failure::Unreachable(problem)) => unreachable = problem,
                Err(Failure::Refused(problem)) => return Err(problem),
            }
        }
        Err(unreachable)
    }

    /// The page: each service with its count of pending approvals, then one
    /// service's pending approvals with their decision buttons, then all of
    /// that service's approvals, each list a page at a time.
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
            match self.pending_section(service, key, session, query).await {
                Ok(section) => body.push_str(&section),
                Err(failure) => body.push_str(&error_box(&failure.into_words())),
            }
            match self.history_section(service, key, query).await {
                Ok(section) => body.push_str(&section),
                Err(failure) => body.push_str(&error_box(&failure.into_words())),
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
        let mut url = format!("{}/v1/approvals?limit={limit}", service.url);
        if let Some(state) = state {
            url.push_str(&format!("&state={state}"));
        }
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
        Ok(ApprovalPage {
            data: body["data"].as_array().cloned().unwrap_or_default(),
            next_cursor: body["next_cursor"].as_str().map(str::to_owned),
            total: body["total"].as_i64().unwrap_or(0),
        })
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
<p>Sign in with an approver's API key. The console checks it with the services and keeps it on the server; this browser gets only a session that ends after a while without use, or when you sign out.</p>
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
        "<p class=\"who\">signed in with an approver's key</p>"
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
.approval { border: 1px solid #c9d1dc; border-radius: 8px; padding: .2rem 1.2rem 1rem; margin: 1rem 0; background: #fbfcfe; }
.approval h3 { margin-bottom: .2rem; } .consequences { color: #8a4b00; margin-top: 0; }
table { border-collapse: collapse; } th { text-align: left; color: #556; font-weight: 600; padding: .15rem 1rem .15rem 0; vertical-align: top; }
td { padding: .15rem 1rem .15rem 0; } #decided td, #decided th { border-bottom: 1px solid #e3e7ee; padding: .3rem .8rem .3rem 0; }
code { font: 13px ui-monospace, monospace; } .fingerprint { word-break: break-all; }
.decide { display: flex; gap: .6rem; margin-top: .8rem; } .decide form { margin: 0; }
button { font: inherit; padding: .35rem 1rem; border-radius: 6px; border: 1px solid #889; background: #fff; cursor: pointer; }
.approve { background: #1f7a3a; border-color: #1f7a3a; color: #fff; } .reject { background: #fff; border-color: #a02020; color: #a02020; }
.notice { background: #e8f5ec; border: 1px solid #9cd1ac; padding: .6rem 1rem; border-radius: 6px; }
.problem { background: #fdecec; border: 1px solid #e3a3a3; padding: .6rem 1rem; border-radius: 6px; }
.state.approved { color: #1f7a3a; } .state.rejected, .state.expired { color: #a02020; } .empty { color: #667; }
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
    id.strip_prefix("apr_")
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

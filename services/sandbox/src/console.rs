//! The approval console (CONTRACT §6): one web page where a human sees every
//! pending approval of every running service — what it would do, to what,
//! with which fingerprint, who asked and until when — and approves or
//! rejects it. Decided approvals are listed with who decided and when.
//!
//! The console is just another client of the public API: it holds no state
//! and no database, and acts with the approver's own API key (kept in an
//! HttpOnly, SameSite=Strict cookie, so another site cannot post decisions
//! with it). Pages are rendered on the server with plain HTML forms: no
//! script, nothing fetched from a CDN, so it works with no network.

use std::time::Duration;

use axum::{
    Form, Router,
    extract::{Query, State},
    http::{HeaderMap, HeaderValue, header},
    response::{Html, IntoResponse, Redirect, Response},
    routing::{get, post},
};
use platform::service::escape;
use serde::Deserialize;
use serde_json::Value;

/// The sandbox's console port (CONTRACT §12).
pub const DEFAULT_PORT: u16 = 7000;

const KEY_COOKIE: &str = "retrysafe_console_key";

/// A service whose approvals the console shows.
#[derive(Debug, Clone)]
pub struct ServiceLink {
    pub name: String,
    /// e.g. `http://127.0.0.1:7001`
    pub url: String,
}

#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    pub services: Vec<ServiceLink>,
    /// Pre-filled in the key form (the sandbox's demo approver); never sent anywhere by itself.
    pub suggested_key: Option<String>,
}

#[derive(Clone)]
struct Console {
    config: ConsoleConfig,
    http: reqwest::Client,
}

pub fn router(config: ConsoleConfig) -> Router {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default();
    Router::new()
        .route("/", get(page))
        .route("/key", post(use_key))
        .route("/forget", post(forget_key))
        .route("/decide", post(decide))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(Console { config, http })
}

/// Serves the console until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: ConsoleConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing::info!(addr = %listener.local_addr()?, "approval console listening");
    Ok(platform::serve(listener, router(config), shutdown).await?)
}

#[derive(Debug, Deserialize)]
struct Notice {
    done: Option<String>,
    approval: Option<String>,
    service: Option<String>,
}

async fn page(State(console): State<Console>, headers: HeaderMap, Query(notice): Query<Notice>) -> Html<String> {
    let Some(key) = key_from(&headers) else {
        return Html(layout(&key_form(console.config.suggested_key.as_deref()), None));
    };
    // only notices this console could have sent: a known service, an approval id
    let known = |service: &String| console.config.services.iter().any(|s| &s.name == service);
    let notice = match (notice.done.as_deref(), &notice.approval, &notice.service) {
        (Some(done @ ("approved" | "rejected")), Some(approval), Some(service))
            if known(service) && is_approval_id(approval) =>
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
    Html(console.render(&key, notice.as_deref(), None).await)
}

#[derive(Debug, Deserialize)]
struct KeyForm {
    key: String,
}

async fn use_key(headers: HeaderMap, Form(form): Form<KeyForm>) -> Response {
    if let Some(refused) = refuse_cross_origin(&headers) {
        return refused;
    }
    let key = form.key.trim();
    // the alphabet of API keys: nothing that could end a cookie or add an attribute
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Html(layout(
            &format!(
                "{}{}",
                error_box("An API key is one word of letters, digits, - and _, like demo-acme-approver."),
                key_form(None)
            ),
            None,
        ))
        .into_response();
    }
    let cookie = format!("{KEY_COOKIE}={key}; HttpOnly; SameSite=Strict; Path=/");
    with_cookie(Redirect::to("/").into_response(), &cookie)
}

async fn forget_key(headers: HeaderMap) -> Response {
    if let Some(refused) = refuse_cross_origin(&headers) {
        return refused;
    }
    let cookie = format!("{KEY_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    with_cookie(Redirect::to("/").into_response(), &cookie)
}

#[derive(Debug, Deserialize)]
struct DecideForm {
    service: String,
    approval_id: String,
    fingerprint: String,
    decision: String,
}

async fn decide(State(console): State<Console>, headers: HeaderMap, Form(form): Form<DecideForm>) -> Response {
    if let Some(refused) = refuse_cross_origin(&headers) {
        return refused;
    }
    let Some(key) = key_from(&headers) else {
        return Redirect::to("/").into_response();
    };
    if !is_approval_id(&form.approval_id) {
        let problem = "That is not an approval id (apr_ and 32 hex digits); reload the page.";
        return Html(console.render(&key, None, Some(problem)).await).into_response();
    }
    let Some(service) = console.config.services.iter().find(|s| s.name == form.service) else {
        let problem = format!("There is no service called “{}” in this sandbox.", form.service);
        return Html(console.render(&key, None, Some(&problem)).await).into_response();
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
        .bearer_auth(&key)
        .json(&serde_json::json!({"decision": decision, "fingerprint": form.fingerprint}))
        .send()
        .await;
    let problem = match sent {
        Ok(answer) if answer.status().is_success() => {
            let done = if decision == "approve" { "approved" } else { "rejected" };
            let target = format!(
                "/?done={done}&approval={}&service={}",
                form_urlencoded::byte_serialize(form.approval_id.as_bytes()).collect::<String>(),
                form_urlencoded::byte_serialize(service.name.as_bytes()).collect::<String>(),
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
    Html(console.render(&key, None, Some(&problem)).await).into_response()
}

impl Console {
    /// The whole page: pending approvals with their decision buttons, then the decided ones.
    async fn render(&self, key: &str, notice: Option<&str>, problem: Option<&str>) -> String {
        let (mut pending, mut decided, mut problems) = (String::new(), String::new(), Vec::new());
        problems.extend(problem.map(str::to_owned));
        for service in &self.config.services {
            match self.approvals(service, key).await {
                Ok(approvals) => {
                    for approval in &approvals {
                        if approval["state"] == "pending" {
                            pending.push_str(&pending_card(&service.name, approval));
                        } else {
                            decided.push_str(&decided_row(&service.name, approval));
                        }
                    }
                }
                Err(problem) => problems.push(problem),
            }
        }
        let mut body = String::new();
        if let Some(notice) = notice {
            body.push_str(&format!("<p class=\"notice\" role=\"status\">{}</p>", escape(notice)));
        }
        for problem in &problems {
            body.push_str(&error_box(problem));
        }
        body.push_str("<h2>Waiting for a decision</h2>");
        if pending.is_empty() {
            body.push_str("<p class=\"empty\" id=\"no-pending\">Nothing is waiting for a decision.</p>");
        } else {
            body.push_str(&pending);
        }
        body.push_str("<h2>Decided</h2>");
        if decided.is_empty() {
            body.push_str("<p class=\"empty\">No decisions yet.</p>");
        } else {
            body.push_str(
                "<table id=\"decided\"><tr><th>service</th><th>what</th><th>decision</th><th>by</th><th>when</th><th>approval</th></tr>",
            );
            body.push_str(&decided);
            body.push_str("</table>");
        }
        body.push_str(
            "<form method=\"post\" action=\"/forget\" class=\"forget\"><button type=\"submit\">Use another key</button></form>",
        );
        layout(&body, Some(key))
    }

    /// Every approval the service keeps for this account (they live as long
    /// as their operation), page after page, newest first.
    async fn approvals(&self, service: &ServiceLink, key: &str) -> Result<Vec<Value>, String> {
        let (mut approvals, mut cursor) = (Vec::new(), None::<String>);
        loop {
            let mut url = format!("{}/v1/approvals?limit=200", service.url);
            if let Some(cursor) = &cursor {
                url.push_str(&format!("&cursor={cursor}"));
            }
            let answer = self
                .http
                .get(&url)
                .bearer_auth(key)
                .send()
                .await
                .map_err(|e| unreachable_service(service, &e))?;
            let status = answer.status().as_u16();
            let body: Value = answer.json().await.unwrap_or_default();
            if status != 200 {
                return Err(in_words(&service.name, status, &body));
            }
            approvals.extend(body["data"].as_array().cloned().unwrap_or_default());
            match body["next_cursor"].as_str() {
                Some(next) => cursor = Some(form_urlencoded::byte_serialize(next.as_bytes()).collect()),
                None => break,
            }
        }
        approvals.reverse();
        Ok(approvals)
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

fn text(value: &Value) -> String {
    escape(value.as_str().unwrap_or(""))
}

fn pending_card(service: &str, approval: &Value) -> String {
    let summary = &approval["summary"];
    let identifiers: String = summary["identifiers"]
        .as_object()
        .map(|map| {
            map.iter()
                .map(|(name, value)| format!("<tr><th>{}</th><td>{}</td></tr>", escape(name), text(value)))
                .collect()
        })
        .unwrap_or_default();
    let id = text(&approval["approval_id"]);
    let hidden = format!(
        "<input type=\"hidden\" name=\"service\" value=\"{}\"><input type=\"hidden\" name=\"approval_id\" value=\"{id}\">\
         <input type=\"hidden\" name=\"fingerprint\" value=\"{}\">",
        escape(service),
        text(&approval["fingerprint"]),
    );
    format!(
        r#"<section class="approval" id="approval-{id}" data-approval="{id}">
<h3>{action} — {target}</h3>
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
        action = text(&summary["action"]),
        target = text(&summary["target"]),
        consequences = text(&summary["consequences"]),
        service = escape(service),
        route = text(&approval["route"]),
        requested_by = text(&approval["requested_by"]),
        expires_at = text(&approval["expires_at"]),
        fingerprint = text(&approval["fingerprint"]),
        operation = text(&approval["operation_id"]),
    )
}

fn decided_row(service: &str, approval: &Value) -> String {
    let summary = &approval["summary"];
    let by = approval["decided_by"].as_str().unwrap_or("nobody (expired)");
    format!(
        "<tr data-approval=\"{id}\"><td>{}</td><td>{} — {}</td><td class=\"state {state}\">{state}</td><td>{}</td><td>{}</td><td><code>{id}</code></td></tr>",
        escape(service),
        text(&summary["action"]),
        text(&summary["target"]),
        escape(by),
        text(&approval["decided_at"]),
        id = text(&approval["approval_id"]),
        state = text(&approval["state"]),
    )
}

fn key_form(suggested: Option<&str>) -> String {
    format!(
        r#"<h2>Who is deciding?</h2>
<p>Decisions are made with an approver's API key. It stays in this browser (an HttpOnly cookie) and is sent only to the services.</p>
<form method="post" action="/key" class="key"><label>API key <input name="key" id="key" autocomplete="off" value="{}"></label>
<button type="submit" id="use-key">Use this key</button></form>"#,
        escape(suggested.unwrap_or(""))
    )
}

fn error_box(problem: &str) -> String {
    format!("<p class=\"problem\" role=\"alert\">{}</p>", escape(problem))
}

fn layout(body: &str, key: Option<&str>) -> String {
    let who = key
        .map(|k| {
            format!(
                "<p class=\"who\">acting with key <code>{}…</code></p>",
                escape(&k.chars().take(12).collect::<String>())
            )
        })
        .unwrap_or_default();
    format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Retrysafe approvals</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font: 15px/1.45 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #1d2430; }}
h1 {{ margin-bottom: .2rem; }} .who {{ color: #667; margin-top: 0; }}
.approval {{ border: 1px solid #c9d1dc; border-radius: 8px; padding: .2rem 1.2rem 1rem; margin: 1rem 0; background: #fbfcfe; }}
.approval h3 {{ margin-bottom: .2rem; }} .consequences {{ color: #8a4b00; margin-top: 0; }}
table {{ border-collapse: collapse; }} th {{ text-align: left; color: #556; font-weight: 600; padding: .15rem 1rem .15rem 0; vertical-align: top; }}
td {{ padding: .15rem 1rem .15rem 0; }} #decided td, #decided th {{ border-bottom: 1px solid #e3e7ee; padding: .3rem .8rem .3rem 0; }}
code {{ font: 13px ui-monospace, monospace; }} .fingerprint {{ word-break: break-all; }}
.decide {{ display: flex; gap: .6rem; margin-top: .8rem; }} .decide form {{ margin: 0; }}
button {{ font: inherit; padding: .35rem 1rem; border-radius: 6px; border: 1px solid #889; background: #fff; cursor: pointer; }}
.approve {{ background: #1f7a3a; border-color: #1f7a3a; color: #fff; }} .reject {{ background: #fff; border-color: #a02020; color: #a02020; }}
.notice {{ background: #e8f5ec; border: 1px solid #9cd1ac; padding: .6rem 1rem; border-radius: 6px; }}
.problem {{ background: #fdecec; border: 1px solid #e3a3a3; padding: .6rem 1rem; border-radius: 6px; }}
.state.approved {{ color: #1f7a3a; }} .state.rejected, .state.expired {{ color: #a02020; }} .empty {{ color: #667; }}
.forget {{ margin-top: 2rem; }}
</style></head><body>
<h1>Retrysafe approvals</h1>{who}
{body}
</body></html>"#
    )
}

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
                None,
            )),
        )
            .into_response()
    })
}

fn key_from(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == KEY_COOKIE && !value.is_empty())
        .map(|(_, value)| value.to_owned())
}

fn with_cookie(mut response: Response, cookie: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

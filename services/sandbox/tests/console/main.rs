//! The approval console over HTTP — its session cookie, its headers, its
//! pages — and in a real browser (headless Chromium driven over WebDriver by
//! fantoccini): a pending approval made through the API shows up, a click
//! approves it, and the agent's retry then creates the ticket; a payee with
//! hidden characters is shown with them escaped and marked. What the outbox
//! could not settle is listed for an approver and an admin, and only an
//! admin's settlement or redelivery goes through.
//!
//! The browser tests need Debian's `chromium` and `chromium-driver` (`.ci/run`
//! installs them). Without them they say so and pass locally; under `CI=true`
//! they fail.
//!
//! - `sessions`: signing in, the session cookie, and which forms are acted on;
//! - `pages`: what the page lists, and that what it shows is text;
//! - `browser`: the page in Chromium, clicked as a person would;
//! - `settling`: what the outbox could not settle, settled or sent again.

mod browser;
mod pages;
mod sessions;
mod settling;

use idempotency::IdempotencyConfig;
use platform::{Backend, testing::TestDb};
use sandbox::console::{self, ConsoleConfig, ServiceLink, SessionLimits};
use serde_json::Value;
use tickets::domain::{Priority, TicketsPolicy};

const URGENT: &str = r#"{"project":"payments-api","title":"Checkout is down","priority":"urgent"}"#;

async fn free_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// Serves `router` on a free local port; returns its base URL.
async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// Tickets with urgent tickets waiting for a human, and a console for it:
/// the database and both base URLs.
async fn sandbox(backend: Backend, suggested_key: Option<&str>) -> (TestDb, String, String) {
    sandbox_with(backend, suggested_key, SessionLimits::default()).await
}

async fn sandbox_with(
    backend: Backend,
    suggested_key: Option<&str>,
    session: SessionLimits,
) -> (TestDb, String, String) {
    let db = TestDb::new(backend).await;
    tickets::migrate(&db.db).await.unwrap();
    let policy = TicketsPolicy {
        approval_from: Some(Priority::Urgent),
    };
    let app = tickets::App::new(db.db.clone(), IdempotencyConfig::default(), true).with_policy(policy);
    let tickets_url = serve(tickets::build_router(app)).await;
    let console_url = serve(console::router(ConsoleConfig {
        services: vec![ServiceLink {
            name: "tickets".into(),
            url: tickets_url.clone(),
        }],
        suggested_key: suggested_key.map(str::to_owned),
        session,
    }))
    .await;
    (db, tickets_url, console_url)
}

async fn create_urgent_ticket(http: &reqwest::Client, tickets: &str) -> (u16, Value) {
    create_urgent(http, tickets, "demo-acme-agent", "console-test-1", URGENT).await
}

async fn create_urgent(http: &reqwest::Client, tickets: &str, agent: &str, key: &str, body: &str) -> (u16, Value) {
    let answer = http
        .post(format!("{tickets}/v1/tickets"))
        .bearer_auth(agent)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap())
}

/// A client that shows redirects instead of following them, so their cookies and headers can be read.
fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Signs in with `key` as a form posted from the console's own page; the whole `Set-Cookie`.
async fn sign_in(http: &reqwest::Client, console_url: &str, key: &str) -> String {
    let answer = http
        .post(format!("{console_url}/key"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("sec-fetch-site", "same-origin")
        .body(format!("key={key}"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 303, "signed in and sent to the page");
    answer
        .headers()
        .get("set-cookie")
        .expect("a session cookie")
        .to_str()
        .unwrap()
        .to_owned()
}

/// `name=value` of a `Set-Cookie`, as the browser sends it back.
fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().trim().to_owned()
}

async fn get_page(http: &reqwest::Client, url: &str, cookie: &str) -> (reqwest::header::HeaderMap, String) {
    let answer = http.get(url).header("cookie", cookie).send().await.unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    let headers = answer.headers().clone();
    (headers, answer.text().await.unwrap())
}

/// `page` with its character references read back as the characters a person sees.
fn as_text(page: &str) -> String {
    [
        ("&lt;", "<"),
        ("&#60;", "<"),
        ("&gt;", ">"),
        ("&#62;", ">"),
        ("&quot;", "\""),
        ("&#34;", "\""),
        ("&#39;", "'"),
        ("&amp;", "&"),
        ("&#38;", "&"),
    ]
    .iter()
    .fold(page.to_owned(), |text, (reference, character)| {
        text.replace(reference, character)
    })
}

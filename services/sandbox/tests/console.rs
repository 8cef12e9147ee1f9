//! The approval console in a real browser (headless Chromium driven over
//! WebDriver by fantoccini): a pending approval made through the API shows
//! up, a click approves it, and the agent's retry then creates the ticket.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them).
//! Without them the test says so and passes locally; under `CI=true` it fails.

use std::{process::Stdio, time::Duration};

use fantoccini::{Client, ClientBuilder, Locator};
use idempotency::IdempotencyConfig;
use platform::{Backend, testing::TestDb};
use sandbox::console::{self, ConsoleConfig, ServiceLink};
use serde_json::{Value, json};
use tickets::domain::{Priority, TicketsPolicy};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const URGENT: &str = r#"{"project":"payments-api","title":"Checkout is down","priority":"urgent"}"#;

/// A headless Chromium under its own chromedriver, both gone when this drops.
struct Browser {
    client: Client,
    _driver: tokio::process::Child,
}

impl Browser {
    async fn start() -> Option<Browser> {
        if !std::path::Path::new(CHROMIUM).exists() || !std::path::Path::new(CHROMEDRIVER).exists() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: the browser test needs `apt-get install chromium chromium-driver`"
            );
            eprintln!(
                "skipping the browser test: no {CHROMIUM} / {CHROMEDRIVER} (apt-get install chromium chromium-driver)"
            );
            return None;
        }
        let port = free_port().await;
        let driver = tokio::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let capabilities = json!({
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,1300"],
            }
        });
        let capabilities = capabilities.as_object().unwrap().clone();
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..100 {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            if let Ok(client) = ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                return Some(Browser {
                    client,
                    _driver: driver,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not start a browser session");
    }
}

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
    }))
    .await;
    (db, tickets_url, console_url)
}

async fn create_urgent_ticket(http: &reqwest::Client, tickets: &str) -> (u16, Value) {
    let answer = http
        .post(format!("{tickets}/v1/tickets"))
        .bearer_auth("demo-acme-agent")
        .header("idempotency-key", "console-test-1")
        .header("content-type", "application/json")
        .body(URGENT)
        .send()
        .await
        .unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap())
}

async fn an_approver_approves_in_the_console_and_the_agent_s_retry_creates_the_ticket(backend: Backend) {
    let Some(browser) = Browser::start().await else { return };
    let (_db, tickets_url, console_url) = sandbox(backend, Some("demo-acme-approver")).await;
    let http = reqwest::Client::new();
    let (status, request) = create_urgent_ticket(&http, &tickets_url).await;
    assert_eq!(status, 202, "{request}");
    let approval_id = request["approval_id"].as_str().unwrap();
    let browser = &browser.client;

    browser.goto(&console_url).await.unwrap();
    browser
        .find(Locator::Css("#use-key"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let card = browser
        .wait()
        .for_element(Locator::Css(&format!("#approval-{approval_id}")))
        .await
        .expect("the pending approval is shown");
    let shown = card.text().await.unwrap();
    assert!(shown.contains("Checkout is down"), "{shown}");
    assert!(
        shown.contains(request["fingerprint"].as_str().unwrap()),
        "the fingerprint is shown"
    );
    assert!(shown.contains("acme-agent"), "the requester is shown");
    if let Ok(path) = std::env::var("CONSOLE_SCREENSHOT") {
        std::fs::write(path, browser.screenshot().await.unwrap()).unwrap();
    }
    browser
        .find(Locator::Css(&format!("#approve-{approval_id}")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let notice = browser.wait().for_element(Locator::Css(".notice")).await.unwrap();
    assert!(notice.text().await.unwrap().contains("Approved"));
    let decided = browser
        .find(Locator::Css("#decided"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        decided.contains("acme-approver") && decided.contains("approved"),
        "{decided}"
    );
    assert!(
        browser.find(Locator::Css("#no-pending")).await.is_ok(),
        "nothing waits any more"
    );

    let (status, created) = create_urgent_ticket(&http, &tickets_url).await;
    assert_eq!(status, 201, "the agent's retry runs the approved operation: {created}");
    assert_eq!(created["outcome"], "created");
    browser.clone().close().await.unwrap();
}

async fn the_console_explains_a_refused_decision_in_words(backend: Backend) {
    let Some(browser) = Browser::start().await else { return };
    let (_db, _tickets_url, console_url) = sandbox(backend, None).await;
    let browser = &browser.client;

    // an agent's key cannot read approvals: the page says so in words, not as a status code
    browser.goto(&console_url).await.unwrap();
    browser
        .find(Locator::Css("#key"))
        .await
        .unwrap()
        .send_keys("demo-acme-agent")
        .await
        .unwrap();
    browser
        .find(Locator::Css("#use-key"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let problem = browser.wait().for_element(Locator::Css(".problem")).await.unwrap();

    assert!(problem.text().await.unwrap().contains("does not let this key decide"));
    browser.clone().close().await.unwrap();
}

/// The console's forms, posted from another page (another site, or another
/// port of localhost, which `SameSite` cookies do not tell apart), are refused.
#[tokio::test]
async fn a_decision_posted_from_another_origin_is_refused() {
    let console_url = serve(console::router(ConsoleConfig {
        services: vec![],
        suggested_key: None,
    }))
    .await;
    let http = reqwest::Client::new();
    let form = "service=tickets&approval_id=apr_0123456789abcdef0123456789abcdef&fingerprint=x&decision=approve";

    let cross = http
        .post(format!("{console_url}/decide"))
        .header("cookie", "retrysafe_console_key=demo-acme-approver")
        .header("sec-fetch-site", "same-site")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .unwrap();
    let planted = http
        .post(format!("{console_url}/key"))
        .header("origin", "http://evil.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .body("key=attacker-key")
        .send()
        .await
        .unwrap();

    assert_eq!(cross.status().as_u16(), 403);
    assert_eq!(planted.status().as_u16(), 403);
    assert!(planted.headers().get("set-cookie").is_none(), "no key was planted");
}

platform::both_backends!(
    an_approver_approves_in_the_console_and_the_agent_s_retry_creates_the_ticket,
    the_console_explains_a_refused_decision_in_words,
);

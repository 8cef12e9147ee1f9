//! The console in a real browser: a headless Chromium under chromedriver.

use std::{process::Stdio, time::Duration};

use fantoccini::{Client, ClientBuilder, Locator};
use idempotency::IdempotencyConfig;
use platform::{Backend, testing::TestDb};
use sandbox::console::{self, ConsoleConfig, ServiceLink, SessionLimits};
use serde_json::{Value, json};

use crate::{create_urgent_ticket, free_port, sandbox, serve};

const CHROMIUM: &str = "/usr/bin/chromium";

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

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

/// Payments with a capture waiting for a human, and a console for it: the database and both base URLs.
async fn payments_sandbox(backend: Backend) -> (TestDb, String, String) {
    let db = TestDb::new(backend).await;
    payments::migrate(&db.db).await.unwrap();
    let app = payments::App::new(db.db.clone(), IdempotencyConfig::default(), true, Default::default());
    let payments_url = serve(payments::build_router(app)).await;
    let console_url = serve(console::router(ConsoleConfig {
        services: vec![ServiceLink {
            name: "payments".into(),
            url: payments_url.clone(),
        }],
        suggested_key: Some("demo-acme-approver".into()),
        session: SessionLimits::default(),
    }))
    .await;
    (db, payments_url, console_url)
}

async fn a_payee_with_hidden_characters_is_shown_with_visible_escapes_and_marked(backend: Backend) {
    let Some(browser) = Browser::start().await else { return };
    let (_db, payments_url, console_url) = payments_sandbox(backend).await;
    let http = reqwest::Client::new();
    let send = |path: String, key: &str, body: Value| {
        http.post(format!("{payments_url}{path}"))
            .bearer_auth("demo-acme-agent")
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let intent: Value = send(
        "/v1/payment_intents".into(),
        "intent-1",
        json!({"order_id": "order-1", "amount": "2500.00", "currency": "EUR",
               "payee": {"name": "Acme GmbH \u{202e}liveD\u{202c}", "account": "DE89370400440532013000"}}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let capture = send(
        format!("/v1/payment_intents/{}/capture", intent["id"].as_str().unwrap()),
        "capture-1",
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(capture.status().as_u16(), 202);
    let request: Value = capture.json().await.unwrap();
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
    let marked = card.find_all(Locator::Css(".has-hidden")).await.unwrap();
    let mut marked_text = Vec::new();
    for field in &marked {
        marked_text.push(field.text().await.unwrap());
    }
    let warning = card.find(Locator::Css(".hidden-warning")).await;
    if let Ok(path) = std::env::var("CONSOLE_SCREENSHOT") {
        std::fs::write(path, browser.screenshot().await.unwrap()).unwrap();
    }

    assert!(shown.contains(r"Acme GmbH \u202EliveD\u202C"), "{shown}");
    assert!(
        !shown.contains('\u{202e}') && !shown.contains('\u{202c}'),
        "never raw: {shown}"
    );
    assert!(
        marked_text.iter().any(|text| text == r"Acme GmbH \u202EliveD\u202C"),
        "the payee's field is marked: {marked_text:?}"
    );
    assert!(shown.contains("contains hidden characters"), "{shown}");
    assert!(warning.is_ok(), "the card warns before the buttons");
    browser.clone().close().await.unwrap();
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

platform::both_backends!(
    an_approver_approves_in_the_console_and_the_agent_s_retry_creates_the_ticket,
    the_console_explains_a_refused_decision_in_words,
    a_payee_with_hidden_characters_is_shown_with_visible_escapes_and_marked,
);

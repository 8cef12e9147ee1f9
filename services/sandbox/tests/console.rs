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

use std::{process::Stdio, time::Duration};

use fantoccini::{Client, ClientBuilder, Locator};
use idempotency::{
    IdempotencyConfig,
    outbox::{self, Outbox, OutboxConfig},
};
use payment_provider::Faults;
use payments::provider::{Provider, ProviderConfig, SANDBOX_MERCHANT_KEY};
use platform::{
    Backend, Role,
    testing::{TestDb, new_bearer},
};
use sandbox::console::{self, ConsoleConfig, PAGE_SIZE, ServiceLink, SessionLimits};
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

fn is_sign_in_form(page: &str) -> bool {
    page.contains("id=\"use-key\"") && !page.contains("id=\"pending\"")
}

async fn pending_approvals(http: &reqwest::Client, tickets: &str) -> Value {
    http.get(format!("{tickets}/v1/approvals?state=pending"))
        .bearer_auth("demo-acme-approver")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn the_session_cookie_is_opaque_http_only_and_same_site_strict(backend: Backend) {
    let (_db, tickets_url, console_url) = sandbox(backend, None).await;
    let http = http_client();
    let (status, request) = create_urgent_ticket(&http, &tickets_url).await;
    assert_eq!(status, 202, "{request}");

    let set_cookie = sign_in(&http, &console_url, "demo-acme-approver").await;
    let (_, page) = get_page(&http, &console_url, &cookie_pair(&set_cookie)).await;

    assert!(
        !set_cookie.contains("demo-acme"),
        "the key is not in the cookie: {set_cookie}"
    );
    let (name, id) = cookie_pair(&set_cookie)
        .split_once('=')
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .unwrap();
    assert_eq!(name, "retrysafe_console_session");
    assert!(
        id.len() >= 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "an opaque random id: {id}"
    );
    let attributes: Vec<&str> = set_cookie.split(';').map(str::trim).collect();
    assert!(attributes.contains(&"HttpOnly"), "{set_cookie}");
    assert!(attributes.contains(&"SameSite=Strict"), "{set_cookie}");
    assert!(
        attributes.iter().any(|a| a.starts_with("Max-Age=")),
        "the cookie expires: {set_cookie}"
    );
    assert!(
        page.contains(request["approval_id"].as_str().unwrap()),
        "the session acts with the key it was opened with"
    );
    assert!(!page.contains("demo-acme"), "the key is never shown on the page");
}

async fn a_forged_expired_or_signed_out_session_and_a_raw_key_cookie_are_refused(backend: Backend) {
    let (_db, tickets_url, console_url) = sandbox(backend, None).await;
    let http = http_client();
    let (status, request) = create_urgent_ticket(&http, &tickets_url).await;
    assert_eq!(status, 202, "{request}");
    let live = cookie_pair(&sign_in(&http, &console_url, "demo-acme-approver").await);
    let signed_out = cookie_pair(&sign_in(&http, &console_url, "demo-acme-approver").await);
    let answer = http
        .post(format!("{console_url}/forget"))
        .header("cookie", &signed_out)
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 303);
    let (_db2, _tickets2, idle_console) = sandbox_with(
        backend,
        None,
        SessionLimits {
            idle: Duration::ZERO,
            ..SessionLimits::default()
        },
    )
    .await;
    let expired = cookie_pair(&sign_in(&http, &idle_console, "demo-acme-approver").await);
    let forged = format!("retrysafe_console_session={}", "0123456789abcdef".repeat(4));
    let raw_key = "retrysafe_console_key=demo-acme-approver".to_owned();

    let (_, page) = get_page(&http, &console_url, &live).await;
    assert!(!is_sign_in_form(&page), "a live session is let in");
    for (what, console, cookie) in [
        ("a forged session", &console_url, &forged),
        ("a signed-out session", &console_url, &signed_out),
        ("an expired session", &idle_console, &expired),
        ("an API key as the cookie", &console_url, &raw_key),
    ] {
        let (_, page) = get_page(&http, console, cookie).await;
        assert!(is_sign_in_form(&page), "{what} is asked to sign in");
        let form = format!(
            "service=tickets&approval_id={}&fingerprint={}&decision=approve",
            request["approval_id"].as_str().unwrap(),
            request["fingerprint"].as_str().unwrap()
        );
        let decided = http
            .post(format!("{console}/decide"))
            .header("cookie", cookie)
            .header("sec-fetch-site", "same-origin")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
            .send()
            .await
            .unwrap();
        assert_eq!(decided.headers()["location"], "/", "{what} is sent to sign in");
    }
    let pending = pending_approvals(&http, &tickets_url).await;
    assert_eq!(
        pending["data"].as_array().unwrap().len(),
        1,
        "nothing was decided: {pending}"
    );
}

async fn a_decision_without_the_session_s_form_token_is_refused(backend: Backend) {
    let (_db, tickets_url, console_url) = sandbox(backend, None).await;
    let http = http_client();
    let (_, request) = create_urgent_ticket(&http, &tickets_url).await;
    let session = cookie_pair(&sign_in(&http, &console_url, "demo-acme-approver").await);

    let decided = http
        .post(format!("{console_url}/decide"))
        .header("cookie", &session)
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "service=tickets&approval_id={}&fingerprint={}&decision=approve&form_token=guessed",
            request["approval_id"].as_str().unwrap(),
            request["fingerprint"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();

    assert_eq!(decided.status().as_u16(), 403);
    let pending = pending_approvals(&http, &tickets_url).await;
    assert_eq!(
        pending["data"].as_array().unwrap().len(),
        1,
        "nothing was decided: {pending}"
    );
}

async fn every_console_answer_forbids_framing(backend: Backend) {
    let (_db, tickets_url, console_url) = sandbox(backend, None).await;
    let http = http_client();
    create_urgent_ticket(&http, &tickets_url).await;
    let set_cookie = sign_in(&http, &console_url, "demo-acme-approver").await;
    let session = cookie_pair(&set_cookie);
    let form = |path: &str, origin: &str, body: &str| {
        http.post(format!("{console_url}{path}"))
            .header("cookie", &session)
            .header("sec-fetch-site", origin)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.to_owned())
    };

    let answers = [
        ("the sign-in page", http.get(&console_url)),
        ("the approvals page", http.get(&console_url).header("cookie", &session)),
        ("the stylesheet", http.get(format!("{console_url}/console.css"))),
        ("a page that does not exist", http.get(format!("{console_url}/nope"))),
        ("a refused sign-in", form("/key", "same-origin", "key=not%20a%20key")),
        ("a cross-origin form", form("/decide", "cross-site", "service=tickets")),
        (
            "a decision's redirect",
            form(
                "/decide",
                "same-origin",
                "service=x&approval_id=x&fingerprint=x&decision=approve",
            ),
        ),
        ("the sign-out's redirect", form("/forget", "same-origin", "")),
    ];
    for (what, request) in answers {
        let answer = request.send().await.unwrap();
        let header = |name: &str| {
            answer
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        assert!(
            header("content-security-policy").contains("frame-ancestors 'none'"),
            "{what}: {:?}",
            answer.headers()
        );
        assert_eq!(header("x-frame-options"), "DENY", "{what}");
        assert_eq!(header("cache-control"), "no-store", "{what}");
    }
}

async fn pending_approvals_are_listed_a_page_at_a_time_with_their_count(backend: Backend) {
    let (_db, tickets_url, console_url) = sandbox(backend, None).await;
    let http = http_client();
    let waiting = PAGE_SIZE + 3;
    for n in 0..waiting {
        let body = format!(r#"{{"project":"payments-api","title":"Checkout is down {n}","priority":"urgent"}}"#);
        let (status, _) = create_urgent(&http, &tickets_url, "demo-acme-agent", &format!("page-{n}"), &body).await;
        assert_eq!(status, 202);
    }
    // another account's approval is not counted
    create_urgent(&http, &tickets_url, "demo-globex-agent", "page-globex", URGENT).await;
    let session = cookie_pair(&sign_in(&http, &console_url, "demo-acme-approver").await);

    let (_, first) = get_page(&http, &console_url, &session).await;
    let link = first.find("id=\"next-pending\"").expect("a link to the next page");
    let next = first[..link]
        .rsplit("href=\"")
        .next()
        .and_then(|href| href.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    let (_, second) = get_page(&http, &format!("{console_url}{next}"), &session).await;

    let cards = |page: &str| page.matches("class=\"approval\"").count();
    assert_eq!(cards(&first), PAGE_SIZE);
    assert!(
        first.contains(&format!("{waiting} waiting in all")),
        "the count of what waits"
    );
    assert!(first.contains(&format!("{PAGE_SIZE} of {waiting} waiting")));
    assert!(first.contains("Checkout is down 0") && !first.contains(&format!("Checkout is down {PAGE_SIZE}<")));
    assert_eq!(cards(&second), waiting - PAGE_SIZE, "the next page has the rest");
    assert!(second.contains(&format!("{} of {waiting} waiting", waiting - PAGE_SIZE)));
    assert!(second.contains(&format!("Checkout is down {}", waiting - 1)));
    assert!(!second.contains("id=\"next-pending\""), "the last page has no next");
}

/// What a requester typed is text on the approval page, never markup: a
/// title with a script tag, quotes and ampersands reads as typed.
async fn a_title_with_markup_in_it_is_shown_as_text_on_the_approval_page(backend: Backend) {
    let (_db, tickets_url, console_url) = sandbox(backend, None).await;
    let http = http_client();
    let title = r#"<script>alert("Tom & Jerry's")</script><b>bold</b>"#;
    let body = json!({"project": "payments-api", "title": title, "priority": "urgent"}).to_string();
    let (status, request) = create_urgent(&http, &tickets_url, "demo-acme-agent", "markup-1", &body).await;
    assert_eq!(status, 202, "{request}");
    let session = cookie_pair(&sign_in(&http, &console_url, "demo-acme-approver").await);

    let (_, page) = get_page(&http, &console_url, &session).await;

    assert!(
        !page.contains("<script") && !page.contains("<b>"),
        "no markup of the title's: {page}"
    );
    assert!(
        as_text(&page).contains(&format!("<tr><th>title</th><td>{title}</td></tr>")),
        "the title reads as typed: {page}"
    );
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

/// Payments charging the simulated provider through an outbox the test
/// drives by hand, an admin's key for acme, and a console for it.
struct Settling {
    _db: TestDb,
    payments: String,
    console: String,
    provider_url: String,
    provider: payment_provider::Provider,
    outbox: Outbox<Provider>,
    admin: String,
}

/// An event is dead after `max_failures` deliveries or lookups that come to nothing known.
async fn settling_sandbox(backend: Backend, max_failures: i32) -> Settling {
    let db = TestDb::new(backend).await;
    payments::migrate(&db.db).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider_url = format!("http://{}", listener.local_addr().unwrap());
    let provider = payment_provider::Provider::default();
    tokio::spawn(payment_provider::serve(
        listener,
        provider.clone(),
        Default::default(),
        std::future::pending(),
    ));
    let app = payments::App::new(
        db.db.clone(),
        IdempotencyConfig::default(),
        true,
        ProviderConfig {
            url: provider_url.clone(),
            merchant_key: SANDBOX_MERCHANT_KEY.to_owned(),
        },
    );
    let outbox = app.outbox(OutboxConfig {
        delivery_timeout: Duration::from_secs(1),
        lease: Duration::from_secs(3),
        reconcile_after: Duration::ZERO,
        backoff: Duration::from_millis(1),
        max_failures,
        ..OutboxConfig::default()
    });
    let admin = new_bearer(&app.auth, "acme", "acme-admin", Role::Admin).await;
    let payments = serve(payments::build_router(app)).await;
    let console = serve(console::router(ConsoleConfig {
        services: vec![ServiceLink {
            name: "payments".into(),
            url: payments.clone(),
        }],
        suggested_key: None,
        session: SessionLimits::default(),
    }))
    .await;
    Settling {
        _db: db,
        payments,
        console,
        provider_url,
        provider,
        outbox,
        admin,
    }
}

impl Settling {
    /// A capture of 40.00 EUR (no approval needed) for a new intent, accepted
    /// and not yet delivered; its operation id.
    async fn capture(&self, order_id: &str) -> String {
        let http = reqwest::Client::new();
        let send = |path: String, key: String, body: Value| {
            http.post(format!("{}{path}", self.payments))
                .bearer_auth("demo-acme-agent")
                .header("idempotency-key", key)
                .json(&body)
                .send()
        };
        let intent: Value = send(
            "/v1/payment_intents".into(),
            format!("intent-{order_id}"),
            json!({"order_id": order_id, "amount": "40.00", "currency": "EUR",
                   "payee": {"name": "Acme Supplies GmbH", "account": "DE89370400440532013000"}}),
        )
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        let capture = send(
            format!("/v1/payment_intents/{}/capture", intent["id"].as_str().unwrap()),
            format!("cap-{order_id}"),
            json!({}),
        )
        .await
        .unwrap();
        assert_eq!(capture.status().as_u16(), 202);
        capture.headers()["operation-id"].to_str().unwrap().to_owned()
    }

    /// A capture whose provider key another charge already holds: the
    /// reconciler finds that charge, sees it is not this capture's, and
    /// leaves the operation `unknown` for a person.
    async fn capture_left_unknown(&self, order_id: &str) -> String {
        let operation_id = self.capture(order_id).await;
        let squatted = reqwest::Client::new()
            .post(format!("{}/v1/charges", self.provider_url))
            .bearer_auth(SANDBOX_MERCHANT_KEY)
            .header("idempotency-key", outbox::external_key(&operation_id))
            .json(&json!({"amount_minor": 1, "currency": "EUR", "merchant_reference": "elsewhere"}))
            .send()
            .await
            .unwrap();
        assert_eq!(squatted.status().as_u16(), 201);
        self.outbox.deliver_due().await.unwrap();
        self.outbox.reconcile_due().await.unwrap();
        assert_eq!(self.operation(&operation_id).await["state"], "unknown");
        operation_id
    }

    /// A capture the provider charged and then answered 500: `unknown` until
    /// someone asks the provider. Its operation id and the provider's charge.
    async fn capture_left_unknown_with_its_charge(&self, order_id: &str) -> (String, String) {
        let operation_id = self.capture(order_id).await;
        self.provider.set_faults(Faults {
            answer_after_accepting: vec![500],
            ..Faults::default()
        });
        self.outbox.deliver_due().await.unwrap();
        assert_eq!(self.operation(&operation_id).await["state"], "unknown");
        let charges: Value = reqwest::Client::new()
            .get(format!("{}/v1/charges", self.provider_url))
            .bearer_auth(SANDBOX_MERCHANT_KEY)
            .query(&[("idempotency_key", outbox::external_key(&operation_id))])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let charge_id = charges["data"][0]["id"].as_str().unwrap().to_owned();
        (operation_id, charge_id)
    }

    /// A capture whose one delivery failed before the provider took it: with
    /// `max_failures: 1`, its event is dead.
    async fn capture_left_dead(&self, order_id: &str) -> String {
        let operation_id = self.capture(order_id).await;
        self.provider.set_faults(Faults {
            fail_next: 1,
            ..Faults::default()
        });
        self.outbox.deliver_due().await.unwrap();
        assert_eq!(self.operation(&operation_id).await["outbox"], "dead");
        operation_id
    }

    async fn operation(&self, operation_id: &str) -> Value {
        reqwest::Client::new()
            .get(format!("{}/v1/operations/{operation_id}", self.payments))
            // an approver sees the external system's words too
            .bearer_auth("demo-acme-approver")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

/// The form token the console put in `page`'s forms.
fn form_token(page: &str) -> String {
    let field = "name=\"form_token\" value=\"";
    let start = page.find(field).expect("a form with a token") + field.len();
    page[start..].split('"').next().unwrap().to_owned()
}

/// Posts `fields` as a form from the console's own page.
async fn post_form(
    http: &reqwest::Client,
    console_url: &str,
    path: &str,
    session: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let body: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish();
    http.post(format!("{console_url}{path}"))
        .header("cookie", session)
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// The page a console's redirect sends the browser to.
async fn followed(http: &reqwest::Client, console_url: &str, answer: reqwest::Response, session: &str) -> String {
    assert_eq!(answer.status().as_u16(), 303, "{:?}", answer.text().await);
    let location = answer.headers()["location"].to_str().unwrap().to_owned();
    get_page(http, &format!("{console_url}{location}"), session).await.1
}

async fn an_admin_settles_an_unknown_capture_in_the_console_and_its_operation_is_completed(backend: Backend) {
    let sandbox = settling_sandbox(backend, 10).await;
    let (operation_id, charge_id) = sandbox.capture_left_unknown_with_its_charge("order-1").await;
    let http = http_client();
    let session = cookie_pair(&sign_in(&http, &sandbox.console, &sandbox.admin).await);

    let (_, listed) = get_page(&http, &sandbox.console, &session).await;
    let settled = post_form(
        &http,
        &sandbox.console,
        "/resolve",
        &session,
        &[
            ("service", "payments"),
            ("operation_id", &operation_id),
            ("outcome", "completed"),
            ("evidence", "this capture's charge in the provider's dashboard"),
            ("external_ref", &charge_id),
            ("form_token", &form_token(&listed)),
        ],
    )
    .await;
    let after = followed(&http, &sandbox.console, settled, &session).await;
    let operation = sandbox.operation(&operation_id).await;

    assert!(listed.contains("Outcome unknown in payments"), "{listed}");
    assert!(listed.contains(&format!("id=\"unknown-{operation_id}\"")), "{listed}");
    assert!(listed.contains("cap-order-1"), "the key it was sent with is shown");
    assert!(listed.contains(&format!("id=\"resolve-{operation_id}\"")), "{listed}");
    assert!(
        after.contains(&format!("Settled {operation_id} of payments as completed")),
        "{after}"
    );
    assert!(
        !after.contains(&format!("id=\"unknown-{operation_id}\"")),
        "no longer listed: {after}"
    );
    assert!(after.contains("id=\"no-unknown\""), "{after}");
    assert_eq!(operation["state"], "completed", "{operation}");
    assert_eq!(operation["external_ref"], charge_id.as_str(), "{operation}");
}

async fn a_reference_the_provider_does_not_hold_for_the_operation_is_explained_in_words_and_changes_nothing(
    backend: Backend,
) {
    let sandbox = settling_sandbox(backend, 10).await;
    let operation_id = sandbox.capture_left_unknown("order-1").await;
    let http = http_client();
    let session = cookie_pair(&sign_in(&http, &sandbox.console, &sandbox.admin).await);
    let (_, listed) = get_page(&http, &sandbox.console, &session).await;

    let refused = post_form(
        &http,
        &sandbox.console,
        "/resolve",
        &session,
        &[
            ("service", "payments"),
            ("operation_id", &operation_id),
            ("outcome", "completed"),
            ("evidence", "the provider's dashboard shows a charge"),
            ("external_ref", "ch_elsewhere"),
            ("form_token", &form_token(&listed)),
        ],
    )
    .await;
    assert_eq!(refused.status().as_u16(), 200, "the page, with the problem");
    let page = refused.text().await.unwrap();

    assert!(
        page.contains("payments refused: the external system does not hold ch_elsewhere as this operation&#39;s work"),
        "{page}"
    );
    assert!(page.contains(&format!("id=\"unknown-{operation_id}\"")), "still listed");
    assert_eq!(sandbox.operation(&operation_id).await["state"], "unknown");
}

async fn a_dead_delivery_is_listed_and_an_admin_sends_it_again_from_the_console(backend: Backend) {
    let sandbox = settling_sandbox(backend, 1).await;
    let operation_id = sandbox.capture_left_dead("order-1").await;
    let http = http_client();
    let session = cookie_pair(&sign_in(&http, &sandbox.console, &sandbox.admin).await);

    let (_, listed) = get_page(&http, &sandbox.console, &session).await;
    let last_error = sandbox.operation(&operation_id).await["last_error"]
        .as_str()
        .unwrap()
        .to_owned();
    let sent = post_form(
        &http,
        &sandbox.console,
        "/redeliver",
        &session,
        &[
            ("service", "payments"),
            ("operation_id", &operation_id),
            ("form_token", &form_token(&listed)),
        ],
    )
    .await;
    let after = followed(&http, &sandbox.console, sent, &session).await;
    let given_back = sandbox.operation(&operation_id).await;
    sandbox.outbox.reconcile_due().await.unwrap();
    sandbox.outbox.deliver_due().await.unwrap();
    let delivered = sandbox.operation(&operation_id).await;

    assert!(listed.contains("Dead deliveries in payments"), "{listed}");
    assert!(listed.contains(&format!("id=\"redeliver-{operation_id}\"")), "{listed}");
    assert!(
        listed.contains(&platform::service::escape(&last_error)),
        "its last error is shown: {last_error}"
    );
    assert!(
        after.contains(&format!("Gave {operation_id} of payments back to its outbox")),
        "{after}"
    );
    assert!(
        !after.contains(&format!("id=\"redeliver-{operation_id}\"")),
        "no longer dead: {after}"
    );
    assert!(after.contains("id=\"no-dead\""), "{after}");
    assert_ne!(given_back["outbox"], "dead", "{given_back}");
    assert_eq!(delivered["outbox"], "delivered", "{delivered}");
    assert_eq!(delivered["state"], "completed", "{delivered}");
    assert_eq!(sandbox.provider.stats().charges_made, 1);
}

async fn an_approver_sees_what_needs_a_person_but_the_console_shows_the_refusal_when_they_act(backend: Backend) {
    let sandbox = settling_sandbox(backend, 1).await;
    let unknown = sandbox.capture_left_unknown("order-1").await;
    let dead = sandbox.capture_left_dead("order-2").await;
    let http = http_client();
    let session = cookie_pair(&sign_in(&http, &sandbox.console, "demo-acme-approver").await);

    let (_, listed) = get_page(&http, &sandbox.console, &session).await;
    let token = form_token(&listed);
    let settling = post_form(
        &http,
        &sandbox.console,
        "/resolve",
        &session,
        &[
            ("service", "payments"),
            ("operation_id", &unknown),
            ("outcome", "failed"),
            ("evidence", "no charge of ours at the provider"),
            ("form_token", &token),
        ],
    )
    .await;
    let settling = settling.text().await.unwrap();
    let sending = post_form(
        &http,
        &sandbox.console,
        "/redeliver",
        &session,
        &[("service", "payments"), ("operation_id", &dead), ("form_token", &token)],
    )
    .await;
    let sending = sending.text().await.unwrap();

    assert!(listed.contains(&format!("id=\"unknown-{unknown}\"")), "{listed}");
    assert!(listed.contains(&format!("id=\"redeliver-{dead}\"")), "{listed}");
    for page in [&settling, &sending] {
        assert!(
            page.contains("payments does not let this key do that: only an admin"),
            "{page}"
        );
    }
    assert_eq!(sandbox.operation(&unknown).await["state"], "unknown");
    assert_eq!(sandbox.operation(&dead).await["outbox"], "dead");
}

/// Each service keeps its own keys: `sandbox create-api-key --service
/// payments` makes one that only payments has. Such a key signs in, and the
/// page shows what each service says of it; a key no service takes as an
/// approver's or an admin's is refused with what each one said.
async fn a_key_only_one_service_has_signs_in_and_the_page_shows_what_each_service_says(backend: Backend) {
    let (tickets_db, payments_db) = (TestDb::new(backend).await, TestDb::new(backend).await);
    tickets::migrate(&tickets_db.db).await.unwrap();
    payments::migrate(&payments_db.db).await.unwrap();
    let tickets_app = tickets::App::new(tickets_db.db.clone(), IdempotencyConfig::default(), true);
    let payments_app = payments::App::new(
        payments_db.db.clone(),
        IdempotencyConfig::default(),
        true,
        ProviderConfig::default(),
    );
    let payments_admin = new_bearer(&payments_app.auth, "acme", "acme-admin", Role::Admin).await;
    let link = |name: &str, url: String| ServiceLink { name: name.into(), url };
    let services = vec![
        link("tickets", serve(tickets::build_router(tickets_app)).await),
        link("payments", serve(payments::build_router(payments_app)).await),
    ];
    let console_url = serve(console::router(ConsoleConfig {
        services,
        ..ConsoleConfig::default()
    }))
    .await;
    let http = http_client();
    let refused_key = async |key: &str| {
        http.post(format!("{console_url}/key"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("sec-fetch-site", "same-origin")
            .body(format!("key={key}"))
            .send()
            .await
            .unwrap()
    };

    let session = cookie_pair(&sign_in(&http, &console_url, &payments_admin).await);
    let (_, page) = get_page(&http, &format!("{console_url}/?service=payments"), &session).await;
    let agent = refused_key("demo-acme-agent").await;
    let agent_status = agent.status().as_u16();
    let agent_cookie = agent.headers().get("set-cookie").cloned();
    let agent_page = agent.text().await.unwrap();

    assert!(page.contains("tickets did not accept this API key"), "{page}");
    assert!(page.contains("Outcome unknown in payments"), "payments' lists: {page}");
    assert!(!page.contains("id=\"use-key\""), "signed in: {page}");
    assert_eq!(agent_status, 200, "the sign-in form again");
    assert!(agent_cookie.is_none(), "no session for an agent's key");
    for service in ["tickets", "payments"] {
        assert!(
            agent_page.contains(&format!("{service} does not let this key decide")),
            "{service}'s words: {agent_page}"
        );
    }
}

/// The console's forms, posted from another page (another site, or another
/// port of localhost, which `SameSite` cookies do not tell apart), are refused.
#[tokio::test]
async fn a_decision_posted_from_another_origin_is_refused() {
    let console_url = serve(console::router(ConsoleConfig::default())).await;
    let http = reqwest::Client::new();
    let form = "service=tickets&approval_id=apr_0123456789abcdef0123456789abcdef&fingerprint=x&decision=approve";

    let cross = http
        .post(format!("{console_url}/decide"))
        .header("cookie", "retrysafe_console_session=0123456789abcdef0123456789abcdef")
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
    the_session_cookie_is_opaque_http_only_and_same_site_strict,
    a_forged_expired_or_signed_out_session_and_a_raw_key_cookie_are_refused,
    a_decision_without_the_session_s_form_token_is_refused,
    every_console_answer_forbids_framing,
    pending_approvals_are_listed_a_page_at_a_time_with_their_count,
    a_title_with_markup_in_it_is_shown_as_text_on_the_approval_page,
    a_payee_with_hidden_characters_is_shown_with_visible_escapes_and_marked,
    an_admin_settles_an_unknown_capture_in_the_console_and_its_operation_is_completed,
    a_reference_the_provider_does_not_hold_for_the_operation_is_explained_in_words_and_changes_nothing,
    a_dead_delivery_is_listed_and_an_admin_sends_it_again_from_the_console,
    an_approver_sees_what_needs_a_person_but_the_console_shows_the_refusal_when_they_act,
    a_key_only_one_service_has_signs_in_and_the_page_shows_what_each_service_says,
);

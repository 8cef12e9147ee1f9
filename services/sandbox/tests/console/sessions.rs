//! Who gets in, and which forms the console acts on: the session cookie,
//! sessions that ended or never were, form tokens, other origins, framing.

use std::time::Duration;

use idempotency::IdempotencyConfig;
use payments::provider::ProviderConfig;
use platform::{
    Backend, Role,
    testing::{TestDb, new_bearer},
};
use sandbox::console::{self, ConsoleConfig, ServiceLink, SessionLimits};
use serde_json::Value;

use crate::{cookie_pair, create_urgent_ticket, get_page, http_client, sandbox, sandbox_with, serve, sign_in};

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
    the_session_cookie_is_opaque_http_only_and_same_site_strict,
    a_forged_expired_or_signed_out_session_and_a_raw_key_cookie_are_refused,
    a_decision_without_the_session_s_form_token_is_refused,
    every_console_answer_forbids_framing,
    a_key_only_one_service_has_signs_in_and_the_page_shows_what_each_service_says,
);

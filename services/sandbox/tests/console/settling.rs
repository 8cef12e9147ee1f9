//! What the outbox could not settle by itself, as the console lists it: an
//! admin settles an unknown outcome or sends a dead delivery again; an
//! approver sees both and is told, in words, that they may not act.

use std::time::Duration;

use idempotency::IdempotencyConfig;
use outbox::{Outbox, OutboxConfig};
use payment_provider::Faults;
use payments::provider::{Provider, ProviderConfig, SANDBOX_MERCHANT_KEY};
use platform::{
    Backend, Role,
    testing::{TestDb, new_bearer},
};
use sandbox::console::{self, ConsoleConfig, ServiceLink, SessionLimits};
use serde_json::{Value, json};

use crate::{as_text, cookie_pair, get_page, http_client, serve, sign_in};

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
    /// and not yet delivered; its operation id and the key it is charged under.
    async fn capture(&self, order_id: &str) -> (String, String) {
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
        let operation_id = capture.headers()["operation-id"].to_str().unwrap().to_owned();
        let capture: Value = capture.json().await.unwrap();
        (
            operation_id,
            capture["provider_idempotency_key"].as_str().unwrap().to_owned(),
        )
    }

    /// A capture whose provider key another charge already holds: the
    /// reconciler finds that charge, sees it is not this capture's, and
    /// leaves the operation `unknown` for a person.
    async fn capture_left_unknown(&self, order_id: &str) -> String {
        let (operation_id, key) = self.capture(order_id).await;
        let squatted = reqwest::Client::new()
            .post(format!("{}/v1/charges", self.provider_url))
            .bearer_auth(SANDBOX_MERCHANT_KEY)
            .header("idempotency-key", &key)
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
        let (operation_id, key) = self.capture(order_id).await;
        self.provider.set_faults(Faults {
            answer_after_accepting: vec![500],
            ..Faults::default()
        });
        self.outbox.deliver_due().await.unwrap();
        assert_eq!(self.operation(&operation_id).await["state"], "unknown");
        let charges: Value = reqwest::Client::new()
            .get(format!("{}/v1/charges", self.provider_url))
            .bearer_auth(SANDBOX_MERCHANT_KEY)
            .query(&[("idempotency_key", &key)])
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
        let (operation_id, _) = self.capture(order_id).await;
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
        as_text(&listed).contains(&last_error),
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

platform::both_backends!(
    an_admin_settles_an_unknown_capture_in_the_console_and_its_operation_is_completed,
    a_reference_the_provider_does_not_hold_for_the_operation_is_explained_in_words_and_changes_nothing,
    a_dead_delivery_is_listed_and_an_admin_sends_it_again_from_the_console,
    an_approver_sees_what_needs_a_person_but_the_console_shows_the_refusal_when_they_act,
);

//! The three services on fresh databases, each seeded with one resource of
//! every kind in account `acme` (and an approval of globex's own, waiting) —
//! and the principals who ask for them.
//!
//! Each service is driven in process (a `TestClient` over its router) and
//! served on a loopback port too, for the console. The outbox and the
//! deployment watcher are driven by hand while seeding, and never after: no
//! cell's answer depends on a delivery racing it.

use std::{collections::BTreeMap, time::Duration};

use axum::http::StatusCode;
use idempotency::IdempotencyConfig;
use platform::{
    Backend, Role,
    testing::{ACME_AGENT, ACME_APPROVER, GLOBEX_AGENT, GLOBEX_APPROVER, TestClient, TestDb, TestResponse, new_bearer},
};
use serde_json::{Value, json};
use tickets::domain::{Priority, TicketsPolicy};

/// Who sends a request: nobody, a key no service has, or a role of an account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Principal {
    Nobody,
    UnknownKey,
    /// The account whose resources every request names.
    Acme(Role),
    /// Another account, naming acme's resources.
    Globex(Role),
}

/// Every principal, in the order of [`crate::table::Row::expect`]'s columns.
pub const PRINCIPALS: [Principal; 8] = [
    Principal::Nobody,
    Principal::UnknownKey,
    Principal::Acme(Role::Agent),
    Principal::Acme(Role::Approver),
    Principal::Acme(Role::Admin),
    Principal::Globex(Role::Agent),
    Principal::Globex(Role::Approver),
    Principal::Globex(Role::Admin),
];

/// A well-formed key that no service has.
const UNKNOWN_KEY: &str = "rs_0123456789abcdef0123456789abcdef";

/// What the seeding made, by name: the ids a row's path, query and body are
/// filled from. An acme value is acme's alone, and no answer to anyone else
/// may show it; a shared one (a service's or an environment's name) may be
/// anyone's.
#[derive(Debug, Default)]
pub struct Seeds(BTreeMap<&'static str, (String, bool)>);

impl Seeds {
    fn acme(&mut self, name: &'static str, value: impl Into<String>) {
        self.0.insert(name, (value.into(), true));
    }

    fn shared(&mut self, name: &'static str, value: &str) {
        self.0.insert(name, (value.to_owned(), false));
    }

    #[track_caller]
    pub fn get(&self, name: &str) -> &str {
        &self.0.get(name).unwrap_or_else(|| panic!("no seed `{name}`")).0
    }

    /// Every value that is acme's alone.
    pub fn acme_values(&self) -> impl Iterator<Item = &str> {
        self.0
            .values()
            .filter(|(_, acme)| *acme)
            .map(|(value, _)| value.as_str())
    }
}

/// One seeded service.
pub struct Seeded {
    pub name: &'static str,
    pub client: TestClient,
    /// Where it is served on loopback, for the console.
    pub url: String,
    pub seeds: Seeds,
    /// The admins' keys: the demo keys have none.
    acme_admin: String,
    globex_admin: String,
    _db: TestDb,
}

impl Seeded {
    /// The bearer key `who` sends, if any.
    pub fn bearer(&self, who: Principal) -> Option<&str> {
        Some(match who {
            Principal::Nobody => return None,
            Principal::UnknownKey => UNKNOWN_KEY,
            Principal::Acme(Role::Agent) => ACME_AGENT,
            Principal::Acme(Role::Approver) => ACME_APPROVER,
            Principal::Acme(Role::Admin) => &self.acme_admin,
            Principal::Globex(Role::Agent) => GLOBEX_AGENT,
            Principal::Globex(Role::Approver) => GLOBEX_APPROVER,
            Principal::Globex(Role::Admin) => &self.globex_admin,
        })
    }

    /// The service's own OpenAPI document, as it serves it.
    pub async fn document(&self) -> Value {
        let served = self.client.get("/openapi.json", ACME_AGENT).await;
        assert_eq!(served.status, StatusCode::OK);
        served.json()
    }

    /// A GET as acme's approver, who may read everything acme has.
    pub async fn read(&self, path: &str) -> Value {
        let answer = self.client.get(path, ACME_APPROVER).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {:?}", answer.body);
        answer.json()
    }
}

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

#[track_caller]
fn expect(answer: &TestResponse, status: u16) {
    assert_eq!(answer.status.as_u16(), status, "seeding: {:?}", answer.body);
}

/// acme's approver rejects the approval a 202 asked for; its id and fingerprint.
async fn reject(client: &TestClient, requested: &TestResponse) -> (String, String) {
    let (approval_id, fingerprint) = (requested.str("approval_id"), requested.str("fingerprint"));
    let decided = client
        .post(
            &format!("/v1/approvals/{approval_id}/decision"),
            ACME_APPROVER,
            None,
            json!({"decision": "reject", "fingerprint": fingerprint}),
        )
        .await;
    expect(&decided, 200);
    (approval_id, fingerprint)
}

/// The seeds every service has: an operation that finished (`operation_id`,
/// sent with `idempotency_key`), an approval nobody decided yet
/// (`approval_id`) and one acme's approver rejected (`decided_approval_id`,
/// with the `decided_fingerprint` it was decided on).
fn operation_seeds(
    seeds: &mut Seeds,
    finished: &TestResponse,
    key: &str,
    pending: &TestResponse,
    (decided, fingerprint): (String, String),
) {
    seeds.acme("operation_id", finished.operation_id());
    seeds.acme("idempotency_key", key);
    seeds.acme("approval_id", pending.str("approval_id"));
    seeds.acme("pending_operation_id", pending.str("operation_id"));
    seeds.acme("decided_approval_id", decided);
    seeds.acme("decided_fingerprint", fingerprint);
}

async fn admins(auth: &platform::Authenticator) -> (String, String) {
    (
        new_bearer(auth, "acme", "acme-admin", Role::Admin).await,
        new_bearer(auth, "globex", "globex-admin", Role::Admin).await,
    )
}

/// Tickets, where urgent tickets wait for an approver: a ticket with a
/// comment, an urgent one waiting, and an urgent one rejected (and one of
/// globex's waiting, as in every service: its people have something to decide).
pub async fn tickets(backend: Backend) -> Seeded {
    let db = TestDb::new(backend).await;
    tickets::migrate(&db.db).await.unwrap();
    let policy = TicketsPolicy {
        approval_from: Some(Priority::Urgent),
    };
    let app = tickets::App::new(db.db.clone(), IdempotencyConfig::default(), true).with_policy(policy);
    let (acme_admin, globex_admin) = admins(&app.auth).await;
    let router = tickets::build_router(app);
    let client = TestClient::new(router.clone());
    let mut seeds = Seeds::default();

    let ticket = json!({"project": "matrix", "title": "Seeded ticket"});
    let created = client
        .post("/v1/tickets", ACME_AGENT, Some("seed-ticket"), ticket)
        .await;
    expect(&created, 201);
    let ticket_id = created.str("id");
    let comment = client
        .post(
            &format!("/v1/tickets/{ticket_id}/comments"),
            ACME_AGENT,
            Some("seed-comment"),
            json!({"body": "Seeded comment"}),
        )
        .await;
    expect(&comment, 201);
    let urgent = |title: &str| json!({"project": "matrix", "title": title, "priority": "urgent"});
    let pending = client
        .post("/v1/tickets", ACME_AGENT, Some("seed-pending"), urgent("Waits"))
        .await;
    expect(&pending, 202);
    let rejected = client
        .post("/v1/tickets", ACME_AGENT, Some("seed-rejected"), urgent("Refused"))
        .await;
    expect(&rejected, 202);
    let decided = reject(&client, &rejected).await;
    let theirs = client
        .post("/v1/tickets", GLOBEX_AGENT, Some("seed-globex"), urgent("Globex's own"))
        .await;
    expect(&theirs, 202);

    seeds.acme("ticket_id", ticket_id);
    seeds.acme("comment_id", comment.str("id"));
    operation_seeds(&mut seeds, &created, "seed-ticket", &pending, decided);
    Seeded {
        name: "tickets",
        url: serve(router).await,
        client,
        seeds,
        acme_admin,
        globex_admin,
        _db: db,
    }
}

/// Payments against the simulated provider: an intent captured and charged,
/// with a refund; an intent cancelled; a capture waiting for an approver and
/// one rejected; and a capture whose outcome is unknown (the provider holds
/// another charge under its key, so the reconciler leaves it for a person).
pub async fn payments(backend: Backend) -> Seeded {
    let db = TestDb::new(backend).await;
    payments::migrate(&db.db).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(payment_provider::serve(
        listener,
        payment_provider::Provider::default(),
        Default::default(),
        std::future::pending(),
    ));
    let provider = payments::provider::ProviderConfig {
        url: provider_url.clone(),
        merchant_key: payments::provider::SANDBOX_MERCHANT_KEY.to_owned(),
    };
    let app = payments::App::new(db.db.clone(), IdempotencyConfig::default(), true, provider);
    let outbox = app.outbox(outbox::OutboxConfig {
        delivery_timeout: Duration::from_secs(2),
        reconcile_after: Duration::ZERO,
        backoff: Duration::from_millis(1),
        ..outbox::OutboxConfig::default()
    });
    let (acme_admin, globex_admin) = admins(&app.auth).await;
    let router = payments::build_router(app);
    let client = TestClient::new(router.clone());
    let mut seeds = Seeds::default();

    let intent = async |order: &str, amount: &str| {
        let body = json!({"order_id": order, "amount": amount, "currency": "EUR",
                          "payee": {"name": "Acme Supplies GmbH", "account": "DE89370400440532013000"}});
        let key = format!("seed-intent-{order}");
        let created = client.post("/v1/payment_intents", ACME_AGENT, Some(&key), body).await;
        expect(&created, 201);
        (created, key)
    };
    let capture = async |intent: &TestResponse, key: &str| {
        let path = format!("/v1/payment_intents/{}/capture", intent.str("id"));
        client.post(&path, ACME_AGENT, Some(key), json!({})).await
    };

    let (paid, paid_key) = intent("seed-paid", "40.00").await;
    let captured = capture(&paid, "seed-capture").await;
    expect(&captured, 202);
    outbox.deliver_due().await.unwrap();
    let refund = client
        .post(
            &format!("/v1/payment_intents/{}/refunds", paid.str("id")),
            ACME_AGENT,
            Some("seed-refund"),
            json!({"amount": "10.00"}),
        )
        .await;
    expect(&refund, 202);
    outbox.deliver_due().await.unwrap();

    let (cancelled, _) = intent("seed-cancelled", "5.00").await;
    let cancel = client
        .post(
            &format!("/v1/payment_intents/{}/cancel", cancelled.str("id")),
            ACME_AGENT,
            None,
            "",
        )
        .await;
    expect(&cancel, 200);

    let (big, _) = intent("seed-big", "2500.00").await;
    let pending = capture(&big, "seed-capture-pending").await;
    expect(&pending, 202);
    let (refused, _) = intent("seed-big-refused", "2500.00").await;
    let rejected = capture(&refused, "seed-capture-rejected").await;
    expect(&rejected, 202);
    let decided = reject(&client, &rejected).await;
    let theirs = client
        .post(
            "/v1/payment_intents",
            GLOBEX_AGENT,
            Some("seed-globex-intent"),
            json!({"order_id": "seed-globex", "amount": "2500.00", "currency": "EUR",
               "payee": {"name": "Globex Corporation", "account": "DE89370400440532013000"}}),
        )
        .await;
    expect(&theirs, 201);
    let theirs = client
        .post(
            &format!("/v1/payment_intents/{}/capture", theirs.str("id")),
            GLOBEX_AGENT,
            Some("seed-globex-capture"),
            json!({}),
        )
        .await;
    expect(&theirs, 202);

    let (lost, _) = intent("seed-unknown", "40.00").await;
    let unknown = capture(&lost, "seed-capture-unknown").await;
    expect(&unknown, 202);
    let squatted = reqwest::Client::new()
        .post(format!("{provider_url}/v1/charges"))
        .bearer_auth(payments::provider::SANDBOX_MERCHANT_KEY)
        .header("idempotency-key", unknown.str("provider_idempotency_key"))
        .json(&json!({"amount_minor": 1, "currency": "EUR", "merchant_reference": "elsewhere"}))
        .send()
        .await
        .unwrap();
    assert_eq!(squatted.status().as_u16(), 201);
    outbox.deliver_due().await.unwrap();
    outbox.reconcile_due().await.unwrap();

    seeds.acme("intent_id", paid.str("id"));
    seeds.acme("capture_id", captured.str("id"));
    seeds.acme("refund_id", refund.str("id"));
    seeds.acme("cancelled_intent_id", cancelled.str("id"));
    seeds.acme("unknown_operation_id", unknown.operation_id());
    operation_seeds(&mut seeds, &paid, &paid_key, &pending, decided);
    let seeded = Seeded {
        name: "payments",
        url: serve(router).await,
        client,
        seeds,
        acme_admin,
        globex_admin,
        _db: db,
    };
    let capture = seeded
        .read(&format!("/v1/captures/{}", seeded.seeds.get("capture_id")))
        .await;
    assert_eq!(capture["state"], "succeeded", "seeding: {capture}");
    let unknown = seeded
        .read(&format!("/v1/operations/{}", seeded.seeds.get("unknown_operation_id")))
        .await;
    assert_eq!(unknown["state"], "unknown", "seeding: {unknown}");
    seeded
}

/// A digest of an artifact that exists nowhere but is well formed.
pub fn digest(fill: char) -> String {
    format!("sha256:{}", fill.to_string().repeat(64))
}

/// Deployments against the simulated controller: two releases of checkout
/// rolled out to staging, a rollback to the first approved and queued, a
/// production deployment waiting for an approver and one rejected, and a
/// deployment cancelled before it reached the controller.
pub async fn deployments(backend: Backend) -> Seeded {
    let db = TestDb::new(backend).await;
    deployments::migrate(&db.db).await.unwrap();
    let controller = deploy_controller::Controller::open(deploy_controller::ControllerConfig {
        step: Duration::from_millis(10),
        ..Default::default()
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let controller_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(deploy_controller::serve(
        listener,
        controller,
        Default::default(),
        std::future::pending(),
    ));
    let app = deployments::App::new(
        db.db.clone(),
        IdempotencyConfig::default(),
        true,
        deployments::controller::ControllerConfig {
            url: controller_url,
            api_key: deployments::controller::SANDBOX_CONTROLLER_KEY.to_owned(),
        },
    );
    let outbox = app.outbox(outbox::OutboxConfig {
        delivery_timeout: Duration::from_secs(2),
        backoff: Duration::from_millis(1),
        ..outbox::OutboxConfig::default()
    });
    let (acme_admin, globex_admin) = admins(&app.auth).await;
    let router = deployments::build_router(app.clone());
    let client = TestClient::new(router.clone());
    let mut seeds = Seeds::default();

    let release = |environment: &str, fill: char| json!({"service": "checkout", "environment": environment, "artifact_digest": digest(fill)});
    let rolled_out = async |key: &str, fill: char| {
        let accepted = client
            .post("/v1/deployments", ACME_AGENT, Some(key), release("staging", fill))
            .await;
        expect(&accepted, 202);
        outbox.deliver_due().await.unwrap();
        let id = accepted.str("id");
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                app.controller.watch_once(&app.idempotency).await.unwrap();
                let deployment = client.get(&format!("/v1/deployments/{id}"), ACME_AGENT).await.json();
                if deployment["state"] == "succeeded" {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("seeding: {id} never succeeded"));
        (accepted, id)
    };
    let (_, first) = rolled_out("seed-first", 'a').await;
    let (current, current_id) = rolled_out("seed-current", 'b').await;

    let rollback =
        json!({"service": "checkout", "environment": "staging", "to_deployment_id": first, "reason": "seeded"});
    let asked = client
        .post("/v1/rollbacks", ACME_AGENT, Some("seed-rollback"), rollback.clone())
        .await;
    expect(&asked, 202);
    let approved = client
        .post(
            &format!("/v1/approvals/{}/decision", asked.str("approval_id")),
            ACME_APPROVER,
            None,
            json!({"decision": "approve", "fingerprint": asked.str("fingerprint")}),
        )
        .await;
    expect(&approved, 200);
    let queued = client
        .post("/v1/rollbacks", ACME_AGENT, Some("seed-rollback"), rollback)
        .await;
    expect(&queued, 202);
    assert_eq!(queued.json()["state"], "queued", "seeding: {:?}", queued.body);

    let pending = client
        .post(
            "/v1/deployments",
            ACME_AGENT,
            Some("seed-production"),
            release("production", 'c'),
        )
        .await;
    expect(&pending, 202);
    let rejected = client
        .post(
            "/v1/deployments",
            ACME_AGENT,
            Some("seed-refused"),
            release("production", 'd'),
        )
        .await;
    expect(&rejected, 202);
    let decided = reject(&client, &rejected).await;
    let theirs = client
        .post(
            "/v1/deployments",
            GLOBEX_AGENT,
            Some("seed-globex"),
            release("production", 'c'),
        )
        .await;
    expect(&theirs, 202);

    let withdrawn = client
        .post(
            "/v1/deployments",
            ACME_AGENT,
            Some("seed-withdrawn"),
            release("development", 'e'),
        )
        .await;
    expect(&withdrawn, 202);
    let cancel = client
        .post(
            &format!("/v1/deployments/{}/cancel", withdrawn.str("id")),
            ACME_AGENT,
            None,
            "",
        )
        .await;
    expect(&cancel, 200);

    seeds.acme("deployment_id", current_id);
    seeds.acme("first_deployment_id", first);
    seeds.acme("rollback_id", queued.str("id"));
    seeds.acme("cancelled_deployment_id", withdrawn.str("id"));
    seeds.shared("service", "checkout");
    seeds.shared("environment", "staging");
    operation_seeds(&mut seeds, &current, "seed-current", &pending, decided);
    Seeded {
        name: "deployments",
        url: serve(router).await,
        client,
        seeds,
        acme_admin,
        globex_admin,
        _db: db,
    }
}

/// The three services, seeded.
pub async fn world(backend: Backend) -> [Seeded; 3] {
    [
        tickets(backend).await,
        payments(backend).await,
        deployments(backend).await,
    ]
}

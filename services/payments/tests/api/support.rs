//! One payments service on a fresh database, driven without a socket, and the
//! simulated payment provider it charges through, on a real loopback port.
//! The outbox is driven by hand ([`TestApp::deliver`], [`TestApp::reconcile`]),
//! so each test says exactly when a delivery happens.

use std::time::Duration;

use axum::{
    body::Body,
    http::{Request, StatusCode},
};
use idempotency::IdempotencyConfig;
use outbox::{Outbox, OutboxConfig};
use payment_provider::{Faults, Stats};
use payments::{
    domain::PaymentsPolicy,
    provider::{Provider, ProviderConfig},
};
pub use platform::testing::{ACME_AGENT, ACME_APPROVER, GLOBEX_AGENT, TestResponse};
use platform::testing::{LoopbackServer, TestClient, TestDb};
use platform::{Backend, Role, on_pool};
use serde_json::{Value, json};

/// How long the outbox waits for the provider's answer in these tests.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(1);

pub struct TestApp {
    pub service: payments::App,
    pub client: TestClient,
    pub db: TestDb,
    pub outbox: Outbox<Provider>,
    pub provider: TestProvider,
}

/// The simulated provider, serving on a loopback port for as long as the
/// test runs, unless the test takes it down ([`TestProvider::server`]).
pub struct TestProvider {
    pub url: String,
    pub state: payment_provider::Provider,
    pub server: LoopbackServer,
}

impl TestProvider {
    pub async fn start() -> TestProvider {
        let state = payment_provider::Provider::default();
        let server = LoopbackServer::start(payment_provider::router(state.clone())).await;
        TestProvider {
            url: server.url.clone(),
            state,
            server,
        }
    }

    pub fn stats(&self) -> Stats {
        self.state.stats()
    }

    pub fn set_faults(&self, faults: Faults) {
        self.state.set_faults(faults);
    }

    /// The provider's charges under an idempotency key, as a merchant would look them up.
    pub async fn charges_with_key(&self, key: &str) -> Value {
        reqwest::Client::new()
            .get(format!("{}/v1/charges", self.url))
            .bearer_auth(payments::provider::SANDBOX_MERCHANT_KEY)
            .query(&[("idempotency_key", key)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

/// The test outbox: answers within a second or they are lost, a held event is
/// free again after three, an unknown outcome may be asked about at once, and
/// what was not accepted may be sent again at once.
pub fn outbox_config() -> OutboxConfig {
    OutboxConfig {
        delivery_timeout: DELIVERY_TIMEOUT,
        lease: Duration::from_secs(3),
        reconcile_after: Duration::ZERO,
        backoff: Duration::from_millis(1),
        ..OutboxConfig::default()
    }
}

impl TestApp {
    /// The sandbox's policy: captures from 1,000 EUR (150,000 JPY, 300 KWD…)
    /// wait for an approver, and every capture in a currency without a threshold.
    pub async fn spawn(backend: Backend) -> TestApp {
        TestApp::spawn_with(backend, PaymentsPolicy::default()).await
    }

    pub async fn spawn_with(backend: Backend, policy: PaymentsPolicy) -> TestApp {
        TestApp::spawn_configured(backend, policy, IdempotencyConfig::default()).await
    }

    pub async fn spawn_configured(backend: Backend, policy: PaymentsPolicy, idempotency: IdempotencyConfig) -> TestApp {
        let db = TestDb::new(backend).await;
        payments::migrate(&db.db).await.expect("migrations apply");
        let provider = TestProvider::start().await;
        let provider_config = ProviderConfig {
            url: provider.url.clone(),
            merchant_key: payments::provider::SANDBOX_MERCHANT_KEY.to_owned(),
        };
        let app = payments::App::new(db.db.clone(), idempotency, true, provider_config).with_policy(policy);
        TestApp {
            outbox: app.outbox(outbox_config()),
            client: TestClient::new(payments::build_router(app.clone())),
            service: app,
            db,
            provider,
        }
    }

    /// A new API key in the database, for a principal the demo keys do not have.
    pub async fn create_key(&self, account_id: &str, principal_id: &str, role: Role) -> String {
        platform::testing::new_bearer(&self.service.auth, account_id, principal_id, role).await
    }

    pub async fn send(&self, request: Request<Body>) -> TestResponse {
        self.client.send(request).await
    }

    pub async fn post(&self, path: &str, bearer: &str, key: &str, body: &Value) -> TestResponse {
        self.client.post(path, bearer, Some(key), body).await
    }

    pub async fn get(&self, path: &str, bearer: &str) -> TestResponse {
        self.client.get(path, bearer).await
    }

    /// A POST with no `Idempotency-Key` and no body.
    pub async fn post_without_key(&self, path: &str) -> TestResponse {
        let request = Request::post(path)
            .header("authorization", format!("Bearer {ACME_AGENT}"))
            .body(Body::empty())
            .unwrap();
        self.send(request).await
    }

    pub async fn create(&self, key: &str, order_id: &str) -> TestResponse {
        self.post("/v1/payment_intents", ACME_AGENT, key, &intent(order_id, json!("5.00")))
            .await
    }

    /// A new intent for `amount` EUR; its id.
    pub async fn intent_for(&self, order_id: &str, amount: &str) -> String {
        let created = self
            .post(
                "/v1/payment_intents",
                ACME_AGENT,
                &format!("intent-{order_id}"),
                &intent(order_id, json!(amount)),
            )
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
        created.str("id")
    }

    pub async fn capture(&self, intent_id: &str, key: &str, body: &Value) -> TestResponse {
        self.post(
            &format!("/v1/payment_intents/{intent_id}/capture"),
            ACME_AGENT,
            key,
            body,
        )
        .await
    }

    pub async fn refund(&self, intent_id: &str, key: &str, amount: &str) -> TestResponse {
        self.post(
            &format!("/v1/payment_intents/{intent_id}/refunds"),
            ACME_AGENT,
            key,
            &json!({"amount": amount}),
        )
        .await
    }

    /// An intent of `amount` EUR whose whole amount was captured and charged.
    pub async fn captured_intent(&self, order_id: &str, amount: &str) -> String {
        let intent_id = self.intent_for(order_id, amount).await;
        let capture = self
            .capture(&intent_id, &format!("capture-{order_id}"), &json!({}))
            .await;
        assert_eq!(capture.status, StatusCode::ACCEPTED, "{:?}", capture.body);
        self.deliver().await;
        let capture = self
            .get(&format!("/v1/captures/{}", capture.str("id")), ACME_AGENT)
            .await;
        assert_eq!(capture.json()["state"], "succeeded", "{:?}", capture.body);
        intent_id
    }

    /// Another outbox on the same database and provider (another process's, say).
    pub fn another_outbox(&self, config: OutboxConfig) -> Outbox<Provider> {
        self.service.outbox(config)
    }

    /// One round of the outbox worker: every due event sent and settled.
    pub async fn deliver(&self) -> usize {
        self.outbox.deliver_due().await.expect("the outbox takes its events")
    }

    /// One round of the reconciler.
    pub async fn reconcile(&self) -> usize {
        self.outbox
            .reconcile_due()
            .await
            .expect("the reconciler takes its events")
    }

    pub async fn operation(&self, operation_id: &str) -> Value {
        self.get(&format!("/v1/operations/{operation_id}"), ACME_AGENT)
            .await
            .json()
    }

    /// The journal's events of one operation, in order, as an approver reads them.
    pub async fn journal_events(&self, operation_id: &str) -> Vec<String> {
        let entries = self
            .get(&format!("/v1/audit?operation_id={operation_id}"), ACME_APPROVER)
            .await
            .json();
        entries["data"]
            .as_array()
            .unwrap_or_else(|| panic!("journal entries, got {entries}"))
            .iter()
            .map(|entry| entry["event"].as_str().unwrap().to_owned())
            .collect()
    }

    pub async fn count(&self, table: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {table}");
        on_pool!(self.db.db.read(), |pool| sqlx::query_scalar::<_, i64>(
            sqlx::AssertSqlSafe(sql.as_str())
        )
        .fetch_one(pool)
        .await
        .unwrap())
    }

    /// An approver's decision on an approval, echoing `fingerprint`.
    pub async fn decide(&self, approval_id: &str, decision: &str, fingerprint: &str) -> TestResponse {
        self.post(
            &format!("/v1/approvals/{approval_id}/decision"),
            ACME_APPROVER,
            &format!("decide-{approval_id}"),
            &json!({"decision": decision, "fingerprint": fingerprint}),
        )
        .await
    }
}

pub fn intent(order_id: &str, amount: Value) -> Value {
    json!({
        "order_id": order_id,
        "amount": amount,
        "currency": "EUR",
        "payee": {"name": "Acme Supplies GmbH", "account": "DE89370400440532013000"},
    })
}

//! A tickets app on a fresh database, driven in process (no socket) by a
//! [`TestClient`], and the helpers of the tickets' own tests.

use axum::{body::Body, http::Request};
use idempotency::IdempotencyConfig;
pub use platform::testing::{
    ACME_AGENT, ACME_APPROVER, GLOBEX_AGENT, GLOBEX_APPROVER, TestClient, TestDb, TestResponse, json_request,
};
use platform::{Backend, Role, on_pool};
use tickets::{
    App,
    domain::{Priority, TicketsPolicy},
};

pub struct TestApp {
    pub client: TestClient,
    pub app: App,
    pub db: TestDb,
}

impl TestApp {
    pub async fn spawn(backend: Backend) -> TestApp {
        TestApp::spawn_with(backend, IdempotencyConfig::default()).await
    }

    pub async fn spawn_with(backend: Backend, config: IdempotencyConfig) -> TestApp {
        TestApp::spawn_with_policy(backend, config, TicketsPolicy::default()).await
    }

    /// An app whose urgent tickets wait for a human (`TICKETS_APPROVAL_PRIORITY=urgent`).
    pub async fn spawn_with_approvals(backend: Backend, config: IdempotencyConfig) -> TestApp {
        let policy = TicketsPolicy {
            approval_from: Some(Priority::Urgent),
        };
        TestApp::spawn_with_policy(backend, config, policy).await
    }

    pub async fn spawn_with_policy(backend: Backend, config: IdempotencyConfig, policy: TicketsPolicy) -> TestApp {
        let db = TestDb::new(backend).await;
        tickets::migrate(&db.db).await.expect("migrations apply");
        let app = App::new(db.db.clone(), config, true).with_policy(policy);
        TestApp {
            client: TestClient::new(tickets::build_router(app.clone())),
            app,
            db,
        }
    }

    /// A new API key in the database, for a principal the demo keys do not have.
    pub async fn create_key(&self, account_id: &str, principal_id: &str, role: Role) -> String {
        platform::testing::new_bearer(&self.app.auth, account_id, principal_id, role).await
    }

    pub async fn send(&self, request: Request<Body>) -> TestResponse {
        self.client.send(request).await
    }

    pub async fn post(&self, path: &str, bearer: &str, key: Option<&str>, body: &str) -> TestResponse {
        self.client.post(path, bearer, key, body).await
    }

    pub async fn get(&self, path: &str, bearer: &str) -> TestResponse {
        self.client.get(path, bearer).await
    }

    pub async fn create_ticket(&self, key: &str, body: &str) -> TestResponse {
        self.post("/v1/tickets", ACME_AGENT, Some(key), body).await
    }

    /// Counts rows straight from the database: what really happened.
    pub async fn count(&self, sql: &'static str) -> i64 {
        on_pool!(self.db.db.read(), |pool| sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(pool)
            .await
            .unwrap())
    }

    pub async fn ticket_count(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM tickets").await
    }
}

pub const ROTATE_CERT: &str = r#"{"project":"ops","title":"Rotate staging certificate","priority":"high"}"#;

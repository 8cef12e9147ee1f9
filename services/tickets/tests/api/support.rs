//! A tickets app on a fresh database, driven in-process (no socket) with
//! `Router::oneshot`, and helpers that read its answers.

use axum::{
    Router,
    body::{Body, Bytes},
    http::{HeaderMap, Method, Request, StatusCode},
};
use http_body_util::BodyExt;
use idempotency::IdempotencyConfig;
use platform::{Backend, on_pool, testing::TestDb};
use platform::{Principal, Role};
use serde_json::Value;
use tickets::{
    App,
    domain::{Priority, TicketsPolicy},
};
use tower::ServiceExt;

pub const ACME_AGENT: &str = "demo-acme-agent";
pub const GLOBEX_AGENT: &str = "demo-globex-agent";
pub const ACME_APPROVER: &str = "demo-acme-approver";
pub const GLOBEX_APPROVER: &str = "demo-globex-approver";

pub struct TestApp {
    pub router: Router,
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
            router: tickets::build_router(app.clone()),
            app,
            db,
        }
    }

    /// A new API key in the database, for a principal the demo keys do not have.
    pub async fn create_key(&self, account_id: &str, principal_id: &str, role: Role) -> String {
        let principal = Principal {
            account_id: account_id.into(),
            principal_id: principal_id.into(),
            role,
        };
        self.app.auth.create_key(&principal).await.unwrap().expose().to_owned()
    }

    pub async fn send(&self, request: Request<Body>) -> TestResponse {
        let response = self.router.clone().oneshot(request).await.expect("the router answers");
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.expect("a body").to_bytes();
        TestResponse { status, headers, body }
    }

    /// A POST as an agent would send it: bearer key, JSON, and a key if given.
    pub async fn post(&self, path: &str, bearer: &str, key: Option<&str>, body: &str) -> TestResponse {
        self.send(json_request(Method::POST, path, bearer, key, body)).await
    }

    pub async fn create_ticket(&self, key: &str, body: &str) -> TestResponse {
        self.post("/v1/tickets", ACME_AGENT, Some(key), body).await
    }

    pub async fn get(&self, path: &str, bearer: &str) -> TestResponse {
        let request = Request::get(path)
            .header("authorization", format!("Bearer {bearer}"))
            .body(Body::empty())
            .unwrap();
        self.send(request).await
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

pub fn json_request(method: Method, path: &str, bearer: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {bearer}"))
        .header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body.to_owned())).unwrap()
}

#[derive(Debug, Clone)]
pub struct TestResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl TestResponse {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| panic!("a JSON body, got {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn operation_id(&self) -> &str {
        self.header("operation-id").expect("an Operation-Id header")
    }

    pub fn replayed(&self) -> Option<&str> {
        self.header("idempotent-replayed")
    }

    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }

    /// Asserts a problem+json answer with this status and `code`.
    #[track_caller]
    pub fn assert_problem(&self, status: u16, code: &str) {
        assert_eq!(self.status.as_u16(), status, "status of {:?}", self.body);
        assert_eq!(self.header("content-type"), Some("application/problem+json"));
        assert_eq!(self.code(), code, "code of {:?}", self.body);
    }
}

pub const ROTATE_CERT: &str = r#"{"project":"ops","title":"Rotate staging certificate","priority":"high"}"#;

/// The member names of a JSON object, read from its bytes in order and with
/// repeats kept (a `serde_json::Value` would keep only the last of two).
pub fn member_names(body: &[u8]) -> Vec<String> {
    struct Names;
    impl<'de> serde::de::Visitor<'de> for Names {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut members: A) -> Result<Vec<String>, A::Error> {
            let mut names = Vec::new();
            while let Some((name, _)) = members.next_entry::<String, serde::de::IgnoredAny>()? {
                names.push(name);
            }
            Ok(names)
        }
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    serde::Deserializer::deserialize_map(&mut deserializer, Names).expect("a JSON object")
}

//! Test support: a fresh database per test on either backend, the
//! [`both_backends!`](crate::both_backends) macro that runs one test body on
//! SQLite and on PostgreSQL, [`TestClient`], which sends a service requests
//! as an agent does and reads each answer whole into a [`TestResponse`],
//! [`ServiceProcess`], a service binary run as a real process for tests that
//! kill it, and [`LoopbackServer`], a simulated external system a test takes
//! down and brings back.
//!
//! PostgreSQL is found at `TEST_DATABASE_URL` (else `DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/postgres`). Where it cannot be reached,
//! the PostgreSQL half of each test says so and passes — except under
//! `CI=true`, where an unreachable PostgreSQL fails the test.

mod forwarder;
mod process;
pub mod standby;

use std::{fmt::Display, str::FromStr};

use axum::{
    Router,
    body::{Body, Bytes},
    http::{HeaderMap, Method, Request, StatusCode},
};
use serde_json::Value;
use sqlx::{
    ConnectOptions, Connection,
    postgres::{PgConnectOptions, PgConnection},
};
use tokio::sync::OnceCell;
use tower::ServiceExt;

pub use self::forwarder::TcpForwarder;
pub use self::process::{ServiceProcess, create_api_key, help_of, keys_made_by_create_api_key_act_with_their_roles};
use crate::{
    auth::{Authenticator, Principal, Role},
    db::{Backend, Db},
};

/// A database made for one test and dropped after it.
#[derive(Debug)]
pub struct TestDb {
    pub db: Db,
    /// The URL a separate process (a real service binary) can open.
    pub url: String,
    cleanup: Cleanup,
}

#[derive(Debug)]
enum Cleanup {
    Sqlite(#[allow(dead_code)] tempfile::TempDir),
    Postgres { admin_url: String, database: String },
}

pub fn postgres_admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .ok()
        .filter(|u| u.starts_with("postgres"))
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether tests on `backend` can run here. Under `CI=true` an unreachable
/// PostgreSQL panics instead of answering `false`.
pub async fn backend_available(backend: Backend) -> bool {
    static POSTGRES: OnceCell<Result<(), String>> = OnceCell::const_new();
    if backend == Backend::Sqlite {
        return true;
    }
    let reachable = POSTGRES
        .get_or_init(|| async {
            let options = PgConnectOptions::from_str(&postgres_admin_url()).map_err(|e| e.to_string())?;
            let connection = tokio::time::timeout(std::time::Duration::from_secs(5), options.connect())
                .await
                .map_err(|_| "timed out".to_owned())?
                .map_err(|e| e.to_string())?;
            connection.close().await.map_err(|e| e.to_string())
        })
        .await;
    match reachable {
        Ok(()) => true,
        Err(e) if in_ci() => panic!(
            "PostgreSQL at {} is unreachable under CI=true: {e}",
            postgres_admin_url()
        ),
        Err(e) => {
            eprintln!(
                "skipped: PostgreSQL at {} is unreachable ({e}); set TEST_DATABASE_URL to run this half",
                postgres_admin_url()
            );
            false
        }
    }
}

impl TestDb {
    /// A new, empty database (no migrations applied).
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let url = format!("sqlite://{}", dir.path().join("test.db").display());
                let db = Db::connect(&url, 16).await.expect("a SQLite test database");
                TestDb {
                    db,
                    url,
                    cleanup: Cleanup::Sqlite(dir),
                }
            }
            Backend::Postgres => {
                let admin_url = postgres_admin_url();
                let database = format!("rs_test_{}", uuid::Uuid::new_v4().simple());
                let options = PgConnectOptions::from_str(&admin_url).expect("a PostgreSQL URL");
                let url = options.clone().database(&database).to_url_lossy().to_string();
                // Db::connect creates the database
                let db = Db::connect(&url, 16).await.expect("a PostgreSQL test database");
                TestDb {
                    db,
                    url,
                    cleanup: Cleanup::Postgres { admin_url, database },
                }
            }
        }
    }

    pub fn backend(&self) -> Backend {
        self.db.backend()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Cleanup::Postgres { admin_url, database } = &self.cleanup {
            let (admin_url, database, db) = (admin_url.clone(), database.clone(), self.db.clone());
            // Drop runs inside the test's runtime, so the async clean-up gets a thread of its own.
            let _ = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                runtime.block_on(async move {
                    db.close().await;
                    let mut admin = PgConnection::connect(&admin_url).await.ok()?;
                    let drop = format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)");
                    sqlx::query(sqlx::AssertSqlSafe(drop)).execute(&mut admin).await.ok()?;
                    admin.close().await.ok()
                })
            })
            .join();
        }
    }
}

/// Runs each named `async fn name(backend: Backend)` twice, as
/// `sqlite::name` and `postgres::name`: one test body on both backends.
///
/// ```ignore
/// async fn replay_returns_the_stored_answer(backend: Backend) { /* … */ }
/// platform::both_backends!(replay_returns_the_stored_answer);
/// ```
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::db::Backend::Sqlite).await
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if $crate::testing::backend_available($crate::db::Backend::Postgres).await {
                        super::$name($crate::db::Backend::Postgres).await
                    }
                }
            )+
        }
    };
}

/// The sandbox's demo keys ([`DEMO_KEYS`](crate::auth::DEMO_KEYS)), by the
/// names tests give them.
pub const ACME_AGENT: &str = "demo-acme-agent";
pub const ACME_APPROVER: &str = "demo-acme-approver";
pub const GLOBEX_AGENT: &str = "demo-globex-agent";
pub const GLOBEX_APPROVER: &str = "demo-globex-approver";

/// A client of one service: in process through its `Router` with
/// `oneshot` (no socket), or over HTTP to a [`ServiceProcess`]. Either way a
/// test reads the same [`TestResponse`].
#[derive(Debug, Clone)]
pub struct TestClient(Transport);

#[derive(Debug, Clone)]
enum Transport {
    Router(Router),
    Http { base: String, client: reqwest::Client },
}

impl TestClient {
    /// Requests go straight to `router`.
    pub fn new(router: Router) -> TestClient {
        TestClient(Transport::Router(router))
    }

    /// Requests go over HTTP to `base` (`http://127.0.0.1:<port>`); one with
    /// no answer within 20 seconds fails.
    pub fn http(base: &str) -> TestClient {
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(20))
            .build()
            .expect("an HTTP client");
        TestClient(Transport::Http {
            base: base.to_owned(),
            client,
        })
    }

    /// `request`'s answer, read whole.
    pub async fn send(&self, request: Request<Body>) -> TestResponse {
        self.try_send(request).await.expect("the service answers")
    }

    /// `request`'s answer, or why none came (over HTTP: the process died,
    /// say). In process there is always an answer.
    pub async fn try_send(&self, request: Request<Body>) -> reqwest::Result<TestResponse> {
        match &self.0 {
            Transport::Router(router) => {
                let response = router.clone().oneshot(request).await.expect("the router answers");
                let (parts, body) = response.into_parts();
                Ok(TestResponse {
                    status: parts.status,
                    headers: parts.headers,
                    body: axum::body::to_bytes(body, usize::MAX).await.expect("a body"),
                })
            }
            Transport::Http { base, client } => {
                let (parts, body) = request.into_parts();
                let body = axum::body::to_bytes(body, usize::MAX).await.expect("a request body");
                let response = client
                    .request(parts.method, format!("{base}{}", parts.uri))
                    .headers(parts.headers)
                    .body(body)
                    .send()
                    .await?;
                Ok(TestResponse {
                    status: response.status(),
                    headers: response.headers().clone(),
                    body: response.bytes().await?,
                })
            }
        }
    }

    /// A POST as an agent sends it: see [`json_request`].
    pub async fn post(&self, path: &str, bearer: &str, key: Option<&str>, body: impl Display) -> TestResponse {
        self.send(json_request(Method::POST, path, bearer, key, body)).await
    }

    /// A GET with a bearer key.
    pub async fn get(&self, path: &str, bearer: &str) -> TestResponse {
        let request = Request::get(path)
            .header("authorization", format!("Bearer {bearer}"))
            .body(Body::empty())
            .expect("a request");
        self.send(request).await
    }
}

/// A request as an agent sends it: a bearer key, a JSON `body` (its text, or
/// a `serde_json::Value`), and an `Idempotency-Key` if one is given.
pub fn json_request(method: Method, path: &str, bearer: &str, key: Option<&str>, body: impl Display) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {bearer}"))
        .header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body.to_string())).expect("a request")
}

/// One answer, read whole, and what tests ask of it.
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

    /// A string member of the JSON body.
    pub fn str(&self, member: &str) -> String {
        self.json()[member]
            .as_str()
            .unwrap_or_else(|| panic!("`{member}` in {:?}", self.body))
            .to_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn operation_id(&self) -> &str {
        self.header("operation-id").expect("an Operation-Id header")
    }

    /// `Idempotent-Replayed`: `"true"` for a stored answer, `"false"` for a
    /// first execution, absent where no key was claimed.
    pub fn replayed(&self) -> Option<&str> {
        self.header("idempotent-replayed")
    }

    /// The problem's `code`, or `""`.
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

    /// The member names of the JSON object in the body, in order and with
    /// repeats kept (a `serde_json::Value` would keep only the last of two).
    pub fn member_names(&self) -> Vec<String> {
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
        let mut deserializer = serde_json::Deserializer::from_slice(&self.body);
        serde::Deserializer::deserialize_map(&mut deserializer, Names).expect("a JSON object")
    }
}

/// A router served on a loopback port — a simulated external system — that a
/// test takes down ([`LoopbackServer::go_down`]: every connection refused,
/// as when the system is down) and brings back on the same port
/// ([`LoopbackServer::come_back`]), its state as it was.
#[derive(Debug)]
pub struct LoopbackServer {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    addr: std::net::SocketAddr,
    router: Router,
    serving: tokio::sync::Mutex<Option<Serving>>,
}

/// The server while it is up: what stops it, and its task.
#[derive(Debug)]
struct Serving {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl LoopbackServer {
    pub async fn start(router: Router) -> LoopbackServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = Serving::on(listener, router.clone());
        LoopbackServer {
            url: format!("http://{addr}"),
            addr,
            router,
            serving: tokio::sync::Mutex::new(Some(serving)),
        }
    }

    /// Stops serving, once the requests under way are answered; the port is closed.
    pub async fn go_down(&self) {
        if let Some(Serving { stop, task }) = self.serving.lock().await.take() {
            let _ = stop.send(());
            task.await
                .expect("the server stops")
                .expect("the server stopped cleanly");
        }
    }

    /// Serves again on the same port.
    pub async fn come_back(&self) {
        let mut serving = self.serving.lock().await;
        if serving.is_none() {
            let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
            *serving = Some(Serving::on(listener, self.router.clone()));
        }
    }
}

impl Serving {
    fn on(listener: tokio::net::TcpListener, router: Router) -> Serving {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async {
            let _ = stopped.await;
        };
        let task = tokio::spawn(crate::serve(listener, router, Default::default(), shutdown));
        Serving { stop, task }
    }
}

/// Stores a new API key for a principal the demo keys do not have, and
/// returns the plain key to send as a bearer.
pub async fn new_bearer(auth: &Authenticator, account_id: &str, principal_id: &str, role: Role) -> String {
    let principal = Principal {
        account_id: account_id.into(),
        principal_id: principal_id.into(),
        role,
    };
    auth.create_key(&principal)
        .await
        .expect("the key is stored")
        .expose()
        .to_owned()
}

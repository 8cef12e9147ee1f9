//! One deployments service on a fresh database, driven without a socket, and
//! the simulated deployment controller it hands rollouts to, on a real
//! loopback port. The outbox and the watcher are driven by hand, so each test
//! says exactly when a rollout is handed over and when it is followed.

use std::time::Duration;

use axum::http::StatusCode;
use deploy_controller::{ControllerConfig as SimulatedConfig, Faults, Stats};
use deployments::controller::{Controller, ControllerConfig, SANDBOX_CONTROLLER_KEY};
use idempotency::IdempotencyConfig;
use outbox::{Outbox, OutboxConfig};
use platform::Backend;
pub use platform::testing::{ACME_AGENT, ACME_APPROVER, GLOBEX_AGENT, TestResponse};
use platform::testing::{LoopbackServer, TestClient, TestDb};
use serde_json::{Value, json};

/// How long each phase of a simulated rollout takes here.
pub const STEP: Duration = Duration::from_millis(250);
/// A controller slow enough that a test can act while a rollout runs,
/// however loaded the machine.
pub const SLOW_STEP: Duration = Duration::from_secs(2);

/// The article's two commits, and two releases built from them.
pub const COMMIT_A1B2C3: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678";
pub const COMMIT_D4E5F6: &str = "d4e5f60718293a4b5c6d7e8f9012345678a1b2c3";

pub fn digest(fill: char) -> String {
    format!("sha256:{}", fill.to_string().repeat(64))
}

pub struct TestApp {
    pub service: deployments::App,
    pub client: TestClient,
    pub db: TestDb,
    pub outbox: Outbox<Controller>,
    pub controller: TestController,
}

/// The simulated controller, serving on a loopback port for as long as the
/// test runs, unless the test takes it down ([`TestController::server`]).
pub struct TestController {
    pub url: String,
    pub state: deploy_controller::Controller,
    pub server: LoopbackServer,
}

impl TestController {
    pub async fn start(step: Duration) -> TestController {
        let state = deploy_controller::Controller::open(SimulatedConfig {
            step,
            ..SimulatedConfig::default()
        })
        .unwrap();
        let server = LoopbackServer::start(deploy_controller::router(state.clone())).await;
        TestController {
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
}

/// The test outbox: answers within a second or they are lost, an unknown
/// outcome may be asked about at once.
pub fn outbox_config() -> OutboxConfig {
    OutboxConfig {
        delivery_timeout: Duration::from_secs(1),
        lease: Duration::from_secs(3),
        reconcile_after: Duration::ZERO,
        backoff: Duration::from_millis(1),
        ..OutboxConfig::default()
    }
}

impl TestApp {
    /// The sandbox's policy: production deployments and every rollback wait for an approver.
    pub async fn spawn(backend: Backend) -> TestApp {
        TestApp::spawn_with_step(backend, STEP).await
    }

    /// With a controller whose rollout phases take `step` each.
    pub async fn spawn_with_step(backend: Backend, step: Duration) -> TestApp {
        TestApp::spawn_configured(backend, step, Default::default()).await
    }

    /// With a controller whose rollout phases take `step` each, and the layer's `idempotency` settings.
    pub async fn spawn_configured(backend: Backend, step: Duration, idempotency: IdempotencyConfig) -> TestApp {
        let db = TestDb::new(backend).await;
        deployments::migrate(&db.db).await.expect("migrations apply");
        let controller = TestController::start(step).await;
        let config = ControllerConfig {
            url: controller.url.clone(),
            api_key: SANDBOX_CONTROLLER_KEY.to_owned(),
        };
        let service = deployments::App::new(db.db.clone(), idempotency, true, config);
        TestApp {
            outbox: service.outbox(outbox_config()),
            client: TestClient::new(deployments::build_router(service.clone())),
            service,
            db,
            controller,
        }
    }

    /// A new API key in the database, for a principal the demo keys do not have.
    pub async fn create_key(&self, account_id: &str, principal_id: &str, role: platform::Role) -> String {
        platform::testing::new_bearer(&self.service.auth, account_id, principal_id, role).await
    }

    pub async fn post(&self, path: &str, bearer: &str, key: Option<&str>, body: &Value) -> TestResponse {
        self.client.post(path, bearer, key, body).await
    }

    pub async fn get(&self, path: &str, bearer: &str) -> TestResponse {
        self.client.get(path, bearer).await
    }

    /// An agent's deployment request.
    pub async fn deploy(&self, key: &str, body: &Value) -> TestResponse {
        self.post("/v1/deployments", ACME_AGENT, Some(key), body).await
    }

    pub async fn rollback(&self, key: &str, body: &Value) -> TestResponse {
        self.post("/v1/rollbacks", ACME_AGENT, Some(key), body).await
    }

    pub async fn deployment(&self, id: &str) -> Value {
        self.get(&format!("/v1/deployments/{id}"), ACME_AGENT).await.json()
    }

    pub async fn environment(&self, service: &str, environment: &str) -> Value {
        self.get(&format!("/v1/environments/{service}/{environment}"), ACME_AGENT)
            .await
            .json()
    }

    pub async fn operation(&self, operation_id: &str) -> Value {
        self.get(&format!("/v1/operations/{operation_id}"), ACME_AGENT)
            .await
            .json()
    }

    /// The journal's events about an operation, in order, as an approver reads them.
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

    /// One round of the outbox worker: every due rollout handed to the controller.
    pub async fn deliver(&self) -> usize {
        self.outbox.deliver_due().await.expect("the outbox takes its events")
    }

    pub async fn reconcile(&self) -> usize {
        self.outbox
            .reconcile_due()
            .await
            .expect("the reconciler takes its events")
    }

    /// Follows rollouts until the deployment is in `state` (within twenty seconds).
    pub async fn until(&self, deployment_id: &str, state: &str) -> Value {
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                self.service
                    .controller
                    .watch_once(&self.service.idempotency)
                    .await
                    .unwrap();
                let deployment = self.deployment(deployment_id).await;
                if deployment["state"] == state {
                    return deployment;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{deployment_id} never became {state}"))
    }

    /// A deployment asked for, handed over and rolled out; its id.
    pub async fn deployed(&self, key: &str, body: &Value) -> String {
        let accepted = self.deploy(key, body).await;
        assert_eq!(accepted.status, StatusCode::ACCEPTED, "{:?}", accepted.body);
        self.deliver().await;
        let id = accepted.str("id");
        self.until(&id, "succeeded").await;
        id
    }

    /// An approver's decision on the approval request `request` (a 202 body).
    pub async fn decide(&self, request: &Value, decision: &str, fingerprint: &str) -> TestResponse {
        self.post(
            &format!("/v1/approvals/{}/decision", request["approval_id"].as_str().unwrap()),
            ACME_APPROVER,
            None,
            &json!({"decision": decision, "fingerprint": fingerprint}),
        )
        .await
    }
}

/// A deployment request of `digest` (and `commit`) to `environment` of checkout.
pub fn release(environment: &str, digest: &str, commit: Option<&str>) -> Value {
    json!({
        "service": "checkout",
        "environment": environment,
        "artifact_digest": digest,
        "commit_sha": commit,
    })
}

//! The whole sandbox, really killed: SIGKILL while a capture's charge is at
//! the simulated provider and its answer has not come back, then a new
//! sandbox on the same data directory. The provider kept its charge in its
//! state file, so the reconciler finds it and nothing is charged twice — as a
//! real provider, which does not forget on restart, would behave.
//!
//! Payments runs on the backend under test; the other services stay on
//! SQLite in the sandbox's data directory.

use std::time::Duration;

use platform::{
    Backend,
    testing::{ServiceProcess, TestDb},
};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The sandbox's ports, free when it starts, the same across its restart.
struct Ports(Vec<(&'static str, String)>);

impl Ports {
    /// Seven free ports below the range the system hands out to outgoing
    /// connections (32768 up), so no client connection takes one meanwhile.
    async fn free() -> Ports {
        let variables = [
            "TICKETS_ADDR",
            "PAYMENTS_ADDR",
            "DEPLOYMENTS_ADDR",
            "CONSOLE_ADDR",
            "PAYMENT_PROVIDER_ADDR",
            "DEPLOY_CONTROLLER_ADDR",
            "MCP_ADDR",
        ];
        let start = 20_000 + (uuid::Uuid::new_v4().as_u128() % 10_000) as u16;
        let mut held = Vec::new();
        for port in start.. {
            if let Ok(listener) = tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
                held.push(listener);
            }
            if held.len() == variables.len() {
                break;
            }
        }
        let addrs = held.iter().map(|l| l.local_addr().unwrap().to_string());
        Ports(variables.into_iter().zip(addrs).collect())
    }

    fn provider(&self) -> String {
        let (_, addr) = self.0.iter().find(|(v, _)| *v == "PAYMENT_PROVIDER_ADDR").unwrap();
        format!("http://{addr}")
    }
}

/// A running sandbox process.
struct Sandbox {
    process: ServiceProcess,
    provider: String,
}

impl Sandbox {
    async fn start(data_dir: &std::path::Path, database_url: &str, ports: &Ports) -> Sandbox {
        let data_dir = data_dir.display().to_string();
        let mut env: Vec<(&str, &str)> = vec![
            ("RETRYSAFE_DATA_DIR", &data_dir),
            ("PAYMENTS_DATABASE_URL", database_url),
            // an answer is waited for 5 s, far longer than the test takes to
            // kill the sandbox; a held event is free again after 6 s
            ("RETRYSAFE_OUTBOX_LEASE_SECONDS", "6"),
            ("RETRYSAFE_OUTBOX_TIMEOUT_SECONDS", "5"),
            ("RETRYSAFE_RECONCILE_AFTER_SECONDS", "0.2"),
        ];
        env.extend(ports.0.iter().map(|(variable, addr)| (*variable, addr.as_str())));
        let process = ServiceProcess::start(env!("CARGO_BIN_EXE_sandbox"), "payments", &env).await;
        Sandbox {
            process,
            provider: ports.provider(),
        }
    }

    async fn post(&self, path: &str, key: &str, body: &Value) -> reqwest::Response {
        client()
            .post(format!("{}{path}", self.process.base))
            .bearer_auth("demo-acme-agent")
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    async fn get(&self, path: &str) -> Value {
        client()
            .get(format!("{}{path}", self.process.base))
            .bearer_auth("demo-acme-agent")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The charges the provider holds for a merchant reference, as the
    /// payments service's merchant sees them.
    async fn charges_for(&self, reference: &str) -> Vec<Value> {
        let found: Value = client()
            .get(format!("{}/v1/charges", self.provider))
            .query(&[("merchant_reference", reference)])
            .bearer_auth(payments::provider::SANDBOX_MERCHANT_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        found["data"].as_array().unwrap().clone()
    }

    /// The provider accepts the next charge and never answers it.
    async fn drop_next_answer(&self) {
        let switched = client()
            .put(format!("{}/admin/faults", self.provider))
            .json(&json!({"drop_next": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(switched.status(), StatusCode::OK);
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Waits (up to 30 s) until `found` gives something.
async fn eventually<T>(mut found: impl AsyncFnMut() -> Option<T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(value) = found().await {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("within 30 s")
}

async fn a_capture_in_flight_when_the_whole_sandbox_is_killed_is_charged_once_after_restart(backend: Backend) {
    let db = TestDb::new(backend).await;
    let data_dir = tempfile::tempdir().unwrap();
    let ports = Ports::free().await;
    let doomed = Sandbox::start(data_dir.path(), &db.url, &ports).await;
    doomed.drop_next_answer().await;
    let intent = doomed
        .post(
            "/v1/payment_intents",
            "intent-1",
            &json!({"order_id": "order-1", "amount": "40.00", "currency": "EUR",
                    "payee": {"name": "Acme Supplies GmbH", "account": "DE89370400440532013000"}}),
        )
        .await;
    assert_eq!(intent.status(), StatusCode::CREATED);
    let intent_id = intent.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let accepted = doomed
        .post(&format!("/v1/payment_intents/{intent_id}/capture"), "cap-1", &json!({}))
        .await;
    assert_eq!(accepted.status(), StatusCode::ACCEPTED);
    let capture = accepted.json::<Value>().await.unwrap();
    let capture_id = capture["id"].as_str().unwrap().to_owned();
    // the charge's merchant reference is the capture's provider key, derived from the request
    let reference = capture["provider_idempotency_key"].as_str().unwrap().to_owned();
    // charged, and its answer held back: the capture is in flight
    let charged = eventually(async || doomed.charges_for(&reference).await.pop()).await;
    let in_flight = doomed.get(&format!("/v1/captures/{capture_id}")).await;
    assert_ne!(in_flight["state"], "succeeded", "the answer has not come back");
    doomed.process.kill().await;

    let restarted = Sandbox::start(data_dir.path(), &db.url, &ports).await;
    let settled = eventually(async || {
        let capture = restarted.get(&format!("/v1/captures/{capture_id}")).await;
        (capture["state"] == "succeeded").then_some(capture)
    })
    .await;
    let intent = restarted.get(&format!("/v1/payment_intents/{intent_id}")).await;
    let charges = restarted.charges_for(&reference).await;
    restarted.process.kill().await;

    assert_eq!(charges.len(), 1, "one charge across the restart: {charges:?}");
    assert_eq!(charges[0]["id"], charged["id"], "the charge made before the kill");
    assert_eq!(settled["provider_charge_id"], charged["id"]);
    assert_eq!(intent["state"], "succeeded");
}

platform::both_backends!(a_capture_in_flight_when_the_whole_sandbox_is_killed_is_charged_once_after_restart);

//! What the process tests share: the `payments` binary started as a real
//! process, and the simulated provider it charges through.

use std::time::Duration;

use platform::testing::{ACME_AGENT, ServiceProcess, TestResponse};
use serde_json::{Value, json};

/// A running `payments` process.
pub struct Payments(pub ServiceProcess);

impl Payments {
    /// Starts one on `database_url`, its outbox worker held at `fail_point`
    /// if one is given (until the test kills it).
    pub async fn start(database_url: &str, provider_url: &str, fail_point: Option<&str>) -> Payments {
        let fail_point = fail_point.map(|point| format!("{point}=return"));
        let mut env = vec![
            ("PAYMENTS_DATABASE_URL", database_url),
            ("PAYMENTS_PROVIDER_URL", provider_url),
            // a held event is free again after 2 s; an answer is lost after 1 s
            ("RETRYSAFE_OUTBOX_LEASE_SECONDS", "2"),
            ("RETRYSAFE_OUTBOX_TIMEOUT_SECONDS", "1"),
            ("RETRYSAFE_RECONCILE_AFTER_SECONDS", "0.2"),
        ];
        env.extend(fail_point.as_deref().map(|point| ("FAILPOINTS", point)));
        Payments(ServiceProcess::start(env!("CARGO_BIN_EXE_payments"), "payments", &env).await)
    }

    /// A POST as the demo agent, with an idempotency key.
    pub async fn post(&self, path: &str, key: &str, body: &Value) -> TestResponse {
        self.0.client().post(path, ACME_AGENT, Some(key), body).await
    }

    pub async fn get(&self, path: &str, bearer: &str) -> Value {
        self.0.client().get(path, bearer).await.json()
    }

    /// Asks until the capture has succeeded (within 30 s).
    pub async fn until_succeeded(&self, capture_id: &str) -> Value {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let capture = self.get(&format!("/v1/captures/{capture_id}"), ACME_AGENT).await;
                if capture["state"] == "succeeded" {
                    return capture;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("capture {capture_id} never succeeded"))
    }
}

/// A payment intent's body for `order_id`.
pub fn intent(order_id: &str) -> Value {
    json!({"order_id": order_id, "amount": "40.00", "currency": "EUR",
           "payee": {"name": "Acme Supplies GmbH", "account": "DE89370400440532013000"}})
}

/// The simulated provider, in the test process: it is the external system, not what dies.
pub async fn provider() -> (payment_provider::Provider, String) {
    let provider = payment_provider::Provider::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(payment_provider::serve(
        listener,
        provider.clone(),
        Default::default(),
        std::future::pending(),
    ));
    (provider, url)
}

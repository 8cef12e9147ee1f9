//! One variable moves the whole sandbox: with `RETRYSAFE_BASE_PORT` every
//! server keeps its distance from 7000, and the services still find the
//! simulators and each other where they moved to.

use platform::testing::ServiceProcess;
use reqwest::StatusCode;
use serde_json::json;

/// Each server's distance from the base, as the README lays them out.
const OFFSETS: [(&str, u16); 7] = [
    ("console", 0),
    ("tickets", 1),
    ("payments", 2),
    ("deployments", 3),
    ("mcp", 4),
    ("payment provider", 101),
    ("deployment controller", 102),
];

/// A base whose seven ports are free now, below the range the system hands
/// out to outgoing connections, so no client connection takes one meanwhile.
async fn free_base() -> u16 {
    let start = 20_000 + (uuid::Uuid::new_v4().as_u128() % 10_000) as u16;
    for base in (start..30_000).step_by(7) {
        let mut free = true;
        for (_, offset) in OFFSETS {
            if tokio::net::TcpListener::bind(("127.0.0.1", base + offset))
                .await
                .is_err()
            {
                free = false;
                break;
            }
        }
        if free {
            return base;
        }
    }
    panic!("no free base port from {start}");
}

#[tokio::test]
async fn a_base_port_moves_every_server_of_the_sandbox_and_a_capture_still_reaches_the_provider() {
    let data_dir = tempfile::tempdir().unwrap();
    let base = free_base().await;
    let (base_port, dir) = (base.to_string(), data_dir.path().display().to_string());
    let sandbox = ServiceProcess::start(
        env!("CARGO_BIN_EXE_sandbox"),
        "tickets",
        &[
            ("RETRYSAFE_BASE_PORT", &base_port),
            // no address of its own: the base decides
            ("TICKETS_ADDR", ""),
            ("RETRYSAFE_DATA_DIR", &dir),
        ],
    )
    .await;
    assert_eq!(sandbox.base, format!("http://127.0.0.1:{}", base + 1));

    let client = reqwest::Client::new();
    for (server, offset) in OFFSETS {
        let answer = client
            .get(format!("http://127.0.0.1:{}/healthz", base + offset))
            .send()
            .await
            .unwrap_or_else(|e| panic!("the {server} answers at base + {offset}: {e}"));
        assert_eq!(answer.status(), StatusCode::OK, "the {server}'s /healthz");
    }

    // payments found the provider where the base put it: the capture is charged
    let payments = format!("http://127.0.0.1:{}", base + 2);
    let post = |path: String, key: &'static str, body: serde_json::Value| {
        client
            .post(format!("{payments}{path}"))
            .bearer_auth("demo-acme-agent")
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let intent = post(
        "/v1/payment_intents".into(),
        "base-port-intent",
        json!({"order_id": "order-1", "amount": "12.00", "currency": "EUR",
               "payee": {"name": "Acme Supplies GmbH", "account": "DE89370400440532013000"}}),
    )
    .await
    .unwrap();
    assert_eq!(intent.status(), StatusCode::CREATED);
    let intent: serde_json::Value = intent.json().await.unwrap();
    let intent_id = intent["id"].as_str().expect("the intent has an id");
    let capture = post(
        format!("/v1/payment_intents/{intent_id}/capture"),
        "base-port-capture",
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(capture.status(), StatusCode::ACCEPTED);
    let capture: serde_json::Value = capture.json().await.unwrap();
    // the charge's merchant reference is the capture's provider key, derived from the request
    let reference = capture["provider_idempotency_key"]
        .as_str()
        .expect("the capture has a provider key");
    let charged = async {
        loop {
            let charges: serde_json::Value = client
                .get(format!("http://127.0.0.1:{}/v1/charges", base + 101))
                .query(&[("merchant_reference", reference)])
                .bearer_auth(payments::provider::SANDBOX_MERCHANT_KEY)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if charges["data"].as_array().is_some_and(|c| !c.is_empty()) {
                return charges;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), charged)
        .await
        .expect("the provider at base + 101 holds the capture's charge");
}

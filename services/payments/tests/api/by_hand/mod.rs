//! What a person does when the outbox cannot settle a capture by itself
//! (docs/contract.md §5): an event that failed too often is dead and waits
//! for an admin to send it again; a capture whose outcome the reconciler can
//! never learn is settled by an admin, with evidence, through the writes the
//! reconciler would make.

mod dead;
mod evidence;
mod settle;
mod who;

use axum::http::StatusCode;
use outbox::OutboxConfig;
use payment_provider::Faults;
use serde_json::{Value, json};

use crate::support::{ACME_APPROVER, TestApp, outbox_config};

/// Three failures make an event dead in these tests.
fn dying_outbox() -> OutboxConfig {
    OutboxConfig {
        max_failures: 3,
        ..outbox_config()
    }
}

/// A capture whose provider key another charge already holds: the reconciler
/// finds that charge, sees it is not this capture's, and leaves it `unknown`
/// for a person — forever, on its own. Its operation id, its intent's id
/// and its first answer.
async fn capture_left_unknown_by_a_key_collision(app: &TestApp, order_id: &str) -> (String, String, Value) {
    let intent_id = app.intent_for(order_id, "40.00").await;
    let accepted = app.capture(&intent_id, &format!("cap-{order_id}"), &json!({})).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{:?}", accepted.body);
    let operation_id = accepted.operation_id().to_owned();
    let squatted = reqwest::Client::new()
        .post(format!("{}/v1/charges", app.provider.url))
        .bearer_auth(payments::provider::SANDBOX_MERCHANT_KEY)
        .header("idempotency-key", accepted.str("provider_idempotency_key"))
        .json(&json!({"amount_minor": 1, "currency": "EUR", "merchant_reference": "elsewhere"}))
        .send()
        .await
        .unwrap();
    assert_eq!(squatted.status(), reqwest::StatusCode::CREATED);
    app.deliver().await;
    app.reconcile().await;
    assert_eq!(app.operation(&operation_id).await["state"], "unknown");
    (operation_id, intent_id, accepted.json())
}

/// A capture the provider charged and then answered 500: its outcome is
/// `unknown` until the reconciler, or a person, asks the provider. Its
/// operation id, its intent's id, its first answer and the provider's charge.
async fn capture_left_unknown_with_its_charge_made(app: &TestApp, order_id: &str) -> (String, String, Value, String) {
    let intent_id = app.intent_for(order_id, "40.00").await;
    app.provider.set_faults(Faults {
        answer_after_accepting: vec![500],
        ..Faults::default()
    });
    let accepted = app.capture(&intent_id, &format!("cap-{order_id}"), &json!({})).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{:?}", accepted.body);
    let operation_id = accepted.operation_id().to_owned();
    app.deliver().await;
    assert_eq!(app.operation(&operation_id).await["state"], "unknown");
    let charges = app
        .provider
        .charges_with_key(&accepted.str("provider_idempotency_key"))
        .await;
    let charge_id = charges["data"][0]["id"]
        .as_str()
        .expect("the provider's charge")
        .to_owned();
    (operation_id, intent_id, accepted.json(), charge_id)
}

/// A capture the provider failed with a 503 before taking it: its outcome is
/// `unknown` to the service, and the provider charged nothing. Its operation
/// id, its intent's id and its first answer.
async fn capture_left_unknown_with_nothing_charged(app: &TestApp, order_id: &str) -> (String, String, Value) {
    let intent_id = app.intent_for(order_id, "40.00").await;
    app.provider.set_faults(Faults {
        fail_next: 1,
        ..Faults::default()
    });
    let accepted = app.capture(&intent_id, &format!("cap-{order_id}"), &json!({})).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{:?}", accepted.body);
    let operation_id = accepted.operation_id().to_owned();
    app.deliver().await;
    assert_eq!(app.operation(&operation_id).await["state"], "unknown");
    (operation_id, intent_id, accepted.json())
}

/// The journal entries of one operation, as an approver reads them.
async fn journal(app: &TestApp, operation_id: &str) -> Vec<Value> {
    let entries = app
        .get(&format!("/v1/audit?operation_id={operation_id}"), ACME_APPROVER)
        .await
        .json();
    entries["data"].as_array().unwrap().clone()
}

async fn resolve(app: &TestApp, bearer: &str, operation_id: &str, body: &Value) -> platform::testing::TestResponse {
    app.client
        .post(&format!("/v1/operations/{operation_id}/resolution"), bearer, None, body)
        .await
}

async fn redeliver(app: &TestApp, bearer: &str, operation_id: &str) -> platform::testing::TestResponse {
    app.client
        .post(&format!("/v1/operations/{operation_id}/redelivery"), bearer, None, "{}")
        .await
}

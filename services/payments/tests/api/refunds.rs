//! Refunds: each instruction its own operation, through the outbox, and
//! never — under any race — more than was captured.

use std::sync::Arc;

use axum::http::StatusCode;
use futures::future::join_all;
use platform::{Backend, on_pool};
use serde_json::json;

use crate::support::{ACME_AGENT, TestApp};

async fn racing_refunds_never_add_up_to_more_than_was_captured(backend: Backend) {
    let app = Arc::new(TestApp::spawn(backend).await);
    let intent_id = app.captured_intent("order-1", "10.00").await;

    let racers = join_all((0..16).map(|n| {
        let (app, intent_id) = (app.clone(), intent_id.clone());
        tokio::spawn(async move { app.refund(&intent_id, &format!("refund-{n}"), "1.50").await })
    }))
    .await;
    app.deliver().await;

    let answers: Vec<_> = racers.into_iter().map(|r| r.unwrap()).collect();
    let accepted = answers.iter().filter(|a| a.status == StatusCode::ACCEPTED).count();
    assert_eq!(accepted, 6, "six refunds of 1.50 fit in 10.00, a seventh does not");
    for refused in answers.iter().filter(|a| a.status != StatusCode::ACCEPTED) {
        assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
        assert_eq!(refused.json()["code"], "refund_exceeds_captured");
        assert_eq!(refused.json()["amount_refundable"], "1.00");
    }
    let refunded: i64 = on_pool!(app.db.db.read(), |pool| sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(amount_minor), 0) AS BIGINT) FROM payment_refunds"
    )
    .fetch_one(pool)
    .await
    .unwrap());
    assert_eq!(
        refunded, 900,
        "the accepted refunds add up to 9.00 of the 10.00 captured"
    );
    assert_eq!(app.provider.stats().refunds_made, 6);
    let listed = app
        .get(&format!("/v1/payment_intents/{intent_id}/refunds"), ACME_AGENT)
        .await
        .json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 6);
    assert!(
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["state"] == "succeeded")
    );
}

async fn a_refund_goes_to_the_provider_and_one_the_provider_refuses_gives_its_amount_back(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.captured_intent("order-1", "10.00").await;

    let first = app.refund(&intent_id, "refund-1", "4.00").await;
    app.deliver().await;
    let second = app.refund(&intent_id, "refund-2", "6.00").await;
    // someone refunded most of the charge at the provider directly: ours no longer fits there
    let capture_id = app
        .get(&format!("/v1/payment_intents/{intent_id}"), ACME_AGENT)
        .await
        .str("capture_id");
    let charge_id = app
        .get(&format!("/v1/captures/{capture_id}"), ACME_AGENT)
        .await
        .str("provider_charge_id");
    let squatted = reqwest::Client::new()
        .post(format!("{}/v1/refunds", app.provider.url))
        .bearer_auth(payments::provider::SANDBOX_MERCHANT_KEY)
        .header("idempotency-key", "refunded-elsewhere")
        .json(&json!({"charge_id": charge_id, "amount_minor": 500, "merchant_reference": "elsewhere"}))
        .send()
        .await
        .unwrap();
    assert_eq!(squatted.status(), reqwest::StatusCode::CREATED);
    app.deliver().await;
    let first_now = app
        .get(&format!("/v1/refunds/{}", first.str("id")), ACME_AGENT)
        .await
        .json();
    let second_now = app
        .get(&format!("/v1/refunds/{}", second.str("id")), ACME_AGENT)
        .await
        .json();
    let capture = app.get(&format!("/v1/captures/{capture_id}"), ACME_AGENT).await.json();
    let third = app.refund(&intent_id, "refund-3", "6.00").await;

    assert_eq!(first.status, StatusCode::ACCEPTED, "{:?}", first.body);
    assert_eq!(first.json()["state"], "processing");
    assert_eq!(first_now["state"], "succeeded");
    assert!(first_now["provider_refund_id"].as_str().unwrap().starts_with("re_"));
    assert_eq!(second.status, StatusCode::ACCEPTED);
    assert_eq!(second_now["state"], "failed");
    assert_eq!(
        capture["amount_refunded"], "4.00",
        "the refused refund gave its 6.00 back"
    );
    assert_eq!(
        third.status,
        StatusCode::ACCEPTED,
        "so 6.00 can be refunded again: {:?}",
        third.body
    );
}

async fn a_refund_needs_a_succeeded_capture_and_a_changed_amount_needs_a_new_key(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "10.00").await;

    let before_capture = app.refund(&intent_id, "refund-1", "1.00").await;
    let capture = app.capture(&intent_id, "cap-1", &json!({})).await;
    let while_processing = app.refund(&intent_id, "refund-2", "1.00").await;
    app.deliver().await;
    let refund = app.refund(&intent_id, "refund-3", "1.00").await;
    let changed = app.refund(&intent_id, "refund-3", "2.00").await;
    let precise = app.refund(&intent_id, "refund-4", "1.001").await;

    assert_eq!(capture.status, StatusCode::ACCEPTED);
    for refused in [&before_capture, &while_processing] {
        assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
        assert_eq!(refused.json()["code"], "invalid_state");
    }
    assert_eq!(refund.status, StatusCode::ACCEPTED);
    assert_eq!(changed.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(changed.json()["code"], "idempotency_key_reused");
    assert_eq!(precise.status, StatusCode::BAD_REQUEST);
    assert_eq!(app.count("payment_refunds").await, 1);
}

async fn a_refund_above_ten_to_the_fifteen_minor_units_is_refused_naming_amount_and_claims_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.captured_intent("order-1", "10.00").await;

    let huge = app.refund(&intent_id, "refund-1", "92233720368547758.07").await;
    let fixed = app.refund(&intent_id, "refund-1", "1.00").await;

    assert_eq!(huge.status, StatusCode::BAD_REQUEST, "{:?}", huge.body);
    assert_eq!(huge.json()["code"], "invalid_request");
    assert_eq!(huge.json()["errors"][0]["field"], "amount", "{:?}", huge.body);
    assert_eq!(
        fixed.status,
        StatusCode::ACCEPTED,
        "nothing was claimed by the 400: {:?}",
        fixed.body
    );
}

platform::both_backends!(
    racing_refunds_never_add_up_to_more_than_was_captured,
    a_refund_goes_to_the_provider_and_one_the_provider_refuses_gives_its_amount_back,
    a_refund_needs_a_succeeded_capture_and_a_changed_amount_needs_a_new_key,
    a_refund_above_ten_to_the_fifteen_minor_units_is_refused_naming_amount_and_claims_nothing,
);

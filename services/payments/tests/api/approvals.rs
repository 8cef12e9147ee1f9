//! CONTRACT §6 on payments: a capture at or above the threshold (1,000 major
//! units in the sandbox) waits for a human who approves that exact capture —
//! payee, amount, currency, account — and a changed amount needs a new decision.

use axum::http::StatusCode;
use platform::Backend;
use serde_json::json;

use crate::support::{ACME_APPROVER, TestApp};

async fn a_large_capture_waits_for_an_approval_and_is_charged_once_after_the_retry_that_runs_it(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "2500.00").await;

    let requested = app.capture(&intent_id, "cap-1", &json!({})).await;
    let waiting = app.capture(&intent_id, "cap-1", &json!({})).await;
    app.deliver().await;
    let charges_before = app.provider.stats().charges_made;
    let request = requested.json();
    let approved = app
        .decide(&requested.str("approval_id"), "approve", &requested.str("fingerprint"))
        .await;
    let run = app.capture(&intent_id, "cap-1", &json!({})).await;
    app.deliver().await;
    let replay = app.capture(&intent_id, "cap-1", &json!({})).await;
    let operation = app.operation(&requested.operation_id.clone().unwrap()).await;

    assert_eq!(requested.status, StatusCode::ACCEPTED, "{:?}", requested.body);
    assert_eq!(request["state"], "awaiting_approval");
    let identifiers = &request["summary"]["identifiers"];
    assert_eq!(identifiers["amount"], "2500.00");
    assert_eq!(identifiers["currency"], "EUR");
    assert_eq!(identifiers["payee_name"], "Acme Supplies GmbH");
    assert_eq!(identifiers["payee_account"], "DE89370400440532013000");
    assert_eq!(identifiers["account"], "acme");
    assert_eq!(waiting.body, requested.body, "the same approval request while it waits");
    assert_eq!(charges_before, 0, "nothing is charged before a human decides");
    assert_eq!(approved.status, StatusCode::OK, "{:?}", approved.body);
    assert_eq!(run.status, StatusCode::ACCEPTED, "{:?}", run.body);
    assert_eq!(
        run.replayed.as_deref(),
        Some("false"),
        "the approved retry runs the capture"
    );
    assert_eq!(run.json()["state"], "processing");
    assert_eq!(replay.body, run.body, "from then on, the capture's answer is replayed");
    assert_eq!(app.provider.stats().charges_made, 1);
    assert_eq!(operation["state"], "completed");
    assert_eq!(operation["approval"]["state"], "approved");
}

async fn a_changed_capture_amount_after_approval_needs_a_new_approval(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "2500.00").await;
    let first = app.capture(&intent_id, "cap-1", &json!({})).await;
    app.decide(&first.str("approval_id"), "approve", &first.str("fingerprint"))
        .await;

    let same_key = app.capture(&intent_id, "cap-1", &json!({"amount": "2000.00"})).await;
    let new_key = app.capture(&intent_id, "cap-2", &json!({"amount": "2000.00"})).await;
    let with_old_fingerprint = app
        .decide(&new_key.str("approval_id"), "approve", &first.str("fingerprint"))
        .await;
    let not_yet = app.capture(&intent_id, "cap-2", &json!({"amount": "2000.00"})).await;
    app.deliver().await;

    assert_eq!(same_key.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(same_key.json()["code"], "idempotency_key_reused");
    assert_eq!(new_key.status, StatusCode::ACCEPTED);
    assert_eq!(new_key.json()["state"], "awaiting_approval");
    assert_ne!(new_key.str("fingerprint"), first.str("fingerprint"));
    assert_eq!(new_key.json()["summary"]["identifiers"]["amount"], "2000.00");
    assert_eq!(with_old_fingerprint.status, StatusCode::CONFLICT);
    assert_eq!(with_old_fingerprint.json()["code"], "approval_fingerprint_mismatch");
    assert_eq!(
        not_yet.body, new_key.body,
        "the changed capture still waits for its own decision"
    );
    assert_eq!(app.count("payment_captures").await, 0);
    assert_eq!(app.provider.stats().charges_made, 0, "no approval covers 2000.00");
}

async fn a_capture_below_the_threshold_needs_no_approval(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "999.99").await;

    let capture = app.capture(&intent_id, "cap-1", &json!({})).await;

    assert_eq!(capture.status, StatusCode::ACCEPTED);
    assert_eq!(capture.json()["state"], "processing", "{:?}", capture.body);
    let approvals = app.get("/v1/approvals?state=pending", ACME_APPROVER).await.json();
    assert_eq!(approvals["data"], json!([]));
}

platform::both_backends!(
    a_large_capture_waits_for_an_approval_and_is_charged_once_after_the_retry_that_runs_it,
    a_changed_capture_amount_after_approval_needs_a_new_approval,
    a_capture_below_the_threshold_needs_no_approval,
);

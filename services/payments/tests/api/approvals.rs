//! docs/contract.md §6 on payments: a capture at or above its currency's
//! threshold (in the sandbox 1,000 EUR, 150,000 JPY, 300 KWD…; every capture in
//! a currency without one) waits for a human who approves that exact capture —
//! payee, amount, currency, account — and a changed amount needs a new decision.

use axum::http::StatusCode;
use platform::{Backend, on_pool};
use serde_json::json;

use crate::support::{ACME_AGENT, ACME_APPROVER, TestApp, intent};

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
    let operation = app.operation(requested.operation_id()).await;

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
    assert_eq!(run.replayed(), Some("false"), "the approved retry runs the capture");
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

/// Whether capturing the whole of a new intent of `amount` `currency` waits for an approver.
async fn capture_waits_for_approval(app: &TestApp, order_id: &str, amount: &str, currency: &str) -> bool {
    let mut body = intent(order_id, json!(amount));
    body["currency"] = json!(currency);
    let created = app
        .post("/v1/payment_intents", ACME_AGENT, &format!("intent-{order_id}"), &body)
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
    let capture = app
        .capture(&created.str("id"), &format!("capture-{order_id}"), &json!({}))
        .await;
    assert_eq!(capture.status, StatusCode::ACCEPTED, "{:?}", capture.body);
    match capture.json()["state"].as_str() {
        Some("awaiting_approval") => true,
        Some("processing") => false,
        _ => panic!("an approval request or a capture, got {:?}", capture.body),
    }
}

async fn a_capture_s_threshold_is_in_its_own_currency_so_999_999_kwd_waits_and_299_999_kwd_does_not(backend: Backend) {
    let app = TestApp::spawn(backend).await;

    assert!(capture_waits_for_approval(&app, "order-1", "999.999", "KWD").await);
    assert!(capture_waits_for_approval(&app, "order-2", "300.000", "KWD").await);
    assert!(!capture_waits_for_approval(&app, "order-3", "299.999", "KWD").await);
    assert!(capture_waits_for_approval(&app, "order-4", "150000", "JPY").await);
    assert!(!capture_waits_for_approval(&app, "order-5", "149999", "JPY").await);
}

async fn a_capture_in_a_currency_without_a_threshold_always_waits_for_an_approval(backend: Backend) {
    let app = TestApp::spawn(backend).await;

    assert!(capture_waits_for_approval(&app, "order-1", "1.00", "SEK").await);
    assert!(capture_waits_for_approval(&app, "order-2", "0.001", "BHD").await);
}

async fn a_euro_capture_waits_from_exactly_1000_00_and_not_below(backend: Backend) {
    let app = TestApp::spawn(backend).await;

    assert!(!capture_waits_for_approval(&app, "order-1", "999.99", "EUR").await);
    assert!(capture_waits_for_approval(&app, "order-2", "1000.00", "EUR").await);
}

/// What a capture's approver is shown — payee, amount, currency, account —
/// is what the provider is asked to pay: the amount and the account are in
/// the fingerprint, and an intent's payee and currency are never changed.
async fn an_approved_capture_charges_the_amount_to_the_payee_account_its_approver_was_shown(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "2500.00").await;
    let requested = app.capture(&intent_id, "cap-1", &json!({"amount": "1200.00"})).await;
    app.decide(&requested.str("approval_id"), "approve", &requested.str("fingerprint"))
        .await;

    let run = app.capture(&intent_id, "cap-1", &json!({"amount": "1200.00"})).await;
    app.deliver().await;
    let charges = app
        .provider
        .charges_with_key(&run.str("provider_idempotency_key"))
        .await;

    assert_eq!(run.status, StatusCode::ACCEPTED, "{:?}", run.body);
    let shown = &requested.json()["summary"]["identifiers"];
    let charge = &charges["data"][0];
    assert_eq!(charge["payee_account"], shown["payee_account"]);
    assert_eq!(charge["amount_minor"], 120_000);
    assert_eq!(shown["amount"], "1200.00");
    assert_eq!(charge["currency"], shown["currency"]);
    assert_eq!(shown["account"], "acme");
}

/// Were an intent's payee ever changed behind the API, the approved capture
/// would not pay the new one: the summary written for its retry is not the
/// one approved, so it is refused as stale and nothing is charged.
async fn an_approved_capture_whose_payee_is_no_longer_the_one_shown_is_refused_as_stale_and_charges_nothing(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "2500.00").await;
    let requested = app.capture(&intent_id, "cap-1", &json!({})).await;
    app.decide(&requested.str("approval_id"), "approve", &requested.str("fingerprint"))
        .await;
    on_pool!(app.db.db.write(), |pool| sqlx::query(
        "UPDATE payment_intents SET payee_account = 'GB33BUKB20201555555555' WHERE id = $1"
    )
    .bind(&intent_id)
    .execute(pool)
    .await
    .unwrap()
    .rows_affected());

    let stale = app.capture(&intent_id, "cap-1", &json!({})).await;
    app.deliver().await;

    stale.assert_problem(409, "approval_stale");
    assert!(
        stale.str("detail").contains("GB33BUKB20201555555555"),
        "{:?}",
        stale.body
    );
    assert_eq!(app.operation(requested.operation_id()).await["state"], "rejected");
    assert_eq!(app.count("payment_captures").await, 0);
    assert_eq!(app.provider.stats().charges_made, 0);
}

platform::both_backends!(
    a_large_capture_waits_for_an_approval_and_is_charged_once_after_the_retry_that_runs_it,
    a_changed_capture_amount_after_approval_needs_a_new_approval,
    a_capture_below_the_threshold_needs_no_approval,
    a_capture_s_threshold_is_in_its_own_currency_so_999_999_kwd_waits_and_299_999_kwd_does_not,
    a_capture_in_a_currency_without_a_threshold_always_waits_for_an_approval,
    a_euro_capture_waits_from_exactly_1000_00_and_not_below,
    an_approved_capture_charges_the_amount_to_the_payee_account_its_approver_was_shown,
    an_approved_capture_whose_payee_is_no_longer_the_one_shown_is_refused_as_stale_and_charges_nothing,
);

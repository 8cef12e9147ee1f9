//! Who may settle by hand: an admin of the capture's account, for an
//! operation whose outcome is unknown, with a charge of that account.

use axum::http::StatusCode;
use platform::{Backend, Role};
use serde_json::{Value, json};

use super::{
    capture_left_unknown_by_a_key_collision, capture_left_unknown_with_its_charge_made,
    capture_left_unknown_with_nothing_charged, journal, resolve,
};
use crate::support::{ACME_AGENT, ACME_APPROVER, GLOBEX_AGENT, TestApp, intent};

async fn only_an_admin_of_the_account_settles_by_hand_and_only_an_operation_whose_outcome_is_unknown(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let other_admin = app.create_key("globex", "globex-admin", Role::Admin).await;
    let (operation_id, _, _) = capture_left_unknown_by_a_key_collision(&app, "order-1").await;
    app.captured_intent("order-2", "10.00").await;
    let completed_operation = app
        .get("/v1/operations?idempotency_key=capture-order-2", ACME_AGENT)
        .await
        .json()["data"][0]["operation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let good = json!({"outcome": "failed", "evidence": "no charge"});

    let by_an_agent = resolve(&app, ACME_AGENT, &operation_id, &good).await;
    let by_an_agent_on_nothing = resolve(&app, ACME_AGENT, "op_missing", &good).await;
    let by_an_approver = resolve(&app, ACME_APPROVER, &operation_id, &good).await;
    let by_another_account = resolve(&app, &other_admin, &operation_id, &good).await;
    let by_another_account_agent = resolve(&app, GLOBEX_AGENT, &operation_id, &good).await;
    let on_a_completed_one = resolve(&app, &admin, &completed_operation, &good).await;
    let with_a_reference_that_is_not_an_id = resolve(
        &app,
        &admin,
        &operation_id,
        &json!({"outcome": "completed", "evidence": "seen", "external_ref": "ch 1"}),
    )
    .await;
    let without_evidence = resolve(
        &app,
        &admin,
        &operation_id,
        &json!({"outcome": "failed", "evidence": "  "}),
    )
    .await;
    let unknown_outcome = resolve(
        &app,
        &admin,
        &operation_id,
        &json!({"outcome": "maybe", "evidence": "?"}),
    )
    .await;
    let still = app.operation(&operation_id).await;

    for refused in [
        &by_an_agent,
        &by_an_agent_on_nothing,
        &by_an_approver,
        &by_another_account_agent,
    ] {
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{:?}", refused.body);
    }
    assert_eq!(by_another_account.status, StatusCode::NOT_FOUND);
    assert_eq!(on_a_completed_one.status, StatusCode::CONFLICT);
    assert_eq!(on_a_completed_one.json()["state"], "completed");
    assert_eq!(with_a_reference_that_is_not_an_id.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        with_a_reference_that_is_not_an_id.json()["errors"][0]["field"],
        "external_ref"
    );
    assert_eq!(without_evidence.status, StatusCode::BAD_REQUEST);
    assert_eq!(without_evidence.json()["errors"][0]["field"], "evidence");
    assert_eq!(unknown_outcome.status, StatusCode::BAD_REQUEST);
    assert_eq!(still["state"], "unknown", "nothing refused changed anything: {still}");
    assert!(!app.journal_events(&operation_id).await.iter().any(|e| e == "resolved"));
}

/// A resolution or a redelivery sent with a key is its author's request:
/// another admin of the account sending the same key and body is refused with
/// 422, never answered with what the first admin was told.
async fn another_admin_sending_an_admins_settlement_key_and_body_is_422_not_their_answer(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let second_admin = app.create_key("acme", "acme-admin-2", Role::Admin).await;
    let (operation_id, _, _, charge_id) = capture_left_unknown_with_its_charge_made(&app, "order-1").await;
    let resolution = format!("/v1/operations/{operation_id}/resolution");
    let redelivery = format!("/v1/operations/{operation_id}/redelivery");
    let completed =
        json!({"outcome": "completed", "evidence": format!("{charge_id} in the dashboard"), "external_ref": charge_id});

    let settled = app.client.post(&resolution, &admin, Some("settle-1"), &completed).await;
    let settled_by_another = app
        .client
        .post(&resolution, &second_admin, Some("settle-1"), &completed)
        .await;
    let settled_again = app.client.post(&resolution, &admin, Some("settle-1"), &completed).await;
    let redelivered = app.client.post(&redelivery, &admin, Some("send-1"), "{}").await;
    let redelivered_by_another = app.client.post(&redelivery, &second_admin, Some("send-1"), "{}").await;

    assert_eq!(settled.status, StatusCode::OK, "{:?}", settled.body);
    settled_by_another.assert_problem(422, "idempotency_key_reused");
    assert_eq!(settled_again.replayed(), Some("true"));
    assert_eq!(settled_again.body, settled.body, "the first admin's own answer");
    redelivered.assert_problem(409, "invalid_state");
    redelivered_by_another.assert_problem(422, "idempotency_key_reused");
    let events = app.journal_events(&operation_id).await;
    assert_eq!(events.iter().filter(|e| *e == "resolved").count(), 1, "{events:?}");
}

/// Both accounts' services charge through one merchant key,
/// so globex's charge is visible to acme's lookups. acme's admin names it for
/// acme's capture: refused, journaled, nothing settled — and globex's charge
/// is still globex's to refund, in full.
async fn an_admin_cannot_settle_a_capture_with_another_account_s_charge_which_stays_theirs_to_refund(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let (operation_id, intent_id, first_answer) = capture_left_unknown_with_nothing_charged(&app, "order-1").await;
    let theirs = app
        .post(
            "/v1/payment_intents",
            GLOBEX_AGENT,
            "globex-intent",
            &intent("globex-order", json!("50.00")),
        )
        .await
        .str("id");
    let their_capture = app
        .post(
            &format!("/v1/payment_intents/{theirs}/capture"),
            GLOBEX_AGENT,
            "globex-capture",
            &json!({}),
        )
        .await
        .str("id");
    app.deliver().await;
    let their_charge = app
        .get(&format!("/v1/captures/{their_capture}"), GLOBEX_AGENT)
        .await
        .json()["provider_charge_id"]
        .as_str()
        .expect("globex's capture is charged")
        .to_owned();
    let evidence = format!("{their_charge} in the provider's dashboard");

    let refused = resolve(
        &app,
        &admin,
        &operation_id,
        &json!({"outcome": "completed", "evidence": evidence, "external_ref": their_charge}),
    )
    .await;
    let still = app.operation(&operation_id).await;
    let capture = app
        .get(
            &format!("/v1/captures/{}", first_answer["id"].as_str().unwrap()),
            ACME_AGENT,
        )
        .await
        .json();
    let our_refund = app.refund(&intent_id, "refund-ours", "40.00").await;
    let their_refund = app
        .post(
            &format!("/v1/payment_intents/{theirs}/refunds"),
            GLOBEX_AGENT,
            "globex-refund",
            &json!({"amount": "50.00"}),
        )
        .await;
    app.deliver().await;
    let their_refund = app
        .get(&format!("/v1/refunds/{}", their_refund.str("id")), GLOBEX_AGENT)
        .await
        .json();
    let entries = journal(&app, &operation_id).await;

    refused.assert_problem(422, "external_ref_mismatch");
    assert_eq!(
        (
            still["state"].clone(),
            still["outbox"].clone(),
            still["external_ref"].clone()
        ),
        (json!("unknown"), json!("unknown"), Value::Null),
        "nothing written: {still}"
    );
    assert_eq!(capture["state"], "unknown", "{capture}");
    assert_eq!(capture["provider_charge_id"], Value::Null);
    our_refund.assert_problem(409, "invalid_state");
    assert_eq!(their_refund["state"], "succeeded", "{their_refund}");
    assert_eq!(app.provider.stats().refunds_made, 1, "globex's refund, and only it");
    let refusal = entries
        .iter()
        .find(|e| e["event"] == "external_ref_refused")
        .unwrap_or_else(|| panic!("the refusal is journaled: {entries:?}"));
    assert_eq!(refusal["principal_id"], "acme-admin");
    assert_eq!(refusal["external_ref"], their_charge.as_str());
    assert_eq!(refusal["evidence"], evidence.as_str());
    assert!(!entries.iter().any(|e| e["event"] == "resolved"), "{entries:?}");
}

platform::both_backends!(
    only_an_admin_of_the_account_settles_by_hand_and_only_an_operation_whose_outcome_is_unknown,
    another_admin_sending_an_admins_settlement_key_and_body_is_422_not_their_answer,
    an_admin_cannot_settle_a_capture_with_another_account_s_charge_which_stays_theirs_to_refund,
);

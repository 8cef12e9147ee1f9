//! What the provider's word settles: a charge that is not the capture's
//! settles nothing, an id from outside is checked where it enters, and
//! `completed` without a reference is a person's word only when the
//! provider cannot be asked.

use axum::http::StatusCode;
use platform::{Backend, Role};
use serde_json::{Value, json};

use super::{
    capture_left_unknown_by_a_key_collision, capture_left_unknown_with_its_charge_made,
    capture_left_unknown_with_nothing_charged, journal, resolve,
};
use crate::support::{ACME_AGENT, TestApp};

/// Only the provider's word that it holds nothing under the capture's key
/// frees its order; while it holds this capture's charge, `failed` is refused
/// and names the charge.
async fn failed_by_hand_is_refused_while_the_provider_holds_the_capture_s_charge_and_the_order_stays_held(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let (operation_id, _, _, charge_id) = capture_left_unknown_with_its_charge_made(&app, "order-1").await;

    let refused = resolve(
        &app,
        &admin,
        &operation_id,
        &json!({"outcome": "failed", "evidence": "the agent says it never went through"}),
    )
    .await;
    let still = app.operation(&operation_id).await;
    let order_again = app.create("intent-order-1-again", "order-1").await;

    refused.assert_problem(409, "external_outcome_exists");
    assert_eq!(refused.json()["external_ref"], charge_id.as_str(), "{:?}", refused.body);
    assert_eq!(still["state"], "unknown", "{still}");
    order_again.assert_problem(409, "order_already_has_payment");
    assert!(!app.journal_events(&operation_id).await.iter().any(|e| e == "resolved"));
}

/// A charge under the capture's key that is not the capture's (another
/// amount, another reference) is neither: `completed` with it is not this
/// capture's charge, and `failed` is not the provider's word that it holds
/// nothing. The capture stays `unknown`, its order held.
async fn a_charge_under_the_capture_s_key_that_is_not_its_own_settles_it_neither_way(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let (operation_id, _, accepted) = capture_left_unknown_by_a_key_collision(&app, "order-1").await;
    let squatter = app
        .provider
        .charges_with_key(accepted["provider_idempotency_key"].as_str().unwrap())
        .await["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let as_completed = resolve(
        &app,
        &admin,
        &operation_id,
        &json!({"outcome": "completed", "evidence": "a charge under its key", "external_ref": squatter}),
    )
    .await;
    let as_failed = resolve(
        &app,
        &admin,
        &operation_id,
        &json!({"outcome": "failed", "evidence": "not our amount"}),
    )
    .await;

    as_completed.assert_problem(422, "external_ref_mismatch");
    as_failed.assert_problem(409, "external_outcome_exists");
    assert_eq!(
        as_failed.json()["external_ref"],
        Value::Null,
        "what is not this capture's is not named"
    );
    let operation = app.operation(&operation_id).await;
    assert_eq!(operation["state"], "unknown");
    assert!(
        operation["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("not its work")),
        "the reconciler's finding is shown: {operation}"
    );
    assert!(
        !operation.to_string().contains(&squatter),
        "what the provider holds that is not this capture's is named in no answer: {operation}"
    );
}

/// What cannot be checked is not taken on trust: while the provider is down a
/// resolution is 503 with `Retry-After` and writes nothing, and once the
/// provider answers again the same resolution goes through.
async fn while_the_provider_cannot_answer_a_resolution_is_503_writes_nothing_and_goes_through_once_it_answers(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let (operation_id, _, _, charge_id) = capture_left_unknown_with_its_charge_made(&app, "order-1").await;
    let completed =
        json!({"outcome": "completed", "evidence": "its charge in the dashboard", "external_ref": charge_id});

    app.provider.server.go_down().await;
    let as_completed = resolve(&app, &admin, &operation_id, &completed).await;
    let as_failed = resolve(
        &app,
        &admin,
        &operation_id,
        &json!({"outcome": "failed", "evidence": "no charge"}),
    )
    .await;
    let still = app.operation(&operation_id).await;
    let events_while_down = app.journal_events(&operation_id).await;
    app.provider.server.come_back().await;
    let once_back = resolve(&app, &admin, &operation_id, &completed).await;

    for refused in [&as_completed, &as_failed] {
        refused.assert_problem(503, "external_system_unavailable");
        let retry_after: u64 = refused.header("retry-after").expect("Retry-After").parse().unwrap();
        assert!(retry_after >= 1, "{retry_after}");
    }
    assert_eq!(
        (still["state"].clone(), still["outbox"].clone()),
        (json!("unknown"), json!("unknown"))
    );
    assert!(
        !events_while_down
            .iter()
            .any(|e| e == "resolved" || e == "external_ref_refused"),
        "{events_while_down:?}"
    );
    assert_eq!(once_back.status, StatusCode::OK, "{:?}", once_back.body);
    assert_eq!(once_back.json()["state"], "completed");
}

/// Ids from outside are data: a reference that is not of an id's form (a path
/// that would climb out of the provider's charges) is refused where it enters.
async fn an_external_ref_outside_its_documented_form_is_refused_with_400_and_changes_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let (operation_id, _, _, _) = capture_left_unknown_with_its_charge_made(&app, "order-1").await;

    let mut refused = Vec::new();
    for external_ref in ["x/../../admin/faults", "ch_1?x=1", "ch%2F1", "..", "ch_1\n"] {
        for outcome in ["completed", "failed"] {
            let body = json!({"outcome": outcome, "evidence": "seen", "external_ref": external_ref});
            refused.push((external_ref, resolve(&app, &admin, &operation_id, &body).await));
        }
    }

    for (external_ref, answer) in &refused {
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{external_ref:?}: {:?}",
            answer.body
        );
        assert_eq!(answer.json()["errors"][0]["field"], "external_ref", "{external_ref:?}");
    }
    assert_eq!(app.operation(&operation_id).await["state"], "unknown");
}

/// What a person can still settle when the provider is gone for good: the
/// capture `completed` with no reference. Nothing from outside enters its
/// rows, so nothing acts at the provider in its name: its order stays held,
/// and a refund of it is refused in words.
async fn a_capture_settled_completed_without_a_reference_holds_its_order_and_cannot_be_refunded_here(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let (operation_id, intent_id, first_answer) = capture_left_unknown_with_nothing_charged(&app, "order-1").await;
    app.provider.server.go_down().await;
    let evidence = "the bank statement shows 40.00 EUR paid out by the provider for cap-order-1";

    let resolved = resolve(
        &app,
        &admin,
        &operation_id,
        &json!({"outcome": "completed", "evidence": evidence}),
    )
    .await;
    let capture = app
        .get(
            &format!("/v1/captures/{}", first_answer["id"].as_str().unwrap()),
            ACME_AGENT,
        )
        .await
        .json();
    let order_again = app.create("intent-order-1-again", "order-1").await;
    let refund = app.refund(&intent_id, "refund-1", "10.00").await;
    let entries = journal(&app, &operation_id).await;

    assert_eq!(resolved.status, StatusCode::OK, "{:?}", resolved.body);
    assert_eq!(resolved.json()["state"], "completed");
    assert_eq!(resolved.json()["outbox"], "delivered");
    assert_eq!(resolved.json()["external_ref"], Value::Null);
    assert_eq!(capture["state"], "succeeded", "{capture}");
    assert_eq!(capture["provider_charge_id"], Value::Null, "no charge id from outside");
    order_again.assert_problem(409, "order_already_has_payment");
    refund.assert_problem(409, "invalid_state");
    assert!(
        refund.json()["detail"].as_str().unwrap().contains("no charge"),
        "{:?}",
        refund.body
    );
    let resolved_entry = entries.iter().find(|e| e["event"] == "resolved").unwrap();
    assert_eq!(resolved_entry["evidence"], evidence);
    assert_eq!(resolved_entry["external_ref"], Value::Null);
    assert_eq!(entries.last().unwrap()["event"], "completed", "{entries:?}");
}

/// `completed` without a reference is a person's word only when the
/// provider cannot be asked: while it answers, the charge it holds for the
/// capture is named (settle with it), and no charge at all refutes it —
/// either way nothing is written.
async fn completed_without_a_reference_is_checked_while_the_provider_answers(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let (charged, _, _, charge_id) = capture_left_unknown_with_its_charge_made(&app, "order-1").await;
    let (not_charged, _, _) = capture_left_unknown_with_nothing_charged(&app, "order-2").await;
    let completed = json!({"outcome": "completed", "evidence": "the customer says it was paid"});

    let named = resolve(&app, &admin, &charged, &completed).await;
    let refuted = resolve(&app, &admin, &not_charged, &completed).await;
    let entries = journal(&app, &not_charged).await;

    named.assert_problem(409, "external_outcome_exists");
    assert_eq!(
        named.json()["external_ref"],
        charge_id.as_str(),
        "the charge to settle it with"
    );
    refuted.assert_problem(422, "external_ref_mismatch");
    for operation_id in [&charged, &not_charged] {
        assert_eq!(app.operation(operation_id).await["state"], "unknown", "nothing written");
    }
    let refusal = entries
        .iter()
        .find(|e| e["event"] == "external_ref_refused")
        .unwrap_or_else(|| panic!("the refusal is journaled: {entries:?}"));
    assert_eq!(refusal["external_ref"], Value::Null);
    assert!(!entries.iter().any(|e| e["event"] == "resolved"), "{entries:?}");
}

platform::both_backends!(
    failed_by_hand_is_refused_while_the_provider_holds_the_capture_s_charge_and_the_order_stays_held,
    a_charge_under_the_capture_s_key_that_is_not_its_own_settles_it_neither_way,
    while_the_provider_cannot_answer_a_resolution_is_503_writes_nothing_and_goes_through_once_it_answers,
    an_external_ref_outside_its_documented_form_is_refused_with_400_and_changes_nothing,
    a_capture_settled_completed_without_a_reference_holds_its_order_and_cannot_be_refunded_here,
    completed_without_a_reference_is_checked_while_the_provider_answers,
);

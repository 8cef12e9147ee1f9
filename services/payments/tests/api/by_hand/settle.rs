//! An admin settles an unknown capture: with the provider's charge, or as
//! failed; a settlement that cannot be written, one the reconciler holds
//! off, and one sent again with its key.

use axum::http::StatusCode;
use outbox::{EventState, OutboxConfig};
use platform::{Backend, Role, on_pool};
use serde_json::{Value, json};

use super::{capture_left_unknown_with_its_charge_made, capture_left_unknown_with_nothing_charged, journal, resolve};
use crate::support::{ACME_AGENT, ACME_APPROVER, TestApp, outbox_config};

async fn an_admin_settles_an_unknown_capture_with_the_charge_the_provider_holds_for_it_and_every_later_retry_replays_its_answer(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let (operation_id, intent_id, first_answer, charge_id) =
        capture_left_unknown_with_its_charge_made(&app, "order-1").await;
    let listed = app.get("/v1/operations?state=unknown", ACME_APPROVER).await;
    let listed_as_dead = app.get("/v1/operations?outbox=dead", ACME_APPROVER).await.json();

    let resolution = json!({
        "outcome": "completed",
        "evidence": format!("{charge_id} is this capture's charge in the provider's dashboard"),
        "external_ref": charge_id,
    });
    let resolved = resolve(&app, &admin, &operation_id, &resolution).await;
    let twice = resolve(&app, &admin, &operation_id, &resolution).await;
    let otherwise = resolve(
        &app,
        &admin,
        &operation_id,
        &json!({"outcome": "failed", "evidence": "no"}),
    )
    .await;
    let retry = app.capture(&intent_id, "cap-order-1", &json!({})).await;
    let capture = app
        .get(
            &format!("/v1/captures/{}", first_answer["id"].as_str().unwrap()),
            ACME_AGENT,
        )
        .await
        .json();
    let reconciled_after = app.reconcile().await;

    assert_eq!(
        listed.json()["data"][0]["operation_id"],
        operation_id.as_str(),
        "{:?}",
        listed.body
    );
    assert_eq!(
        listed.json()["data"].as_array().unwrap().len(),
        1,
        "the intent's own operation is completed"
    );
    assert_eq!(listed_as_dead["data"], json!([]), "unknown, but its event is not dead");
    assert_eq!(resolved.status, StatusCode::OK, "{:?}", resolved.body);
    assert_eq!(resolved.json()["state"], "completed");
    assert_eq!(resolved.json()["external_ref"], charge_id.as_str());
    assert_eq!(resolved.json()["outbox"], "delivered");
    for again in [&twice, &otherwise] {
        assert_eq!(
            again.status,
            StatusCode::CONFLICT,
            "a compare-and-set from unknown only"
        );
        assert_eq!(
            (again.json()["code"].clone(), again.json()["state"].clone()),
            (json!("invalid_state"), json!("completed")),
            "the state it left tells a repeat that it went through"
        );
    }
    assert_eq!(retry.status, StatusCode::ACCEPTED);
    assert_eq!(retry.replayed(), Some("true"));
    assert_eq!(retry.json(), first_answer, "the stored answer, as before");
    assert_eq!(
        capture["state"], "succeeded",
        "settled as the reconciler settles what it finds"
    );
    assert_eq!(capture["provider_charge_id"], charge_id.as_str());
    assert_eq!(reconciled_after, 0, "the event is settled: nobody asks about it again");
    assert_eq!(app.provider.stats().charges_made, 1, "the one charge");

    let entries = app
        .get(&format!("/v1/audit?operation_id={operation_id}"), ACME_APPROVER)
        .await
        .json();
    let entries = entries["data"].as_array().unwrap();
    let resolved_entry = entries
        .iter()
        .find(|e| e["event"] == "resolved")
        .expect("a resolved entry");
    assert_eq!(resolved_entry["principal_id"], "acme-admin");
    assert_eq!(resolved_entry["evidence"], resolution["evidence"]);
    assert_eq!(resolved_entry["external_ref"], charge_id.as_str());
    let events: Vec<&str> = entries.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(
        &events[events.len() - 3..],
        ["resolved", "completed", "replayed"],
        "{events:?}"
    );
    assert_eq!(
        events.iter().filter(|e| **e == "resolved").count(),
        1,
        "the repeat changed nothing"
    );
}

async fn a_capture_settled_as_failed_by_an_admin_while_the_provider_holds_no_charge_for_it_fails_and_frees_its_order(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let (operation_id, _, first_answer) = capture_left_unknown_with_nothing_charged(&app, "order-1").await;

    let resolved = resolve(
        &app,
        &admin,
        &operation_id,
        &json!({"outcome": "failed", "evidence": "the provider's support confirmed no charge for this capture",
                "external_ref": "support-case-7"}),
    )
    .await;
    let capture = app
        .get(
            &format!("/v1/captures/{}", first_answer["id"].as_str().unwrap()),
            ACME_AGENT,
        )
        .await
        .json();
    let entries = journal(&app, &operation_id).await;
    let events: Vec<&str> = entries.iter().map(|e| e["event"].as_str().unwrap()).collect();
    let order_again = app.create("intent-order-1-again", "order-1").await;

    assert_eq!(resolved.status, StatusCode::OK, "{:?}", resolved.body);
    assert_eq!(resolved.json()["state"], "failed");
    assert_eq!(resolved.json()["outbox"], "failed");
    assert_eq!(
        resolved.json()["external_ref"],
        Value::Null,
        "nothing at the provider confirms what the person named: the operation keeps no reference"
    );
    assert_eq!(
        entries.iter().find(|e| e["event"] == "resolved").unwrap()["external_ref"],
        "support-case-7",
        "what the person named is in the journal"
    );
    assert_eq!(capture["state"], "failed");
    assert_eq!(
        order_again.status,
        StatusCode::CREATED,
        "the order takes a new payment: {:?}",
        order_again.body
    );
    assert_eq!(
        outbox::event_of(&app.db.db, "acme", &operation_id).await.unwrap(),
        Some((EventState::Failed, 1))
    );
    assert_eq!(&events[events.len() - 2..], ["resolved", "failed"], "{events:?}");
}

async fn a_settlement_that_cannot_be_written_counts_as_a_failure_and_its_text_never_reaches_the_caller(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let outbox = app.another_outbox(OutboxConfig {
        max_failures: 1,
        ..outbox_config()
    });
    let intent_id = app.intent_for("order-1", "40.00").await;
    let accepted = app.capture(&intent_id, "cap-1", &json!({})).await;
    let operation_id = accepted.operation_id().to_owned();
    // the operation stops waiting for its delivery behind the outbox's back:
    // the accepted charge can then never be settled against it
    on_pool!(app.db.db.write(), |pool| sqlx::query(
        "UPDATE idempotency_operations SET state = 'failed' WHERE operation_id = $1"
    )
    .bind(&operation_id)
    .execute(pool)
    .await
    .unwrap()
    .rows_affected());

    outbox.deliver_due().await.unwrap();
    let operation = app
        .get(&format!("/v1/operations/{operation_id}"), ACME_APPROVER)
        .await
        .json();
    let taken_again = outbox.reconcile_due().await.unwrap();

    assert_eq!(operation["outbox"], "dead", "{operation}");
    let last_error = operation["last_error"].as_str().unwrap();
    assert!(last_error.contains("settlement could not be written"), "{last_error}");
    assert!(!last_error.contains(&operation_id) && !last_error.contains("idempotency_operations"));
    assert_eq!(taken_again, 0);
    assert!(
        app.journal_events(&operation_id)
            .await
            .iter()
            .any(|e| e == "dead_lettered")
    );
}

async fn while_the_reconciler_holds_the_event_a_resolution_is_told_to_wait_and_changes_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let (operation_id, _, _) = capture_left_unknown_with_nothing_charged(&app, "order-1").await;
    // as the reconciler holds an event it is asking about
    let hold = |until: platform::Timestamp| {
        let (db, operation_id) = (app.db.db.clone(), operation_id.clone());
        async move {
            on_pool!(db.write(), |pool| sqlx::query(
                "UPDATE idempotency_outbox SET lease_token = 'asking', next_attempt_at = $2 WHERE operation_id = $1"
            )
            .bind(&operation_id)
            .bind(until)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected())
        }
    };
    hold(platform::Timestamp::now().plus(std::time::Duration::from_secs(30))).await;
    let failed = json!({"outcome": "failed", "evidence": "no charge at the provider"});

    let while_held = resolve(&app, &admin, &operation_id, &failed).await;
    let still = app.operation(&operation_id).await;
    // its lease ends: the reconciler has gone
    hold(platform::Timestamp::now()).await;
    let once_let_go = resolve(&app, &admin, &operation_id, &failed).await;

    assert_eq!(while_held.status, StatusCode::CONFLICT, "{:?}", while_held.body);
    assert_eq!(while_held.json()["code"], "invalid_state");
    let retry_after: u64 = while_held.header("retry-after").expect("Retry-After").parse().unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    assert_eq!(
        (still["state"].clone(), still["outbox"].clone()),
        (json!("unknown"), json!("unknown"))
    );
    assert_eq!(once_let_go.status, StatusCode::OK, "{:?}", once_let_go.body);
    assert_eq!(once_let_go.json()["state"], "failed");
}

async fn a_resolution_sent_with_a_key_is_replayed_to_its_retry_and_the_key_sent_with_another_resolution_is_refused(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let (operation_id, _, _, charge_id) = capture_left_unknown_with_its_charge_made(&app, "order-1").await;
    let path = format!("/v1/operations/{operation_id}/resolution");
    let completed =
        json!({"outcome": "completed", "evidence": "its charge in the dashboard", "external_ref": charge_id});

    let first = app.client.post(&path, &admin, Some("settle-1"), &completed).await;
    let retry = app.client.post(&path, &admin, Some("settle-1"), &completed).await;
    let changed = app
        .client
        .post(
            &path,
            &admin,
            Some("settle-1"),
            &json!({"outcome": "failed", "evidence": "no charge"}),
        )
        .await;
    let without_the_key = app.client.post(&path, &admin, None, &completed).await;

    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    assert_eq!(first.replayed(), Some("false"));
    assert_eq!(first.json()["state"], "completed");
    assert_eq!(retry.status, StatusCode::OK, "the answer the person lost, replayed");
    assert_eq!(retry.replayed(), Some("true"));
    assert_eq!(retry.body, first.body, "byte for byte");
    changed.assert_problem(422, "idempotency_key_reused");
    without_the_key.assert_problem(409, "invalid_state");
    let events = app.journal_events(&operation_id).await;
    assert_eq!(events.iter().filter(|e| *e == "resolved").count(), 1, "{events:?}");
}

platform::both_backends!(
    an_admin_settles_an_unknown_capture_with_the_charge_the_provider_holds_for_it_and_every_later_retry_replays_its_answer,
    a_capture_settled_as_failed_by_an_admin_while_the_provider_holds_no_charge_for_it_fails_and_frees_its_order,
    a_settlement_that_cannot_be_written_counts_as_a_failure_and_its_text_never_reaches_the_caller,
    while_the_reconciler_holds_the_event_a_resolution_is_told_to_wait_and_changes_nothing,
    a_resolution_sent_with_a_key_is_replayed_to_its_retry_and_the_key_sent_with_another_resolution_is_refused,
);

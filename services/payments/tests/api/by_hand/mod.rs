//! What a person does when the outbox cannot settle a capture by itself
//! (docs/contract.md §5): an event that failed too often is dead and waits
//! for an admin to send it again; a capture whose outcome the reconciler can
//! never learn is settled by an admin, with evidence, through the writes the
//! reconciler would make.

use axum::http::StatusCode;
use idempotency::outbox::{self, EventState, OutboxConfig};
use payment_provider::Faults;
use platform::{Backend, Role, on_pool};
use serde_json::{Value, json};

use crate::support::{ACME_AGENT, ACME_APPROVER, GLOBEX_AGENT, TestApp, intent, outbox_config};

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
        .header("idempotency-key", outbox::external_key(&operation_id))
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
        .charges_with_key(&outbox::external_key(&operation_id))
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

async fn an_event_that_fails_too_often_is_dead_shown_on_its_operation_and_sent_again_only_when_an_admin_says_so(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let outbox = app.another_outbox(dying_outbox());
    let intent_id = app.intent_for("order-1", "40.00").await;
    // every charge answers 503 before it is taken: each delivery is unknown,
    // each lookup finds nothing and sends it again
    app.provider.set_faults(Faults {
        fail_next: 100,
        ..Faults::default()
    });
    let accepted = app.capture(&intent_id, "cap-1", &json!({})).await;
    let operation_id = accepted.operation_id().to_owned();

    for _ in 0..3 {
        assert_eq!(outbox.deliver_due().await.unwrap(), 1);
        outbox.reconcile_due().await.unwrap();
    }
    let dead = app
        .get(&format!("/v1/operations/{operation_id}"), ACME_APPROVER)
        .await
        .json();
    let dead_for_the_agent = app.operation(&operation_id).await;
    let taken_while_dead = (
        outbox.deliver_due().await.unwrap(),
        outbox.reconcile_due().await.unwrap(),
    );
    let requests_while_dead = app.provider.stats().requests;
    let listed = app.get("/v1/operations?outbox=dead", ACME_APPROVER).await;
    let listed_for_an_agent = app.get("/v1/operations?outbox=dead", ACME_AGENT).await;
    let all_waiting_for_an_agent = app.get("/v1/operations", ACME_AGENT).await;
    let waiting = app.get("/v1/operations", ACME_APPROVER).await.json();
    let its_key_while_dead = app
        .get("/v1/operations?idempotency_key=cap-1&outbox=dead", ACME_AGENT)
        .await
        .json();
    let by_an_approver = redeliver(&app, ACME_APPROVER, &operation_id).await;
    let by_an_agent = redeliver(&app, ACME_AGENT, &operation_id).await;
    let from_another_account = redeliver(
        &app,
        &app.create_key("globex", "globex-admin", Role::Admin).await,
        &operation_id,
    )
    .await;

    app.provider.set_faults(Faults::default());
    let given_back = redeliver(&app, &admin, &operation_id).await;
    let again = redeliver(&app, &admin, &operation_id).await;
    outbox.reconcile_due().await.unwrap();
    outbox.deliver_due().await.unwrap();
    let settled = app.operation(&operation_id).await;
    let its_key_once_delivered = app
        .get("/v1/operations?idempotency_key=cap-1&outbox=dead", ACME_AGENT)
        .await
        .json();
    let once_delivered = redeliver(&app, &admin, &operation_id).await;

    assert_eq!(
        dead["state"], "unknown",
        "the operation is left as the last failure left it: {dead}"
    );
    assert_eq!(dead["outbox"], "dead", "{dead}");
    assert!(
        dead["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("answered 503")),
        "the provider's status and problem, never its raw body: {dead}"
    );
    assert_eq!(dead_for_the_agent["outbox"], "dead");
    assert_eq!(
        dead_for_the_agent["last_error"], dead["last_error"],
        "shown on the operation"
    );
    assert_eq!(taken_while_dead, (0, 0), "a dead event is tried no more");
    assert_eq!(requests_while_dead, 3);
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(
        listed.json()["data"][0]["operation_id"],
        operation_id.as_str(),
        "{:?}",
        listed.body
    );
    assert_eq!(listed.json()["data"].as_array().unwrap().len(), 1);
    assert_eq!(listed_for_an_agent.status, StatusCode::FORBIDDEN);
    assert_eq!(all_waiting_for_an_agent.status, StatusCode::FORBIDDEN);
    assert_eq!(
        waiting["data"][0]["operation_id"],
        operation_id.as_str(),
        "without a filter: what waits for a person"
    );
    assert_eq!(
        its_key_while_dead["data"].as_array().unwrap().len(),
        1,
        "the key's operation, dead"
    );
    assert_eq!(
        its_key_once_delivered["data"].as_array().unwrap().len(),
        0,
        "no longer dead"
    );
    assert_eq!(by_an_approver.status, StatusCode::FORBIDDEN);
    assert_eq!(by_an_agent.status, StatusCode::FORBIDDEN);
    assert_eq!(from_another_account.status, StatusCode::NOT_FOUND);
    assert_eq!(given_back.status, StatusCode::OK, "{:?}", given_back.body);
    assert_eq!(given_back.json()["outbox"], "unknown", "the reconciler asks first");
    assert_eq!(
        again.status,
        StatusCode::OK,
        "sent again while it is on its way: the same answer"
    );
    assert_eq!(again.json()["outbox"], "unknown");
    assert_eq!(settled["state"], "completed", "{settled}");
    assert_eq!(settled["outbox"], "delivered");
    assert_eq!(app.provider.stats().charges_made, 1);
    once_delivered.assert_problem(409, "invalid_state");
    assert_eq!(
        once_delivered.json()["outbox"],
        "delivered",
        "a settled event is not sent again"
    );
    let events = app.journal_events(&operation_id).await;
    assert_eq!(events.iter().filter(|e| *e == "redelivered").count(), 1, "{events:?}");
    let dead_at = events.iter().position(|e| e == "dead_lettered");
    let redelivered_at = events.iter().position(|e| e == "redelivered");
    assert!(dead_at.is_some() && dead_at < redelivered_at, "{events:?}");
    assert_eq!(events.last().map(String::as_str), Some("completed"), "{events:?}");
}

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
    let (operation_id, _, _) = capture_left_unknown_by_a_key_collision(&app, "order-1").await;
    let squatter = app
        .provider
        .charges_with_key(&outbox::external_key(&operation_id))
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
    completed_without_a_reference_is_checked_while_the_provider_answers,
    while_the_reconciler_holds_the_event_a_resolution_is_told_to_wait_and_changes_nothing,
    a_settlement_that_cannot_be_written_counts_as_a_failure_and_its_text_never_reaches_the_caller,
    an_event_that_fails_too_often_is_dead_shown_on_its_operation_and_sent_again_only_when_an_admin_says_so,
    an_admin_settles_an_unknown_capture_with_the_charge_the_provider_holds_for_it_and_every_later_retry_replays_its_answer,
    a_capture_settled_as_failed_by_an_admin_while_the_provider_holds_no_charge_for_it_fails_and_frees_its_order,
    an_admin_cannot_settle_a_capture_with_another_account_s_charge_which_stays_theirs_to_refund,
    failed_by_hand_is_refused_while_the_provider_holds_the_capture_s_charge_and_the_order_stays_held,
    a_charge_under_the_capture_s_key_that_is_not_its_own_settles_it_neither_way,
    while_the_provider_cannot_answer_a_resolution_is_503_writes_nothing_and_goes_through_once_it_answers,
    an_external_ref_outside_its_documented_form_is_refused_with_400_and_changes_nothing,
    a_capture_settled_completed_without_a_reference_holds_its_order_and_cannot_be_refunded_here,
    only_an_admin_of_the_account_settles_by_hand_and_only_an_operation_whose_outcome_is_unknown,
    a_resolution_sent_with_a_key_is_replayed_to_its_retry_and_the_key_sent_with_another_resolution_is_refused,
    another_admin_sending_an_admins_settlement_key_and_body_is_422_not_their_answer,
);

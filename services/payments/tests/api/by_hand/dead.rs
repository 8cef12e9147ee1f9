//! A dead event: failed too often, shown on its operation, sent again only
//! when an admin says so.

use axum::http::StatusCode;
use payment_provider::Faults;
use platform::{Backend, Role};
use serde_json::json;

use super::{dying_outbox, redeliver};
use crate::support::{ACME_AGENT, ACME_APPROVER, TestApp};

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

platform::both_backends!(
    an_event_that_fails_too_often_is_dead_shown_on_its_operation_and_sent_again_only_when_an_admin_says_so,
);

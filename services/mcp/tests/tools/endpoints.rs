//! What each tool maps onto: the tickets', payments' and deployments' own
//! endpoints, and a business refusal told apart from a refused request.

use std::time::Duration;

use platform::Backend;
use serde_json::json;

use crate::{eventually, support::*};

async fn ticket_comments_and_statuses_map_onto_their_endpoints(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    let created = mcp
        .call("create_ticket", ticket("the ticket", &project, "Disk full"))
        .await;
    let ticket_id = created.json["resource"]["id"].as_str().unwrap().to_owned();

    let comment = mcp
        .call(
            "comment_on_ticket",
            json!({"intent": "first note", "ticket_id": ticket_id, "body": "Looking"}),
        )
        .await;
    assert_eq!(comment.outcome(), "created");
    assert!(comment.json["resource"]["id"].as_str().unwrap().starts_with("cmt_"));

    let acknowledge = json!({"intent": "acknowledge it", "ticket_id": ticket_id, "status": "acknowledged"});
    assert_eq!(
        mcp.call("set_ticket_status", acknowledge.clone()).await.outcome(),
        "created"
    );
    assert_eq!(mcp.call("set_ticket_status", acknowledge).await.outcome(), "replayed");
    let declared_again =
        json!({"intent": "make sure it is acknowledged", "ticket_id": ticket_id, "status": "acknowledged"});
    let again = mcp.call("set_ticket_status", declared_again).await;
    assert_eq!(again.outcome(), "matched_existing");
    assert_eq!(again.json["resource"]["changed"], false);

    let read = mcp.call("get_ticket", json!({"ticket_id": ticket_id})).await;
    assert_eq!(read.outcome(), "found");
    assert_eq!(read.json["resource"]["status"], "acknowledged");
    let listed = mcp.call("list_tickets", json!({"project": project})).await;
    assert_eq!(listed.json["resource"]["data"].as_array().unwrap().len(), 1);
    let missing = mcp.call("get_ticket", json!({"ticket_id": "tkt_nothing"})).await;
    assert_eq!(missing.outcome(), "not_found");
}

async fn a_business_refusal_is_an_answer_and_a_request_refused_unclaimed_is_refused(backend: Backend) {
    let world = World::start(backend).await;
    let mcp = world.connect().await;
    let order = unique("order");
    let intent = |name: &str| {
        json!({"intent": name, "order_id": order, "amount": "12.50", "currency": "EUR",
               "payee": {"name": "Kiosk", "account": "DE89370400440532013000"}})
    };
    assert_eq!(
        mcp.call("create_payment_intent", intent("pay the order"))
            .await
            .outcome(),
        "created"
    );
    let second = mcp.call("create_payment_intent", intent("pay the order again")).await;
    assert!(!second.is_error, "a business refusal is an answer, not a fault");
    assert_eq!(second.outcome(), "business_failure");
    assert_eq!(second.next_step(), "stop: new intent or human review");
    assert_eq!(second.json["http_status"], 409);
    assert_eq!(second.json["resource"]["code"], "order_already_has_payment");

    let unknown_environment = mcp
        .call(
            "create_deployment",
            json!({"intent": "ship to prod", "service": "web", "environment": "prod", "artifact_digest": digest("a")}),
        )
        .await;
    assert!(!unknown_environment.is_error);
    assert_eq!(unknown_environment.outcome(), "refused");
    assert_eq!(unknown_environment.json["resource"]["code"], "unknown_environment");
    assert!(
        unknown_environment.json["operation_id"].is_null(),
        "nothing was claimed"
    );
}

async fn payments_are_captured_refunded_and_cancelled_through_their_tools(backend: Backend) {
    let world = World::start(backend).await;
    let mcp = world.connect().await;
    let create = |order: &str, intent: &str| {
        json!({"intent": intent, "order_id": order, "amount": "20.00", "currency": "EUR",
               "payee": {"name": "Kiosk", "account": "DE89370400440532013000"}})
    };
    let paid = mcp
        .call("create_payment_intent", create(&unique("order"), "pay order 1"))
        .await;
    let intent_id = paid.json["resource"]["id"].as_str().unwrap().to_owned();
    let capture = mcp
        .call(
            "capture_payment",
            json!({"intent": "capture order 1", "payment_intent_id": intent_id}),
        )
        .await;
    assert_eq!(capture.outcome(), "created");
    assert_eq!(capture.json["http_status"], 202);
    assert_eq!(
        capture.next_step(),
        "poll get_operation",
        "the capture goes on after its answer"
    );
    eventually(
        &mcp,
        "get_payment_intent",
        json!({"payment_intent_id": intent_id}),
        |i| i["state"] == "succeeded",
    )
    .await;
    let refund = mcp
        .call(
            "refund_payment",
            json!({"intent": "refund order 1 in part", "payment_intent_id": intent_id, "amount": "5.00"}),
        )
        .await;
    assert_eq!(refund.outcome(), "created");
    let too_much = mcp
        .call(
            "refund_payment",
            json!({"intent": "refund order 1 again", "payment_intent_id": intent_id, "amount": "50.00"}),
        )
        .await;
    assert_eq!(too_much.outcome(), "business_failure");
    assert_eq!(too_much.json["resource"]["code"], "refund_exceeds_captured");

    let unpaid = mcp
        .call("create_payment_intent", create(&unique("order"), "pay order 2"))
        .await;
    let unpaid_id = unpaid.json["resource"]["id"].as_str().unwrap().to_owned();
    let cancel = json!({"intent": "cancel order 2", "payment_intent_id": unpaid_id});
    assert_eq!(
        mcp.call("cancel_payment_intent", cancel.clone()).await.outcome(),
        "created"
    );
    assert_eq!(mcp.call("cancel_payment_intent", cancel).await.outcome(), "replayed");
    let read = mcp
        .call("get_payment_intent", json!({"payment_intent_id": unpaid_id}))
        .await;
    assert_eq!(read.json["resource"]["state"], "cancelled");
}

async fn a_deployment_is_cancelled_through_its_tool(backend: Backend) {
    // rollouts slow enough to be stopped half way
    let world = World::start_with_step(backend, Duration::from_secs(5)).await;
    let mcp = world.connect().await;
    let service = unique("api");
    let deploy = mcp
        .call(
            "create_deployment",
            json!({"intent": "api to staging", "service": service, "environment": "staging",
                   "artifact_digest": digest("api")}),
        )
        .await;
    assert_eq!(deploy.outcome(), "created");
    let deployment_id = deploy.json["resource"]["id"].as_str().unwrap().to_owned();
    let cancel = mcp
        .call(
            "cancel_deployment",
            json!({"intent": "stop the api rollout", "deployment_id": deployment_id}),
        )
        .await;
    assert_eq!(cancel.outcome(), "created", "{}", cancel.json);
    let read = mcp
        .call("get_deployment", json!({"deployment_id": deployment_id}))
        .await;
    assert_eq!(read.json["resource"]["state"], "cancelled");
}

platform::both_backends!(
    ticket_comments_and_statuses_map_onto_their_endpoints,
    a_business_refusal_is_an_answer_and_a_request_refused_unclaimed_is_refused,
    payments_are_captured_refunded_and_cancelled_through_their_tools,
    a_deployment_is_cancelled_through_its_tool,
);

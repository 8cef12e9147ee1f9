//! Every tool through a real MCP client (rmcp's) against the real services,
//! on both backends: what each tool maps onto, and every outcome an agent
//! can be answered with (docs/contract.md §13).

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use fault_proxy::ProxyFaults;
use platform::Backend;
use serde_json::{Value, json};
use support::*;

const WRITES: [&str; 10] = [
    "create_ticket",
    "comment_on_ticket",
    "set_ticket_status",
    "create_payment_intent",
    "capture_payment",
    "refund_payment",
    "cancel_payment_intent",
    "create_deployment",
    "cancel_deployment",
    "create_rollback",
];
const READS: [&str; 7] = [
    "get_operation",
    "get_ticket",
    "list_tickets",
    "get_payment_intent",
    "get_deployment",
    "get_environment",
    "get_approval",
];

async fn tools_are_listed_with_the_contracts_annotations_and_schemas(backend: Backend) {
    let world = World::start(backend).await;
    let mcp = world.connect().await;
    let tools = mcp.client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    let mut expected: Vec<&str> = WRITES.iter().chain(READS.iter()).copied().collect();
    expected.sort_unstable();
    assert_eq!(names, expected);
    for tool in &tools {
        let name = tool.name.as_ref();
        let hints = tool.annotations.as_ref().expect("every tool is annotated");
        let output = tool.output_schema.as_ref().expect("every tool declares its output");
        for member in [
            "outcome",
            "operation_id",
            "idempotency_key",
            "http_status",
            "resource",
            "next_step",
        ] {
            assert!(
                output["properties"].get(member).is_some(),
                "{name}'s output lacks {member}"
            );
        }
        let input = &tool.input_schema;
        assert!(
            input["properties"]
                .as_object()
                .unwrap()
                .keys()
                .all(|k| !k.contains("key") || k == "idempotency_key"),
            "{name} takes no API key"
        );
        let open_world = !name.contains("ticket") && !matches!(name, "get_operation" | "get_approval");
        assert_eq!(hints.open_world_hint, Some(open_world), "{name}: openWorldHint");
        if READS.contains(&name) {
            assert_eq!(hints.read_only_hint, Some(true), "{name} only reads");
            continue;
        }
        assert_eq!(hints.read_only_hint, Some(false), "{name} writes");
        assert_eq!(hints.idempotent_hint, Some(true), "{name} is idempotent by its intent");
        let destructive = matches!(
            name,
            "capture_payment" | "refund_payment" | "cancel_payment_intent" | "cancel_deployment" | "create_rollback"
        );
        assert_eq!(hints.destructive_hint, Some(destructive), "{name}: destructiveHint");
        assert!(input["properties"].get("intent").is_some(), "{name} takes an intent");
        assert!(tool.description.as_deref().unwrap().contains("same on every retry"));
    }
    // the schema is the service's: its limits and its enumerations
    let create = tools.iter().find(|t| t.name == "create_ticket").unwrap();
    assert_eq!(create.input_schema["properties"]["title"]["maxLength"], 200);
    assert_eq!(create.input_schema["required"], json!(["project", "title"]));
    assert_eq!(create.input_schema["additionalProperties"], false);
    let deploy = tools.iter().find(|t| t.name == "create_deployment").unwrap();
    assert_eq!(
        deploy.input_schema["properties"]["environment"]["enum"],
        json!(["development", "staging", "production"])
    );
    let capture = tools.iter().find(|t| t.name == "capture_payment").unwrap();
    assert!(capture.input_schema["properties"].get("payment_intent_id").is_some());
}

async fn the_same_intent_is_created_once_and_replayed_after_even_by_a_restarted_server(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    let first = mcp
        .call("create_ticket", ticket("ticket for alert 4411", &project, "Disk full"))
        .await;
    assert_eq!(first.outcome(), "created");
    assert_eq!(first.next_step(), "done");
    assert_eq!(first.json["http_status"], 201);
    assert!(first.str("operation_id").starts_with("op_"));
    assert!(first.json["resource"]["id"].as_str().unwrap().starts_with("tkt_"));

    let again = mcp
        .call("create_ticket", ticket("ticket for alert 4411", &project, "Disk full"))
        .await;
    assert_eq!(again.outcome(), "replayed");
    assert_eq!(again.json["operation_id"], first.json["operation_id"]);
    assert_eq!(again.json["idempotency_key"], first.json["idempotency_key"]);
    assert_eq!(again.json["resource"], first.json["resource"]);

    // a new server process on the same journal: the intent is the same key
    drop(mcp);
    let restarted = world.connect().await;
    let after = restarted
        .call("create_ticket", ticket("ticket for alert 4411", &project, "Disk full"))
        .await;
    assert_eq!(after.outcome(), "replayed");
    assert_eq!(after.json["idempotency_key"], first.json["idempotency_key"]);
    assert_eq!(world.tickets_in(&project).await.len(), 1);
}

async fn the_same_intent_with_another_payload_is_refused_and_nothing_is_sent(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    mcp.call("create_ticket", ticket("one intent", &project, "Disk full"))
        .await
        .outcome();
    let sent = world.tickets_proxy.passed().len();

    let changed = mcp
        .call("create_ticket", ticket("one intent", &project, "Disk almost full"))
        .await;
    assert_eq!(changed.error_code(), "intent_reused_with_changed_payload");
    assert_eq!(world.tickets_proxy.passed().len(), sent, "nothing was sent");
    let tickets = world.tickets_in(&project).await;
    assert_eq!(tickets.len(), 1);
    assert_eq!(tickets[0]["title"], "Disk full");
}

async fn input_the_service_would_refuse_is_a_tool_error_that_binds_no_intent(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    let blank = mcp.call("create_ticket", ticket("fix later", &project, "   ")).await;
    assert_eq!(blank.error_code(), "invalid_input");
    assert_eq!(blank.json["errors"][0]["field"], "title");
    let unknown = mcp
        .call(
            "create_ticket",
            json!({"intent": "fix later", "project": project, "title": "ok", "owner": "me"}),
        )
        .await;
    assert_eq!(unknown.error_code(), "invalid_input");
    let no_intent = mcp
        .call("create_ticket", json!({"project": project, "title": "ok"}))
        .await;
    assert_eq!(no_intent.error_code(), "invalid_input");
    assert!(world.tickets_proxy.passed().is_empty(), "nothing was sent");

    // the intent was never bound to the bad input: the fixed call runs
    let fixed = mcp
        .call("create_ticket", ticket("fix later", &project, "Disk full"))
        .await;
    assert_eq!(fixed.outcome(), "created");
}

async fn a_ticket_for_a_known_source_event_is_matched_existing(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    let event = json!({"project": project, "title": "Disk full", "source_event_id": "alert-1"});
    let mut first = event.clone();
    first["intent"] = json!("from the pager");
    let mut second = event;
    second["intent"] = json!("from the mail");
    let created = mcp.call("create_ticket", first).await;
    let matched = mcp.call("create_ticket", second).await;
    assert_eq!(created.outcome(), "created");
    assert_eq!(matched.outcome(), "matched_existing");
    assert_eq!(matched.next_step(), "done");
    assert_eq!(matched.json["resource"]["id"], created.json["resource"]["id"]);
    assert_ne!(matched.json["idempotency_key"], created.json["idempotency_key"]);
}

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

async fn an_explicit_key_is_sent_as_is_and_a_key_the_service_knows_otherwise_is_key_reused(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let key = uuid::Uuid::new_v4().to_string();
    // a script sent the key over HTTP first
    let direct = reqwest::Client::new()
        .post(format!("{}/v1/tickets", world.tickets))
        .bearer_auth(ACME_AGENT)
        .header("idempotency-key", &key)
        .json(&json!({"project": project, "title": "From a script"}))
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 201);

    let mcp = world.connect().await;
    let same = mcp
        .call(
            "create_ticket",
            json!({"idempotency_key": key, "project": project, "title": "From a script"}),
        )
        .await;
    assert_eq!(same.outcome(), "replayed");
    assert_eq!(same.str("idempotency_key"), key);
    let other = uuid::Uuid::new_v4().to_string();
    let reused = reqwest::Client::new()
        .post(format!("{}/v1/tickets", world.tickets))
        .bearer_auth(ACME_AGENT)
        .header("idempotency-key", &other)
        .json(&json!({"project": project, "title": "Something else"}))
        .send()
        .await
        .unwrap();
    assert_eq!(reused.status(), 201);
    let conflict = mcp
        .call(
            "create_ticket",
            json!({"idempotency_key": other, "project": project, "title": "From the agent"}),
        )
        .await;
    assert_eq!(conflict.outcome(), "key_reused");
    assert_eq!(conflict.next_step(), "stop: new intent or human review");
    assert_eq!(world.tickets_in(&project).await.len(), 2);
}

async fn a_lost_answer_is_asked_about_by_key_and_the_call_answers_the_replay(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    world.tickets_proxy.set_faults(ProxyFaults {
        drop_next_answers: 1,
        ..Default::default()
    });
    let call = mcp
        .call("create_ticket", ticket("despite the network", &project, "Disk full"))
        .await;
    assert_eq!(
        call.outcome(),
        "replayed",
        "the first answer was lost; the call got its replay"
    );
    let passed = world.tickets_proxy.passed();
    assert!(
        passed
            .iter()
            .any(|p| p.method == "GET" && p.path.starts_with("/v1/operations")),
        "the operation was asked about by key before the request was sent again: {passed:?}"
    );
    assert_eq!(world.tickets_in(&project).await.len(), 1);
}

async fn an_unreachable_service_is_a_tool_error_and_the_intent_keeps_its_key(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mut config = world.config();
    config.tickets.url = "http://127.0.0.1:9".into();
    config.agent.max_sends = 2;
    let unreachable = world.connect_with(config).await;
    let failed = unreachable
        .call("create_ticket", ticket("when it is back", &project, "Disk full"))
        .await;
    assert_eq!(failed.error_code(), "service_unreachable");
    let key = unreachable
        .gateway
        .calls()
        .all()
        .await
        .unwrap()
        .last()
        .unwrap()
        .idempotency_key
        .clone()
        .unwrap();

    let reachable = world.connect().await;
    let later = reachable
        .call("create_ticket", ticket("when it is back", &project, "Disk full"))
        .await;
    assert_eq!(later.outcome(), "created");
    assert_eq!(
        later.str("idempotency_key"),
        key,
        "the key was made once, before the first send"
    );
}

async fn a_protected_deployment_awaits_approval_and_the_same_call_then_answers_the_run(backend: Backend) {
    let world = World::start(backend).await;
    let mcp = world.connect().await;
    let service = unique("web");
    let deploy = json!({"intent": "release 1.2 to production", "service": service, "environment": "production",
                        "artifact_digest": digest("release-1.2")});
    let waiting = mcp.call("create_deployment", deploy.clone()).await;
    assert_eq!(waiting.outcome(), "awaiting_approval");
    assert_eq!(waiting.next_step(), "wait for approval");
    let approval_id = waiting.json["approval"]["approval_id"].as_str().unwrap().to_owned();
    assert!(
        waiting.json["approval"]["status_url"]
            .as_str()
            .unwrap()
            .contains("/v1/operations/")
    );
    assert!(waiting.json["approval"]["summary"].is_object());

    let read = mcp.call("get_approval", json!({"approval_id": approval_id})).await;
    assert_eq!(read.outcome(), "found");
    assert_eq!(read.json["resource"]["state"], "pending");
    assert_eq!(read.next_step(), "wait for approval");
    approve(&world, &approval_id).await;
    let decided = mcp.call("get_approval", json!({"approval_id": approval_id})).await;
    assert_eq!(decided.json["resource"]["state"], "approved");
    assert_eq!(decided.next_step(), "call again with the same intent");
    let approved = mcp
        .call("get_operation", json!({"intent": "release 1.2 to production"}))
        .await;
    assert_eq!(approved.json["resource"]["state"], "awaiting_approval");
    assert_eq!(
        approved.next_step(),
        "call again with the same intent",
        "approved: the same call runs it"
    );

    let ran = mcp.call("create_deployment", deploy).await;
    assert_eq!(ran.json["http_status"], 202, "{}", ran.json);
    assert_eq!(ran.outcome(), "created", "the approved run is this call's");
    assert_eq!(ran.next_step(), "poll get_operation");
    let deployment_id = ran.json["resource"]["id"].as_str().unwrap().to_owned();

    let operation = mcp
        .call("get_operation", json!({"intent": "release 1.2 to production"}))
        .await;
    assert_eq!(operation.outcome(), "found");
    assert_eq!(operation.json["operation_id"], ran.json["operation_id"]);
    assert_ne!(operation.json["resource"]["state"], "awaiting_approval");
    let by_key = mcp
        .call("get_operation", json!({"idempotency_key": ran.str("idempotency_key")}))
        .await;
    assert_eq!(by_key.json["operation_id"], ran.json["operation_id"]);
    let by_id = mcp
        .call("get_operation", json!({"operation_id": ran.str("operation_id")}))
        .await;
    assert_eq!(by_id.json["resource"]["idempotency_key"], ran.json["idempotency_key"]);
    let never = mcp
        .call("get_operation", json!({"intent": "an intent never used"}))
        .await;
    assert_eq!(never.outcome(), "not_found");
    assert_eq!(
        never.next_step(),
        "call again with the same intent",
        "nothing was claimed: sending is safe"
    );
    let unknown_key = mcp
        .call("get_operation", json!({"idempotency_key": "never-sent"}))
        .await;
    assert_eq!(unknown_key.outcome(), "not_found");
    let unknown_id = mcp.call("get_operation", json!({"operation_id": "op_none"})).await;
    assert_eq!(unknown_id.outcome(), "not_found");
    assert_eq!(unknown_id.next_step(), "stop: new intent or human review");

    let deployment = eventually(&mcp, "get_deployment", json!({"deployment_id": deployment_id}), |d| {
        d["state"] == "succeeded"
    })
    .await;
    assert_eq!(deployment["service"], service.as_str());
    let environment = mcp
        .call(
            "get_environment",
            json!({"service": service, "environment": "production"}),
        )
        .await;
    assert_eq!(environment.json["resource"]["current"]["id"], deployment_id.as_str());
}

async fn a_rollback_always_awaits_approval(backend: Backend) {
    let world = World::start(backend).await;
    let mcp = world.connect().await;
    let service = unique("web");
    let mut releases = Vec::new();
    for version in ["1.0", "1.1"] {
        let deploy = json!({"intent": format!("staging {version}"), "service": service, "environment": "staging",
                            "artifact_digest": digest(version)});
        let created = mcp.call("create_deployment", deploy).await;
        assert_eq!(created.outcome(), "created");
        let id = created.json["resource"]["id"].as_str().unwrap().to_owned();
        eventually(&mcp, "get_deployment", json!({"deployment_id": id}), |d| {
            d["state"] == "succeeded"
        })
        .await;
        releases.push(id);
    }
    let rollback = mcp
        .call(
            "create_rollback",
            json!({"intent": "back to 1.0", "service": service, "environment": "staging",
                   "to_deployment_id": releases[0], "reason": "errors after 1.1"}),
        )
        .await;
    assert_eq!(rollback.outcome(), "awaiting_approval", "{}", rollback.json);
    assert_eq!(rollback.next_step(), "wait for approval");
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

async fn a_cancelled_call_finishes_its_request_and_the_next_call_replays_it(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    world.tickets_proxy.set_faults(ProxyFaults {
        delay_ms: 600,
        ..Default::default()
    });
    let arguments = ticket("despite the cancel", &project, "Disk full");
    let request = rmcp::model::CallToolRequestParams::new("create_ticket").with_arguments(args(arguments.clone()));
    let handle = mcp
        .client
        .send_cancellable_request(
            rmcp::model::ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(request)),
            rmcp::service::PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    handle.cancel(Some("the user gave up".into())).await.unwrap();
    // the request the server had sent goes on: the ticket appears
    let mut tickets = Vec::new();
    for _ in 0..100 {
        tickets = world.tickets_in(&project).await;
        if !tickets.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(tickets.len(), 1, "the cancelled call's request still ran");
    // the cancelled call ends on the server's side: it is journaled when its request is answered
    for _ in 0..100 {
        if !mcp.gateway.calls().all().await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    world.tickets_proxy.set_faults(ProxyFaults::default());
    let next = mcp.call("create_ticket", arguments).await;
    assert_eq!(next.outcome(), "replayed");
    assert_eq!(next.json["resource"]["id"], tickets[0]["id"]);
    assert_eq!(world.tickets_in(&project).await.len(), 1);
    let posts = world
        .tickets_proxy
        .passed()
        .iter()
        .filter(|p| p.method == "POST")
        .count();
    assert_eq!(
        posts, 1,
        "the request ran to its answer once, and the next call knew it"
    );
}

async fn every_call_is_journaled_with_its_session_intent_key_and_outcome(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    let created = mcp
        .call("create_ticket", ticket("journaled", &project, "Disk full"))
        .await;
    mcp.call("create_ticket", ticket("journaled", &project, "Disk full"))
        .await;
    mcp.call("create_ticket", ticket("journaled", &project, "Changed"))
        .await;
    mcp.call("get_operation", json!({"intent": "journaled"})).await;
    let calls = mcp.gateway.calls().all().await.unwrap();
    let summary: Vec<(&str, &str)> = calls.iter().map(|c| (c.tool.as_str(), c.outcome.as_str())).collect();
    assert_eq!(
        summary,
        [
            ("create_ticket", "created"),
            ("create_ticket", "replayed"),
            ("create_ticket", "intent_reused_with_changed_payload"),
            ("get_operation", "found"),
        ]
    );
    let key = created.str("idempotency_key");
    let operation = created.str("operation_id");
    assert!(calls.iter().all(|c| c.idempotency_key.as_deref() == Some(key.as_str())));
    assert!(
        calls
            .iter()
            .all(|c| c.session.starts_with("stdio ") && c.session == calls[0].session)
    );
    assert_eq!(calls[0].intent.as_deref(), Some("journaled"));
    assert_eq!(calls[0].operation_id.as_deref(), Some(operation.as_str()));
    assert_eq!(calls[0].http_status, Some(201));
    assert_eq!(calls[0].payload_digest, calls[1].payload_digest);
    assert_ne!(
        calls[2].payload_digest, calls[0].payload_digest,
        "the changed payload shows"
    );
}

async fn a_refused_server_key_is_a_tool_error_and_the_intent_is_sent_again_once_it_is_fixed(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mut config = world.config();
    config.tickets.api_key = "rs_not_a_key".into();
    let misconfigured = world.connect_with(config).await;
    let refused = misconfigured
        .call("create_ticket", ticket("after the fix", &project, "Disk full"))
        .await;
    assert_eq!(refused.error_code(), "api_key_refused");
    drop(misconfigured);

    let fixed = world.connect().await;
    let created = fixed
        .call("create_ticket", ticket("after the fix", &project, "Disk full"))
        .await;
    assert_eq!(
        created.outcome(),
        "created",
        "the refusal was not kept as the intent's outcome"
    );
    let journaled = fixed.gateway.calls().all().await.unwrap();
    assert_eq!(
        journaled[0].idempotency_key, journaled[1].idempotency_key,
        "the account's intent kept its key across the fix"
    );
    assert_eq!(world.tickets_in(&project).await.len(), 1);
}

async fn servers_that_share_a_journal_but_not_an_account_never_share_an_intent(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let acme = world.connect().await;
    let globex = world.connect_with(world.config_for("globex", GLOBEX_AGENT)).await;
    let for_acme = acme
        .call("create_ticket", ticket("the same words", &project, "Disk full"))
        .await;
    let for_globex = globex
        .call("create_ticket", ticket("the same words", &project, "Disk full"))
        .await;
    assert_eq!(for_acme.outcome(), "created");
    assert_eq!(
        for_globex.outcome(),
        "created",
        "globex's ticket is its own, not acme's replayed"
    );
    assert_ne!(for_globex.json["idempotency_key"], for_acme.json["idempotency_key"]);
    assert_ne!(for_globex.json["resource"]["id"], for_acme.json["resource"]["id"]);
    globex
        .call("create_ticket", ticket("globex's words alone", &project, "Disk full"))
        .await
        .outcome();
    let never_acmes = acme
        .call("get_operation", json!({"intent": "globex's words alone"}))
        .await;
    assert_eq!(never_acmes.outcome(), "not_found");
    assert_eq!(never_acmes.next_step(), "call again with the same intent");
}

async fn a_key_another_account_sent_through_the_same_journal_is_not_this_accounts(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let acme = world.connect().await;
    let globex = world.connect_with(world.config_for("globex", GLOBEX_AGENT)).await;
    let key = uuid::Uuid::new_v4().to_string();
    let sent = json!({"idempotency_key": key, "project": project, "title": "Disk full"});
    let for_globex = globex.call("create_ticket", sent.clone()).await;
    assert_eq!(for_globex.outcome(), "created");

    let before = acme.call("get_operation", json!({"idempotency_key": key})).await;
    assert_eq!(before.outcome(), "not_found");
    assert_eq!(
        before.next_step(),
        "call again with the same intent",
        "acme never sent this key: nothing of acme's is done"
    );
    let for_acme = acme.call("create_ticket", sent).await;
    assert_eq!(
        for_acme.outcome(),
        "created",
        "acme's own operation, not a journal error"
    );
    assert_eq!(for_acme.str("idempotency_key"), key);
    assert_ne!(for_acme.json["operation_id"], for_globex.json["operation_id"]);
    assert_ne!(for_acme.json["resource"]["id"], for_globex.json["resource"]["id"]);
    let after = acme.call("get_operation", json!({"idempotency_key": key})).await;
    assert_eq!(after.outcome(), "found");
    assert_eq!(after.json["operation_id"], for_acme.json["operation_id"]);
    assert_eq!(world.tickets_in(&project).await.len(), 1, "acme's one ticket");
}

async fn a_failing_journal_is_a_tool_error_that_carries_none_of_the_databases_text(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    let created = mcp
        .call("create_ticket", ticket("before the failure", &project, "Disk full"))
        .await;
    assert_eq!(created.outcome(), "created");
    // the journal's tables go away under the running server
    let file = sqlx::SqlitePool::connect(&format!("sqlite://{}", world.journal_path().display()))
        .await
        .unwrap();
    for gone in [
        "ALTER TABLE agent_operations RENAME TO intents_elsewhere",
        "ALTER TABLE mcp_tool_calls RENAME TO calls_elsewhere",
    ] {
        sqlx::query(gone).execute(&file).await.unwrap();
    }

    let failed = [
        mcp.call("create_ticket", ticket("after the failure", &project, "Disk full"))
            .await,
        mcp.call("get_operation", json!({"intent": "before the failure"})).await,
        mcp.call(
            "get_operation",
            json!({"idempotency_key": created.str("idempotency_key")}),
        )
        .await,
        mcp.call("get_approval", json!({"approval_id": "apr_any"})).await,
    ];
    for call in failed {
        assert_eq!(call.error_code(), "journal_unavailable");
        let detail = call.str("detail").to_lowercase();
        for database_text in [
            "sqlite",
            "database",
            "no such table",
            "agent_operations",
            "mcp_tool_calls",
        ] {
            assert!(
                !detail.contains(database_text),
                "the database's text reached the agent: {detail}"
            );
        }
    }
    assert_eq!(world.tickets_in(&project).await.len(), 1, "nothing more was sent");
}

async fn a_key_one_of_the_accounts_intents_holds_is_refused_for_another_request(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let mcp = world.connect().await;
    let created = mcp
        .call("create_ticket", ticket("the intent", &project, "Disk full"))
        .await;
    assert_eq!(created.outcome(), "created");
    let sent = world.tickets_proxy.passed().len();

    let reused = mcp
        .call(
            "create_ticket",
            json!({"idempotency_key": created.str("idempotency_key"), "project": project, "title": "Disk almost full"}),
        )
        .await;

    assert_eq!(reused.error_code(), "idempotency_key_reused");
    assert_eq!(world.tickets_proxy.passed().len(), sent, "nothing was sent");
    assert_eq!(world.tickets_in(&project).await.len(), 1);
}

async fn a_journal_made_before_accounts_keeps_each_accounts_intents_and_approval_waits(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let [acme_key, globex_key] = [(); 2].map(|()| uuid::Uuid::new_v4().to_string());
    let request = agent::Request::post(
        &world.tickets_proxy.url,
        "/v1/tickets",
        json!({"project": project, "title": "Disk full"}),
    );
    // the file as the MCP server left it before its journal kept accounts
    let old = sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(world.journal_path())
            .create_if_missing(true),
    )
    .await
    .unwrap();
    sqlx::migrate!("../../migrations/agent/sqlite")
        .run_to(6, &old)
        .await
        .unwrap();
    let mut calls = sqlx::migrate!("../../migrations/mcp/sqlite");
    calls.dangerous_set_table_name("_mcp_migrations");
    calls.run_to(7, &old).await.unwrap();
    for (name, key) in [
        ("intent:account acme:ship it", &acme_key),
        ("intent:account globex:ship it", &globex_key),
    ] {
        sqlx::query(
            "INSERT INTO agent_operations (name, idempotency_key, payload_digest, method, target, state, \
             created_at, updated_at) VALUES ($1, $2, $3, 'POST', $4, 'pending', '2020-01-01T00:00:00Z', \
             '2020-01-01T00:00:00Z')",
        )
        .bind(name)
        .bind(key)
        .bind(agent::journal::payload_digest(&request))
        .bind(request.target())
        .execute(&old)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO mcp_tool_calls (at, session, tool, intent, idempotency_key, outcome, operation_id, approval_id) \
         VALUES ('2020-01-01T00:00:00Z', 'stdio 1', 'create_ticket', 'ship it', $1, 'awaiting_approval', 'op_1', \
         'apr_1')",
    )
    .bind(&acme_key)
    .execute(&old)
    .await
    .unwrap();
    old.close().await;

    let acme = world.connect().await;
    let globex = world.connect_with(world.config_for("globex", GLOBEX_AGENT)).await;
    let arguments = ticket("ship it", &project, "Disk full");
    let for_acme = acme.call("create_ticket", arguments.clone()).await;
    let for_globex = globex.call("create_ticket", arguments).await;
    let waited = |account: &str| {
        let calls = acme.gateway.calls().clone();
        let account = agent::Account::named(account);
        async move { calls.waiting_for(&account, "apr_1").await.unwrap() }
    };

    assert_eq!(for_acme.outcome(), "created");
    assert_eq!(for_acme.str("idempotency_key"), acme_key, "acme's intent kept its key");
    assert_eq!(for_globex.outcome(), "created");
    assert_eq!(for_globex.str("idempotency_key"), globex_key, "and globex's its own");
    assert_eq!(waited("acme").await, Some(("create_ticket".into(), "op_1".into())));
    assert_eq!(waited("globex").await, None, "acme's approval wait is not globex's");
}

/// Requests a stand-in tickets service holds: now, the most at once, and in all.
#[derive(Debug, Default)]
struct Held {
    now: AtomicUsize,
    most: AtomicUsize,
    all: AtomicUsize,
}

/// A stand-in for the tickets service that holds each request a moment
/// before it creates the ticket, counting the requests it holds at once.
async fn holding_tickets_service() -> (String, Arc<Held>) {
    let held = Arc::new(Held::default());
    let counted = held.clone();
    let router = axum::Router::new().route(
        "/v1/tickets",
        axum::routing::post(move || {
            let held = counted.clone();
            async move {
                let now = held.now.fetch_add(1, Ordering::SeqCst) + 1;
                held.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
                held.now.fetch_sub(1, Ordering::SeqCst);
                let n = held.all.fetch_add(1, Ordering::SeqCst);
                (
                    axum::http::StatusCode::CREATED,
                    [("operation-id", format!("op_{n}"))],
                    axum::Json(json!({"id": format!("tkt_{n}"), "status": "open"})),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (url, held)
}

async fn past_the_bound_on_calls_under_way_a_call_waits_for_one_to_end_and_none_is_dropped(backend: Backend) {
    let world = World::start(backend).await;
    let (url, held) = holding_tickets_service().await;
    let mut config = world.config();
    config.tickets.url = url;
    config.max_runs = 2;
    let mcp = world.connect_with(config).await;
    let project = unique("ops");

    let calls = (0..6).map(|n| mcp.call("create_ticket", ticket(&format!("run {n}"), &project, "Disk full")));
    futures::future::join_all(calls).await;

    let most = held.most.load(Ordering::SeqCst);
    assert_eq!(
        most, 2,
        "requests sent at once: as many as the bound allows, never more"
    );
    assert_eq!(held.all.load(Ordering::SeqCst), 6, "every call was sent, once");
}

/// Approves an approval as the approver does, over HTTP, echoing its fingerprint.
async fn approve(world: &World, approval_id: &str) {
    let approval = world
        .get(
            &world.deployments,
            &format!("/v1/approvals/{approval_id}"),
            ACME_APPROVER,
        )
        .await;
    let (status, body) = world
        .post(
            &world.deployments,
            &format!("/v1/approvals/{approval_id}/decision"),
            ACME_APPROVER,
            json!({"decision": "approve", "fingerprint": approval["fingerprint"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
}

/// Reads with `tool` until `done` holds for the resource.
async fn eventually(mcp: &Client, tool: &str, arguments: Value, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..200 {
        let read = mcp.call(tool, arguments.clone()).await;
        if done(&read.json["resource"]) {
            return read.json["resource"].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{tool} never showed what was awaited");
}

platform::both_backends!(
    tools_are_listed_with_the_contracts_annotations_and_schemas,
    the_same_intent_is_created_once_and_replayed_after_even_by_a_restarted_server,
    the_same_intent_with_another_payload_is_refused_and_nothing_is_sent,
    input_the_service_would_refuse_is_a_tool_error_that_binds_no_intent,
    a_ticket_for_a_known_source_event_is_matched_existing,
    ticket_comments_and_statuses_map_onto_their_endpoints,
    a_business_refusal_is_an_answer_and_a_request_refused_unclaimed_is_refused,
    an_explicit_key_is_sent_as_is_and_a_key_the_service_knows_otherwise_is_key_reused,
    a_lost_answer_is_asked_about_by_key_and_the_call_answers_the_replay,
    an_unreachable_service_is_a_tool_error_and_the_intent_keeps_its_key,
    a_protected_deployment_awaits_approval_and_the_same_call_then_answers_the_run,
    a_rollback_always_awaits_approval,
    payments_are_captured_refunded_and_cancelled_through_their_tools,
    a_deployment_is_cancelled_through_its_tool,
    a_cancelled_call_finishes_its_request_and_the_next_call_replays_it,
    every_call_is_journaled_with_its_session_intent_key_and_outcome,
    a_refused_server_key_is_a_tool_error_and_the_intent_is_sent_again_once_it_is_fixed,
    servers_that_share_a_journal_but_not_an_account_never_share_an_intent,
    a_key_another_account_sent_through_the_same_journal_is_not_this_accounts,
    a_failing_journal_is_a_tool_error_that_carries_none_of_the_databases_text,
    a_key_one_of_the_accounts_intents_holds_is_refused_for_another_request,
    a_journal_made_before_accounts_keeps_each_accounts_intents_and_approval_waits,
    past_the_bound_on_calls_under_way_a_call_waits_for_one_to_end_and_none_is_dropped,
);

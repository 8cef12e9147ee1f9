//! An intent's key: made once, replayed after, refused with another payload,
//! asked about after a lost answer, kept while a service is unreachable.

use std::time::Duration;

use fault_proxy::ProxyFaults;
use platform::Backend;
use serde_json::json;

use crate::support::*;

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

platform::both_backends!(
    the_same_intent_is_created_once_and_replayed_after_even_by_a_restarted_server,
    the_same_intent_with_another_payload_is_refused_and_nothing_is_sent,
    input_the_service_would_refuse_is_a_tool_error_that_binds_no_intent,
    a_ticket_for_a_known_source_event_is_matched_existing,
    an_explicit_key_is_sent_as_is_and_a_key_the_service_knows_otherwise_is_key_reused,
    a_lost_answer_is_asked_about_by_key_and_the_call_answers_the_replay,
    an_unreachable_service_is_a_tool_error_and_the_intent_keeps_its_key,
    a_cancelled_call_finishes_its_request_and_the_next_call_replays_it,
);

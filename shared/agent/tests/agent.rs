//! The agent's retry rule against a real tickets service over HTTP, with a
//! fault proxy between them, on both of the service's backends: the key
//! stored before the first send and reused after a restart, a dropped answer
//! asked about and replayed, a changed payload refused locally, a conflict
//! and a business failure never retried, an approval reported.

use std::time::Duration;

use agent::{Agent, AgentConfig, AgentError, Outcome, Request};
use fault_proxy::{FaultProxy, ProxyFaults};
use platform::{Backend, on_pool, testing::TestDb};
use serde_json::{Value, json};
use tickets::domain::{Priority, TicketsPolicy};

struct World {
    service: String,
    proxy: FaultProxy,
    db: TestDb,
    journal: tempfile::TempDir,
}

/// A tickets service on a loopback port (urgent tickets wait for an
/// approver), a proxy in front of it, and a directory for the agent's journal.
async fn world(backend: Backend) -> World {
    let db = TestDb::new(backend).await;
    tickets::migrate(&db.db).await.unwrap();
    let app = tickets::App::new(db.db.clone(), Default::default(), true).with_policy(TicketsPolicy {
        approval_from: Some(Priority::Urgent),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service = format!("http://{}", listener.local_addr().unwrap());
    let router = tickets::build_router(app);
    tokio::spawn(async move { axum::serve(listener, router).await });
    World {
        proxy: FaultProxy::start(service.clone()).await.unwrap(),
        service,
        db,
        journal: tempfile::tempdir().unwrap(),
    }
}

impl World {
    async fn agent(&self) -> Agent {
        let config = AgentConfig {
            request_timeout: Duration::from_millis(800),
            backoff: Duration::from_millis(20),
            ..AgentConfig::default()
        };
        Agent::open(&self.journal.path().join("journal.db"), "demo-acme-agent", config)
            .await
            .unwrap()
    }

    fn ticket(&self, title: &str) -> Request {
        Request::post(
            &self.proxy.url,
            "/v1/tickets",
            json!({"project": "ops", "title": title, "priority": "high"}),
        )
    }

    async fn tickets(&self) -> i64 {
        on_pool!(self.db.db.read(), |pool| sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM tickets"
        )
        .fetch_one(pool)
        .await
        .unwrap())
    }

    fn sends_through_the_proxy(&self) -> usize {
        self.proxy.passed().iter().filter(|p| p.method == "POST").count()
    }
}

async fn the_key_is_stored_before_the_first_send_and_a_restarted_agent_sends_the_same_key(backend: Backend) {
    let world = world(backend).await;
    let unreachable = Request::post(
        "http://127.0.0.1:9",
        "/v1/tickets",
        json!({"project": "ops", "title": "Rotate staging certificate", "priority": "high"}),
    );
    let first_run = world.agent().await;
    let lost = first_run.execute("rotate-cert", &unreachable).await.unwrap();
    let stored = first_run.journal().entry("rotate-cert").await.unwrap().unwrap();
    first_run.journal().close().await;

    // the agent process restarts, and runs the same operation again
    let restarted = world.agent().await;
    let again = restarted.execute("rotate-cert", &unreachable).await.unwrap();

    assert_eq!(lost.outcome, Outcome::InProgress, "nothing is known: {}", lost.note);
    assert_eq!(
        lost.idempotency_key, stored.idempotency_key,
        "the key was stored before the first send"
    );
    assert_eq!(
        again.idempotency_key, stored.idempotency_key,
        "the restarted agent reuses it"
    );
}

async fn a_restarted_agent_finishes_the_operation_under_the_key_it_stored(backend: Backend) {
    let world = world(backend).await;
    world.proxy.set_faults(ProxyFaults {
        fail_next: 100,
        ..ProxyFaults::default()
    });
    let first_run = world.agent().await;
    let failed = first_run
        .execute("rotate-cert", &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();
    first_run.journal().close().await;
    world.proxy.set_faults(ProxyFaults::default());

    let restarted = world.agent().await;
    let done = restarted
        .execute("rotate-cert", &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();
    let at_the_service = restarted
        .status(&world.service, done.operation_id.as_deref().unwrap())
        .await
        .unwrap();

    assert_eq!(failed.outcome, Outcome::InProgress, "{}", failed.note);
    assert_eq!(done.outcome, Outcome::Created, "{}", done.note);
    assert_eq!(done.idempotency_key, failed.idempotency_key);
    assert_eq!(at_the_service["idempotency_key"], done.idempotency_key);
    assert_eq!(world.tickets().await, 1);
}

async fn a_dropped_answer_is_asked_about_and_the_retry_with_the_same_key_replays_it(backend: Backend) {
    let world = world(backend).await;
    world.proxy.set_faults(ProxyFaults {
        drop_next_answers: 1,
        ..ProxyFaults::default()
    });
    let agent = world.agent().await;

    let report = agent
        .execute("rotate-cert", &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();
    let attempts: Vec<String> = agent
        .journal()
        .attempts(Some("rotate-cert"))
        .await
        .unwrap()
        .into_iter()
        .map(|a| format!("{} {}", a.action, a.note))
        .collect();

    assert_eq!(report.outcome, Outcome::Replayed, "{}", report.note);
    assert_eq!(report.sends, 2);
    assert_eq!(report.status, Some(201));
    assert_eq!(world.tickets().await, 1, "one ticket, though the agent sent twice");
    assert!(attempts[0].starts_with("send no answer in time"), "{attempts:?}");
    assert!(
        attempts[1].starts_with("ask op_") && attempts[1].ends_with("is completed"),
        "{attempts:?}"
    );
    let keys: Vec<_> = world
        .proxy
        .passed()
        .into_iter()
        .filter_map(|p| p.idempotency_key)
        .collect();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "both sends carried the one key");
}

async fn the_same_name_with_another_payload_is_refused_before_anything_is_sent(backend: Backend) {
    let world = world(backend).await;
    let agent = world.agent().await;
    agent
        .execute("rotate-cert", &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();
    let sent = world.sends_through_the_proxy();

    let changed = agent
        .execute("rotate-cert", &world.ticket("Rotate production certificate"))
        .await;

    assert!(matches!(changed, Err(AgentError::ChangedPayload { .. })), "{changed:?}");
    assert_eq!(world.sends_through_the_proxy(), sent, "nothing was sent");
    assert_eq!(world.tickets().await, 1);
}

async fn a_known_success_is_never_sent_again(backend: Backend) {
    let world = world(backend).await;
    let agent = world.agent().await;

    let first = agent
        .execute("rotate-cert", &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();
    let again = agent
        .execute("rotate-cert", &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();

    assert_eq!(first.outcome, Outcome::Created);
    assert_eq!(again.outcome, Outcome::Created, "known from the journal");
    assert_eq!(again.sends, 0);
    assert_eq!(world.sends_through_the_proxy(), 1);
}

async fn a_reused_key_is_a_conflict_and_the_agent_stops(backend: Backend) {
    let world = world(backend).await;
    let agent = world.agent().await;
    // another request got to the service first with this operation's key
    let entry = agent
        .journal()
        .begin("rotate-cert", &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();
    let squatted = reqwest::Client::new()
        .post(format!("{}/v1/tickets", world.service))
        .bearer_auth("demo-acme-agent")
        .header("idempotency-key", &entry.idempotency_key)
        .json(&json!({"project": "ops", "title": "Something else"}))
        .send()
        .await
        .unwrap();
    assert_eq!(squatted.status(), 201);

    let report = agent
        .execute("rotate-cert", &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();

    assert_eq!(report.outcome, Outcome::Conflict, "{}", report.note);
    assert_eq!(report.sends, 1, "a conflict is never retried");
    assert_eq!(world.tickets().await, 1, "the second body made nothing");
}

async fn a_known_business_failure_is_not_retried(backend: Backend) {
    let world = world(backend).await;
    let agent = world.agent().await;
    let comment = Request::post(
        &world.proxy.url,
        "/v1/tickets/tkt_missing/comments",
        json!({"body": "Rotated."}),
    );

    let report = agent.execute("comment", &comment).await.unwrap();

    assert_eq!(report.outcome, Outcome::Failed, "{}", report.note);
    assert_eq!(report.status, Some(404));
    assert_eq!(report.sends, 1);
}

async fn an_approval_request_is_reported_and_the_run_after_the_decision_creates(backend: Backend) {
    let world = world(backend).await;
    let agent = world.agent().await;
    let urgent = Request::post(
        &world.proxy.url,
        "/v1/tickets",
        json!({"project": "payments-api", "title": "Checkout is down", "priority": "urgent"}),
    );

    let waiting = agent.execute("page-on-call", &urgent).await.unwrap();
    let request: Value = waiting.body.clone().unwrap();
    let decided = reqwest::Client::new()
        .post(format!(
            "{}/v1/approvals/{}/decision",
            world.service,
            request["approval_id"].as_str().unwrap()
        ))
        .bearer_auth("demo-acme-approver")
        .json(&json!({"decision": "approve", "fingerprint": request["fingerprint"]}))
        .send()
        .await
        .unwrap();
    let done = agent.execute("page-on-call", &urgent).await.unwrap();

    assert_eq!(waiting.outcome, Outcome::AwaitingApproval, "{}", waiting.note);
    assert_eq!(waiting.sends, 1, "a human decides; the agent stops");
    assert_eq!(decided.status(), 200);
    assert_eq!(done.outcome, Outcome::Created, "{}", done.note);
    assert_eq!(done.operation_id, waiting.operation_id, "one operation throughout");
    assert_eq!(world.tickets().await, 1);
}

platform::both_backends!(
    the_key_is_stored_before_the_first_send_and_a_restarted_agent_sends_the_same_key,
    a_restarted_agent_finishes_the_operation_under_the_key_it_stored,
    a_dropped_answer_is_asked_about_and_the_retry_with_the_same_key_replays_it,
    the_same_name_with_another_payload_is_refused_before_anything_is_sent,
    a_known_success_is_never_sent_again,
    a_reused_key_is_a_conflict_and_the_agent_stops,
    a_known_business_failure_is_not_retried,
    an_approval_request_is_reported_and_the_run_after_the_decision_creates,
);

//! The agent's retry rule against a real tickets service over HTTP, with a
//! fault proxy between them, on both of the service's backends: the key
//! stored before the first send and reused after a restart, a dropped answer
//! asked about and replayed, a changed payload refused locally, a conflict
//! and a business failure never retried, an approval reported; agents of
//! two accounts on one journal file, each with its own operations; a journal
//! made before it kept accounts, upgraded with every key.

use std::time::Duration;

use agent::{Account, Agent, AgentConfig, AgentError, Outcome, Request, journal::payload_digest};
use fault_proxy::{FaultProxy, ProxyFaults};
use platform::{
    Backend, on_pool,
    testing::{ACME_AGENT, GLOBEX_AGENT, TestDb},
};
use serde_json::{Value, json};
use tickets::domain::{Priority, TicketsPolicy};

fn agent_config() -> AgentConfig {
    AgentConfig {
        request_timeout: Duration::from_millis(800),
        backoff: Duration::from_millis(20),
        ..AgentConfig::default()
    }
}

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
        self.agent_with(ACME_AGENT).await
    }

    /// An agent that calls with `api_key`, on the world's one journal file,
    /// its operations kept under a mark of the key.
    async fn agent_with(&self, api_key: &str) -> Agent {
        Agent::open(&self.journal.path().join("journal.db"), api_key, agent_config())
            .await
            .unwrap()
    }

    /// An agent of the named `account`, calling with `api_key`, on the world's journal file.
    async fn agent_of(&self, account: &str, api_key: &str) -> Agent {
        let journal = agent::Journal::open(&self.journal.path().join("journal.db"), Account::named(account))
            .await
            .unwrap();
        Agent::new(journal, api_key, agent_config()).unwrap()
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

async fn a_name_refused_with_400_before_anything_was_claimed_runs_again_with_a_fixed_body(backend: Backend) {
    let world = world(backend).await;
    let agent = world.agent().await;
    let blank_title = Request::post(&world.proxy.url, "/v1/tickets", json!({"project": "ops", "title": ""}));

    let refused = agent.execute("rotate-cert", &blank_title).await.unwrap();
    let fixed = agent
        .execute("rotate-cert", &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();
    let changed_again = agent
        .execute("rotate-cert", &world.ticket("Rotate production certificate"))
        .await;

    assert_eq!(refused.outcome, Outcome::Failed, "{}", refused.note);
    assert_eq!((refused.status, refused.operation_id.as_deref()), (Some(400), None));
    assert_eq!(fixed.outcome, Outcome::Created, "{}", fixed.note);
    assert_eq!(
        fixed.idempotency_key, refused.idempotency_key,
        "the fixed body goes under the key the service never claimed"
    );
    assert!(
        matches!(changed_again, Err(AgentError::ChangedPayload { .. })),
        "once the service has an operation, the name keeps its payload: {changed_again:?}"
    );
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

async fn agents_of_two_accounts_on_one_journal_each_send_their_own_operation_under_one_name(backend: Backend) {
    let world = world(backend).await;
    let acme = world.agent_of("acme", ACME_AGENT).await;
    let globex = world.agent_of("globex", GLOBEX_AGENT).await;

    let for_acme = acme
        .execute("rotate-cert", &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();
    let for_globex = globex
        .execute("rotate-cert", &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();

    assert_eq!(for_acme.outcome, Outcome::Created, "{}", for_acme.note);
    assert_eq!(for_globex.outcome, Outcome::Created, "{}", for_globex.note);
    assert_eq!(for_globex.sends, 1, "globex's operation was sent, not taken for acme's");
    assert_ne!(for_globex.idempotency_key, for_acme.idempotency_key);
    assert_ne!(for_globex.operation_id, for_acme.operation_id);
    assert_eq!(world.tickets().await, 2, "one ticket for each account");
}

/// An agent whose key was rotated, its account never named, finds its
/// operation under the old key's mark: it is refused, with nothing sent,
/// rather than sent again under a new key — which would do it twice. Named,
/// the account finds its own.
async fn an_operation_begun_under_a_rotated_key_is_refused_rather_than_sent_under_a_new_one(backend: Backend) {
    let world = world(backend).await;
    let rotate = world.ticket("Rotate staging certificate");
    let before = world.agent_with(ACME_AGENT).await;
    let first = before.execute("rotate-cert", &rotate).await.unwrap();
    let rotated_key = platform::testing::new_bearer(
        &tickets::App::new(world.db.db.clone(), Default::default(), true).auth,
        "acme",
        "acme-agent-2",
        platform::Role::Agent,
    )
    .await;

    let after = world.agent_with(&rotated_key).await;
    let refused = after.execute("rotate-cert", &rotate).await;
    let sends_after_refusal = world.sends_through_the_proxy();

    assert_eq!(first.outcome, Outcome::Created, "{}", first.note);
    assert!(
        matches!(refused, Err(AgentError::KnownUnderAnotherAccount { .. })),
        "{refused:?}"
    );
    assert_eq!(sends_after_refusal, 1, "nothing sent under a new key");
    assert_eq!(world.tickets().await, 1);
}

async fn a_key_handed_to_two_accounts_is_each_ones_own_operation(backend: Backend) {
    let world = world(backend).await;
    let acme = world.agent_with(ACME_AGENT).await;
    let globex = world.agent_with(GLOBEX_AGENT).await;
    // a workflow engine hands the same key to both accounts' agents
    let key = uuid::Uuid::new_v4().to_string();
    let acme_ticket = world.ticket("Rotate staging certificate");
    let globex_ticket = world.ticket("Renew the wildcard certificate");

    acme.journal().adopt("imported", &key, &acme_ticket).await.unwrap();
    globex
        .journal()
        .adopt("handed over", &key, &globex_ticket)
        .await
        .unwrap();
    let for_acme = acme.execute("imported", &acme_ticket).await.unwrap();
    let for_globex = globex.execute("handed over", &globex_ticket).await.unwrap();

    assert_eq!(for_acme.outcome, Outcome::Created, "{}", for_acme.note);
    assert_eq!(for_globex.outcome, Outcome::Created, "{}", for_globex.note);
    assert_eq!(
        (&*for_acme.idempotency_key, &*for_globex.idempotency_key),
        (&*key, &*key)
    );
    let acme_by_key = acme.journal().entry_by_key(&key).await.unwrap().unwrap();
    let globex_by_key = globex.journal().entry_by_key(&key).await.unwrap().unwrap();
    assert_eq!(acme_by_key.name, "imported");
    assert_eq!(globex_by_key.name, "handed over");
    assert!(
        acme.journal().entry("handed over").await.unwrap().is_none(),
        "globex's names are not acme's"
    );
    assert_eq!(world.tickets().await, 2);
}

async fn a_key_handed_over_that_names_another_operation_of_the_account_is_refused(backend: Backend) {
    let world = world(backend).await;
    let agent = world.agent().await;
    let key = uuid::Uuid::new_v4().to_string();
    agent
        .journal()
        .adopt("imported", &key, &world.ticket("Rotate staging certificate"))
        .await
        .unwrap();

    let again = agent
        .journal()
        .adopt("imported again", &key, &world.ticket("Rotate production certificate"))
        .await;

    assert!(
        matches!(again, Err(AgentError::KeyOfAnotherOperation { .. })),
        "{again:?}"
    );
    assert!(agent.journal().entry("imported again").await.unwrap().is_none());
    assert_eq!(world.sends_through_the_proxy(), 0, "nothing was sent");
}

async fn a_journal_made_before_accounts_keeps_every_operations_key(backend: Backend) {
    let world = world(backend).await;
    let path = world.journal.path().join("journal.db");
    let rotate = world.ticket("Rotate staging certificate");
    let ship = world.ticket("Ship it");
    let [stored, acme_intent, globex_intent] = [(); 3].map(|()| uuid::Uuid::new_v4().to_string());
    // the file as the agent and the MCP server left it before the journal kept accounts
    let old = sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true),
    )
    .await
    .unwrap();
    sqlx::migrate!("../../migrations/agent/sqlite")
        .run_to(6, &old)
        .await
        .unwrap();
    for (name, key, request) in [
        ("rotate-cert", &stored, &rotate),
        ("intent:account acme:ship it", &acme_intent, &ship),
        ("intent:account globex:ship it", &globex_intent, &ship),
    ] {
        sqlx::query(
            "INSERT INTO agent_operations (name, idempotency_key, payload_digest, method, target, state, \
             created_at, updated_at) VALUES ($1, $2, $3, 'POST', $4, 'pending', '2020-01-01T00:00:00Z', \
             '2020-01-01T00:00:00Z')",
        )
        .bind(name)
        .bind(key)
        .bind(payload_digest(request))
        .bind(request.target())
        .execute(&old)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO agent_attempts (name, at, action, status, note) \
         VALUES ('rotate-cert', '2020-01-01T00:00:00Z', 'send', NULL, 'no answer in time')",
    )
    .execute(&old)
    .await
    .unwrap();
    old.close().await;

    // another account's operation of that name, for another request, does not take it
    let other = world.agent_of("initech", GLOBEX_AGENT).await;
    let others = other
        .journal()
        .begin("rotate-cert", &world.ticket("Renew another certificate"))
        .await
        .unwrap();
    // the upgraded agent retries the operation it sent before
    let acme = world.agent().await;
    let retried = acme.execute("rotate-cert", &rotate).await.unwrap();
    let attempts = acme.journal().attempts(Some("rotate-cert")).await.unwrap();
    let globex = world.agent_with(GLOBEX_AGENT).await;
    let intent_key = |account: &str| {
        let journal = acme.journal().for_account(Account::named(account));
        async move {
            journal
                .entry("intent:ship it")
                .await
                .unwrap()
                .map(|e| e.idempotency_key)
        }
    };

    assert_eq!(retried.outcome, Outcome::Created, "{}", retried.note);
    assert_eq!(
        retried.idempotency_key, stored,
        "the retry sent the key stored before the upgrade"
    );
    assert_ne!(others.idempotency_key, stored, "another request never takes it");
    assert_eq!(attempts[0].note, "no answer in time", "its attempts came along");
    assert!(
        globex.journal().entry("rotate-cert").await.unwrap().is_none(),
        "the account that named it first took it"
    );
    assert_eq!(
        intent_key("acme").await,
        Some(acme_intent),
        "the MCP server's intents, each under its account"
    );
    assert_eq!(intent_key("globex").await, Some(globex_intent));
    assert_eq!(world.tickets().await, 1);
}

/// An operation id asked about is data: one path segment at the service,
/// never another of its routes read with the agent's key.
async fn an_operation_id_asked_about_is_one_path_segment_never_another_route(backend: Backend) {
    let world = world(backend).await;
    let agent = world.agent().await;
    let made = agent
        .execute("make-one", &world.ticket("Something to list"))
        .await
        .unwrap();

    let climbing = agent.status(&world.service, "../tickets").await.unwrap();
    let one_up = agent.status(&world.service, "..").await;

    assert_eq!(made.outcome, Outcome::Created, "{}", made.note);
    assert_eq!(climbing["code"], "not_found", "not the tickets list: {climbing}");
    assert!(matches!(one_up, Err(AgentError::Status(_))), "{one_up:?}");
}

platform::both_backends!(
    a_name_refused_with_400_before_anything_was_claimed_runs_again_with_a_fixed_body,
    the_key_is_stored_before_the_first_send_and_a_restarted_agent_sends_the_same_key,
    a_restarted_agent_finishes_the_operation_under_the_key_it_stored,
    a_dropped_answer_is_asked_about_and_the_retry_with_the_same_key_replays_it,
    the_same_name_with_another_payload_is_refused_before_anything_is_sent,
    a_known_success_is_never_sent_again,
    a_reused_key_is_a_conflict_and_the_agent_stops,
    a_known_business_failure_is_not_retried,
    an_approval_request_is_reported_and_the_run_after_the_decision_creates,
    agents_of_two_accounts_on_one_journal_each_send_their_own_operation_under_one_name,
    a_key_handed_to_two_accounts_is_each_ones_own_operation,
    a_key_handed_over_that_names_another_operation_of_the_account_is_refused,
    a_journal_made_before_accounts_keeps_every_operations_key,
    an_operation_id_asked_about_is_one_path_segment_never_another_route,
    an_operation_begun_under_a_rotated_key_is_refused_rather_than_sent_under_a_new_one,
);

//! Real processes, really killed (docs/contract.md §5): a tickets process dies
//! with SIGKILL between the claim and the commit, a new one starts on the same
//! database, and a retry runs the operation exactly once — after the lease for
//! leased claims, at once for claims made in the effect's transaction. The
//! stored answer survives the process.
//!
//! The binary is built with the `failpoints` feature for tests, and a fail
//! point (`FAILPOINTS=idempotency::after_claim=return`) holds the request, or
//! the journal's chain round, at the chosen spot until the test kills the
//! process.

use std::time::Duration;

use axum::http::{Method, StatusCode};
use journal::AuditEvent;
use platform::{
    Backend, on_pool,
    testing::{ACME_AGENT, ServiceProcess, TestDb, TestResponse, json_request},
};

const LEASE_SECONDS: &str = "2";
const BODY: &str = r#"{"project":"ops","title":"Rotate staging certificate","priority":"high"}"#;

/// A running `tickets` process.
struct Service(ServiceProcess);

impl Service {
    /// `claim`: `transaction` or `leased` (`RETRYSAFE_CLAIM`).
    async fn start(database_url: &str, claim: &str, fail_point: Option<&str>) -> Service {
        let fail_point = fail_point.map(|point| format!("{point}=return"));
        let mut env = vec![
            ("TICKETS_DATABASE_URL", database_url),
            ("RETRYSAFE_LEASE_SECONDS", LEASE_SECONDS),
            ("RETRYSAFE_CLAIM", claim),
        ];
        env.extend(fail_point.as_deref().map(|point| ("FAILPOINTS", point)));
        Service(ServiceProcess::start(env!("CARGO_BIN_EXE_tickets"), "tickets", &env).await)
    }

    async fn kill(self) {
        self.0.kill().await
    }

    async fn create(&self, key: &str) -> TestResponse {
        self.0.client().post("/v1/tickets", ACME_AGENT, Some(key), BODY).await
    }
}

async fn ticket_count(db: &TestDb) -> i64 {
    on_pool!(db.db.read(), |pool| sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM tickets"
    )
    .fetch_one(pool)
    .await
    .unwrap())
}

/// Starts a process that holds its first request at `fail_point`, kills it
/// with SIGKILL while the agent waits, and starts another on the same database.
async fn kill_while_held(db: &TestDb, claim: &str, fail_point: &str) -> Service {
    let mut doomed = Service::start(&db.url, claim, Some(fail_point)).await;
    let lost = tokio::spawn({
        let client = doomed.0.client();
        async move {
            let create = json_request(Method::POST, "/v1/tickets", ACME_AGENT, Some("crash-key"), BODY);
            client.try_send(create).await
        }
    });
    doomed.0.wait_for("fail point reached").await;
    doomed.kill().await;
    assert!(lost.await.unwrap().is_err(), "the agent never got an answer");
    Service::start(&db.url, claim, None).await
}

/// A third process answers the retry with the stored answer, byte for byte.
async fn assert_replayed_by_a_new_process(db: &TestDb, claim: &str, created_body: &[u8]) {
    let third = Service::start(&db.url, claim, None).await;
    let replay = third.create("crash-key").await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.replayed(), Some("true"));
    assert_eq!(
        replay.body, created_body,
        "the stored answer survived the process, byte for byte"
    );
    assert_eq!(ticket_count(db).await, 1);
    third.kill().await;
}

/// Leased claims: 409 while the dead holder's lease lasts, then one execution
/// by the retry that takes the lease over, under the same operation id.
async fn leased_crash_at(backend: Backend, fail_point: &str) {
    let db = TestDb::new(backend).await;
    let restarted = kill_while_held(&db, "leased", fail_point).await;

    let early = restarted.create("crash-key").await;
    assert_eq!(
        early.status,
        StatusCode::CONFLICT,
        "the dead process still holds the lease"
    );
    let retry_after: u64 = early.header("retry-after").unwrap().parse().unwrap();
    let early_operation = early.operation_id().to_owned();
    assert_eq!(early.code(), "request_in_progress");
    assert_eq!(
        ticket_count(&db).await,
        0,
        "nothing of the killed attempt was committed"
    );

    let mut answer = None;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(retry_after)).await;
        let response = restarted.create("crash-key").await;
        if response.status != StatusCode::CONFLICT {
            answer = Some(response);
            break;
        }
    }
    let created = answer.expect("the lease ran out and a retry ran the operation");
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(created.replayed(), Some("false"));
    assert_eq!(created.operation_id(), early_operation, "one operation, one id");
    let created_body = created.body;
    assert_eq!(ticket_count(&db).await, 1, "exactly one ticket");
    restarted.kill().await;

    assert_replayed_by_a_new_process(&db, "leased", &created_body).await;
}

async fn a_leased_claim_killed_after_it_committed_is_run_once_by_a_retry_after_the_lease(backend: Backend) {
    leased_crash_at(backend, "idempotency::after_claim").await;
}

async fn a_leased_claim_killed_with_its_effect_uncommitted_is_run_once_by_a_retry_after_the_lease(backend: Backend) {
    leased_crash_at(backend, "idempotency::before_commit").await;
}

/// One-transaction claims: the killed transaction took its claim with it, so
/// the first retry after the restart runs the operation, once.
async fn a_transaction_killed_before_its_commit_leaves_nothing_and_the_retry_runs_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let restarted = kill_while_held(&db, "transaction", "idempotency::before_commit").await;
    assert_eq!(
        ticket_count(&db).await,
        0,
        "nothing of the killed attempt was committed"
    );

    let created = restarted.create("crash-key").await;
    let again = restarted.create("crash-key").await;

    assert_eq!(
        created.status,
        StatusCode::CREATED,
        "no lease to wait for: the claim died with its transaction"
    );
    assert_eq!(created.replayed(), Some("false"));
    assert_eq!(again.replayed(), Some("true"));
    let created_body = created.body;
    assert_eq!(ticket_count(&db).await, 1, "exactly one ticket");
    restarted.kill().await;

    assert_replayed_by_a_new_process(&db, "transaction", &created_body).await;
}

async fn a_stored_answer_is_replayed_by_a_restarted_process(backend: Backend) {
    let db = TestDb::new(backend).await;
    let first_process = Service::start(&db.url, "transaction", None).await;
    let created = first_process.create("restart-key").await;
    assert_eq!(created.status, StatusCode::CREATED);
    let body = created.body;
    first_process.kill().await;

    let second_process = Service::start(&db.url, "transaction", None).await;
    let replay = second_process.create("restart-key").await;

    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.replayed(), Some("true"));
    assert_eq!(replay.body, body);
    assert_eq!(ticket_count(&db).await, 1);
    second_process.kill().await;
}

/// The service logs its journal's head when it starts and, once the last
/// events are linked, when it stops: a pin for `audit verify --pin`, kept
/// outside the database that holds the journal.
async fn the_journal_head_is_logged_at_start_up_and_after_the_last_entries_on_shutdown(backend: Backend) {
    let db = TestDb::new(backend).await;
    let mut service = Service::start(&db.url, "transaction", None).await;
    let at_start = service.0.logged("audit journal head at start-up").await;
    let created = service.create("key-1").await.status;
    // the create's entries may still wait to be linked: the shutdown links them
    service.0.terminate();
    let on_shutdown = service.0.wait_for("audit journal head on shutdown").await;
    let exit = service.0.exited().await;

    let head = journal::head(&db.db).await.unwrap();
    let genesis = format!("0:{}", journal::GENESIS);
    assert_eq!(created, StatusCode::CREATED);
    assert!(at_start["message"].as_str().unwrap().ends_with(&genesis), "{at_start}");
    assert_eq!(head.seq, 1, "the create's entry is linked: {head}");
    assert!(
        on_shutdown["message"].as_str().unwrap().ends_with(&head.to_string()),
        "{on_shutdown} is not the final head {head}"
    );
    assert_eq!(exit, Some(0));
}

/// A process killed in the middle of a chain round (its entries inserted
/// into the journal, its inbox records taken, nothing committed) leaves the
/// journal and the inbox as they were: the next process links every
/// committed transition exactly once, onto a chain that verifies.
async fn after_a_crash_in_the_middle_of_a_chain_round_the_journal_verifies_and_holds_every_committed_transition_exactly_once(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let keys: Vec<String> = (0..4).map(|n| format!("key-{n}")).collect();
    let mut doomed = Service::start(&db.url, "transaction", Some("audit::chain_round")).await;
    // the first create to commit gives the chainer a round, which holds
    // mid-way; the others commit before or wait behind it (SQLite's writer)
    for key in &keys {
        let client = doomed.0.client();
        let create = json_request(Method::POST, "/v1/tickets", ACME_AGENT, Some(key), BODY);
        tokio::spawn(async move { client.try_send(create).await });
    }
    doomed.0.wait_for("fail point reached").await;
    doomed.kill().await;

    let restarted = Service::start(&db.url, "transaction", None).await;
    // the agent retries every key it got no answer for, and one it did
    for key in &keys {
        assert_eq!(restarted.create(key).await.status, StatusCode::CREATED, "{key}");
    }
    restarted.0.terminate(); // links what waits, then exits
    assert_eq!(restarted.0.exited().await, Some(0));

    let entries = journal::all_entries(&db.db).await.unwrap();
    assert!(journal::verify(&entries, None).is_ok(), "the chain verifies");
    assert_eq!(ticket_count(&db).await, keys.len() as i64, "one ticket a key");
    for key in &keys {
        let completed = entries
            .iter()
            .filter(|e| e.idempotency_key.as_deref() == Some(key) && e.event == AuditEvent::Completed)
            .count();
        assert_eq!(completed, 1, "{key}: its create is journaled exactly once");
    }
}

platform::both_backends!(
    after_a_crash_in_the_middle_of_a_chain_round_the_journal_verifies_and_holds_every_committed_transition_exactly_once,
    the_journal_head_is_logged_at_start_up_and_after_the_last_entries_on_shutdown,
    a_leased_claim_killed_after_it_committed_is_run_once_by_a_retry_after_the_lease,
    a_leased_claim_killed_with_its_effect_uncommitted_is_run_once_by_a_retry_after_the_lease,
    a_transaction_killed_before_its_commit_leaves_nothing_and_the_retry_runs_once,
    a_stored_answer_is_replayed_by_a_restarted_process,
);

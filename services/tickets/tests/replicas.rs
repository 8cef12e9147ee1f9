//! Replicas (docs/design.md §11): three `tickets` processes on one
//! PostgreSQL database, started at the same instant against an empty one, and
//! a storm of one key spread over them; and a replica whose clock is an hour
//! off, which must still keep to another's lease. Nothing but the database is
//! between them. PostgreSQL only: it is the backend replicas share, and the
//! clock they share.

use axum::http::{Method, StatusCode};
use futures::future::join_all;
use platform::{
    Backend, on_pool,
    testing::{ACME_AGENT, ServiceProcess, TestDb, TestResponse, json_request},
};

const BODY: &str = r#"{"project":"ops","title":"Rotate staging certificate","priority":"high"}"#;

async fn start(database_url: &str) -> ServiceProcess {
    ServiceProcess::start(
        env!("CARGO_BIN_EXE_tickets"),
        "tickets",
        &[("TICKETS_DATABASE_URL", database_url)],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_start_together_on_an_empty_database_and_a_200_way_storm_of_one_key_makes_one_ticket() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = TestDb::new(Backend::Postgres).await;
    let replicas: Vec<ServiceProcess> = join_all((0..3).map(|_| start(&db.url))).await;

    let storm: Vec<TestResponse> = join_all((0..200).map(|i| {
        let client = replicas[i % 3].client();
        async move { client.post("/v1/tickets", ACME_AGENT, Some("storm-1"), BODY).await }
    }))
    .await;
    let tickets: i64 = on_pool!(db.db.read(), |pool| sqlx::query_scalar("SELECT COUNT(*) FROM tickets")
        .fetch_one(pool)
        .await
        .unwrap());
    let entries = journal::all_entries(&db.db).await.unwrap();

    assert!(
        storm.iter().all(|r| r.status == StatusCode::CREATED),
        "{:?}",
        storm.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(
        storm.iter().filter(|r| r.replayed() == Some("false")).count(),
        1,
        "one ran, every other replayed"
    );
    assert!(
        storm.iter().all(|r| r.body == storm[0].body),
        "the same bytes from every replica"
    );
    assert_eq!(tickets, 1);
    journal::verify(&entries, None).expect("the journal verifies");
    let completed = entries
        .iter()
        .filter(|e| e.event == journal::AuditEvent::Completed)
        .count();
    assert_eq!(completed, 1, "the create journaled once");
    for replica in replicas {
        replica.kill().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_whose_clock_is_an_hour_ahead_still_keeps_to_another_replica_s_lease() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = TestDb::new(Backend::Postgres).await;
    let leased = [
        ("TICKETS_DATABASE_URL", db.url.as_str()),
        ("RETRYSAFE_CLAIM", "leased"),
        ("RETRYSAFE_LEASE_SECONDS", "30"),
    ];
    // one replica claims the key and holds it, working, for as long as its lease lasts
    let holding = [leased.as_slice(), &[("FAILPOINTS", "idempotency::after_claim=return")]].concat();
    let mut holder = ServiceProcess::start(env!("CARGO_BIN_EXE_tickets"), "tickets", &holding).await;
    let client = holder.client();
    let held = tokio::spawn(async move {
        client
            .try_send(json_request(
                Method::POST,
                "/v1/tickets",
                ACME_AGENT,
                Some("key-1"),
                BODY,
            ))
            .await
    });
    holder.wait_for("fail point reached").await;
    // another replica's own clock is an hour ahead: by it, that lease ran out long ago
    let skewed = [leased.as_slice(), &[("FAILPOINTS_CLOCK_SKEW_SECONDS", "3600")]].concat();
    let other = ServiceProcess::start(env!("CARGO_BIN_EXE_tickets"), "tickets", &skewed).await;

    let retry = other
        .client()
        .post("/v1/tickets", ACME_AGENT, Some("key-1"), BODY)
        .await;
    let tickets: i64 = on_pool!(db.db.read(), |pool| sqlx::query_scalar("SELECT COUNT(*) FROM tickets")
        .fetch_one(pool)
        .await
        .unwrap());

    retry.assert_problem(409, "request_in_progress");
    let retry_after: u64 = retry.header("retry-after").unwrap().parse().unwrap();
    assert!(
        retry_after <= 30,
        "the lease ends by the database's clock, not in an hour: {retry_after}"
    );
    assert_eq!(tickets, 0, "the lease was kept: nothing ran twice");
    holder.kill().await;
    assert!(held.await.unwrap().is_err(), "the held request died with its replica");
    other.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_never_answers_from_memory_for_an_operation_the_reaper_removed() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = TestDb::new(Backend::Postgres).await;
    // finished operations kept 1.8 s, reaped every 0.3 s, by either replica
    let short = [
        ("TICKETS_DATABASE_URL", db.url.as_str()),
        ("RETRYSAFE_RETENTION_HOURS", "0.0005"),
        ("RETRYSAFE_REAP_EVERY_SECONDS", "0.3"),
    ];
    let replicas: Vec<ServiceProcess> =
        join_all((0..2).map(|_| ServiceProcess::start(env!("CARGO_BIN_EXE_tickets"), "tickets", &short))).await;
    let first = replicas[0]
        .client()
        .post("/v1/tickets", ACME_AGENT, Some("key-1"), BODY)
        .await;
    let replay = replicas[0]
        .client()
        .post("/v1/tickets", ACME_AGENT, Some("key-1"), BODY)
        .await;
    assert_eq!(
        replay.replayed(),
        Some("true"),
        "answered from the replica's memory, or the database"
    );
    let operations = || async {
        on_pool!(db.db.read(), |pool| sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM idempotency_operations WHERE idempotency_key = 'key-1'"
        )
        .fetch_one(pool)
        .await
        .unwrap())
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while operations().await > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("a reaper removes the finished operation after its retention");

    let after = replicas[0]
        .client()
        .post("/v1/tickets", ACME_AGENT, Some("key-1"), BODY)
        .await;

    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(after.status, StatusCode::CREATED);
    assert_eq!(
        after.replayed(),
        Some("false"),
        "the key is free again: a new operation, not a memory of the old"
    );
    assert_ne!(after.operation_id(), first.operation_id());
    for replica in replicas {
        replica.kill().await;
    }
}

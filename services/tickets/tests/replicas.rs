//! Replicas (docs/design.md §11): three `tickets` processes on one
//! PostgreSQL database, started at the same instant against an empty one, and
//! a storm of one key spread over them. Nothing but the database is between
//! them. PostgreSQL only: it is the backend replicas share.

use axum::http::StatusCode;
use futures::future::join_all;
use platform::{
    Backend, on_pool,
    testing::{ACME_AGENT, ServiceProcess, TestDb, TestResponse},
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
    let entries = idempotency::audit::all_entries(&db.db).await.unwrap();

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
    idempotency::audit::verify(&entries, None).expect("the journal verifies");
    let completed = entries
        .iter()
        .filter(|e| e.event == idempotency::audit::AuditEvent::Completed)
        .count();
    assert_eq!(completed, 1, "the create journaled once");
    for replica in replicas {
        replica.kill().await;
    }
}

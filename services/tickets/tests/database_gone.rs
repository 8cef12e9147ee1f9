//! The database goes away under a running service, as it does in a failover
//! (docs/contract.md §5): the service answers 503 with `Retry-After`, never a
//! 500 that reads "nothing was committed"; `/healthz` says so at once; what
//! the replica remembered from before is forgotten; and once the database is
//! back the service reconnects by itself and the same keys carry on.
//! PostgreSQL only: an embedded SQLite file cannot go away.

use std::{
    str::FromStr,
    time::{Duration, Instant},
};

use idempotency::IdempotencyConfig;
use platform::{
    Backend, Db, on_pool,
    testing::{ACME_AGENT, TcpForwarder, TestClient, TestDb, TestResponse},
};
use sqlx::postgres::PgConnectOptions;

const BODY: &str = r#"{"project":"ops","title":"Rotate staging certificate","priority":"high"}"#;

/// A fresh tickets database, and a service that reaches it through a
/// forwarder the test can cut.
async fn service_behind_a_forwarder(db: &TestDb) -> (TestClient, TcpForwarder) {
    tickets::migrate(&db.db).await.expect("migrations apply");
    let options = PgConnectOptions::from_str(&db.url).unwrap();
    let server = format!("{}:{}", options.get_host(), options.get_port());
    let upstream = tokio::net::lookup_host(&server).await.unwrap().next().unwrap();
    let forwarder = TcpForwarder::start(upstream).await;
    let url = db.url.replacen(&server, &forwarder.addr.to_string(), 1);
    let reached = Db::connect(&url, 8).await.expect("the database, through the forwarder");
    let app = tickets::App::new(reached, IdempotencyConfig::default(), true);
    (TestClient::new(tickets::build_router(app)), forwarder)
}

/// Asks `/healthz` until it answers `status`, for at most `within`: whether it did.
async fn health_turns(service: &TestClient, status: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if service.get("/healthz", ACME_AGENT).await.status == status {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Deletes the ticket and the operation `created` answered for, straight
/// from the database: the rows a failover to a standby that lacked them
/// takes away.
async fn take_rows_away(db: &TestDb, created: &TestResponse) {
    let (ticket_id, operation_id) = (created.str("id"), created.operation_id().to_owned());
    on_pool!(db.db.write(), |pool| {
        sqlx::query("DELETE FROM tickets WHERE id = $1")
            .bind(&ticket_id)
            .execute(pool)
            .await
            .unwrap();
        sqlx::query("DELETE FROM idempotency_operations WHERE operation_id = $1")
            .bind(&operation_id)
            .execute(pool)
            .await
            .unwrap();
    });
}

async fn ticket_count(db: &TestDb) -> i64 {
    on_pool!(db.db.read(), |pool| sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM tickets"
    )
    .fetch_one(pool)
    .await
    .unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_its_database_is_gone_a_service_answers_503_with_retry_after_and_the_same_key_works_once_it_is_back() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = TestDb::new(Backend::Postgres).await;
    let (service, database) = service_behind_a_forwarder(&db).await;
    let first = service.post("/v1/tickets", ACME_AGENT, Some("before"), BODY).await;
    assert_eq!(first.status, 201);
    assert_eq!(
        service.get("/healthz", ACME_AGENT).await.json()["database"],
        "reachable"
    );

    database.cut().await;
    assert!(
        health_turns(&service, 503, Duration::from_secs(2)).await,
        "/healthz hears at once"
    );
    assert_eq!(
        service.get("/healthz", ACME_AGENT).await.json()["database"],
        "unreachable"
    );
    // both wait out the pool's acquire timeout for the server to come back, side by side
    let (refused, retried) = tokio::join!(
        service.post("/v1/tickets", ACME_AGENT, Some("during"), BODY),
        service.post("/v1/tickets", ACME_AGENT, Some("before"), BODY),
    );
    refused.assert_problem(503, "database_unavailable");
    assert!(refused.header("retry-after").is_some(), "a 503 says when to come back");
    let detail = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        !detail.contains("nothing was committed"),
        "its outcome is not known here: {detail}"
    );
    assert!(detail.contains("same key"), "{detail}");
    // this replica saw the database go, so it forgot the answer it remembered:
    // the database decides the retry, and cannot be reached
    retried.assert_problem(503, "database_unavailable");
    assert!(retried.header("retry-after").is_some());

    database.restore().await;

    assert!(
        health_turns(&service, 200, Duration::from_secs(5)).await,
        "the service reconnects by itself"
    );
    let created = service.post("/v1/tickets", ACME_AGENT, Some("during"), BODY).await;
    assert_eq!(created.status, 201);
    assert_eq!(created.replayed(), Some("false"), "the 503 claimed nothing");
    let replayed = service.post("/v1/tickets", ACME_AGENT, Some("before"), BODY).await;
    assert_eq!(replayed.replayed(), Some("true"));
    assert_eq!(replayed.body, first.body, "the stored answer, byte for byte");
    assert_eq!(ticket_count(&db).await, 2);
}

/// `/healthz` needs no key, so anyone can send a flood of probes: they share
/// one probe's answer for half a second, and the flood opens a connection or
/// two instead of one each. The answer still follows the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_health_probes_opens_a_connection_or_two_and_healthz_still_follows_the_database_within_two_seconds()
{
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = TestDb::new(Backend::Postgres).await;
    let (service, database) = service_behind_a_forwarder(&db).await;
    let before = database.connections_accepted();
    let started = Instant::now();
    let probes = (0..100).map(|_| service.get("/healthz", ACME_AGENT));
    for health in futures::future::join_all(probes).await {
        assert_eq!(health.status, 200);
    }
    let opened = database.connections_accepted() - before;
    // one probe per half second at most, however long the flood took here
    let allowed = 1 + (started.elapsed().as_millis() / 500) as usize;
    assert!(opened <= allowed.max(2), "100 probes opened {opened} connections");

    database.cut().await;
    assert!(
        health_turns(&service, 503, Duration::from_secs(2)).await,
        "/healthz is 503 within two seconds of the database going"
    );
    database.restore().await;
    assert!(
        health_turns(&service, 200, Duration::from_secs(2)).await,
        "/healthz is 200 within two seconds of the database coming back"
    );
}

/// A replica that sees its database go away forgets every answer it
/// remembered (docs/design.md §4): a failover may have taken their rows
/// away, and a replay from memory would name a ticket the database does not
/// have. The retry is decided by the database, as with no cache, and the
/// operation status agrees with what it answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_a_replica_answers_no_retry_from_memory_and_the_database_decides_it() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = TestDb::new(Backend::Postgres).await;
    let (service, database) = service_behind_a_forwarder(&db).await;
    let first = service.post("/v1/tickets", ACME_AGENT, Some("remembered"), BODY).await;
    assert_eq!(first.status, 201);

    database.cut().await;
    assert!(health_turns(&service, 503, Duration::from_secs(2)).await);
    database.restore().await;
    assert!(health_turns(&service, 200, Duration::from_secs(2)).await);
    take_rows_away(&db, &first).await;
    let retry = service.post("/v1/tickets", ACME_AGENT, Some("remembered"), BODY).await;

    assert_eq!(retry.status, 201);
    assert_eq!(retry.replayed(), Some("false"), "not a replay of a ticket that is gone");
    assert_ne!(retry.operation_id(), first.operation_id());
    assert_ne!(retry.str("id"), first.str("id"));
    let by_key = service
        .get("/v1/operations?idempotency_key=remembered", ACME_AGENT)
        .await
        .json();
    let operations = by_key["data"].as_array().expect("a list of operations");
    assert_eq!(operations.len(), 1, "{by_key}");
    assert_eq!(operations[0]["operation_id"], retry.operation_id());
    assert_eq!(operations[0]["resource"]["id"], retry.str("id"));
    assert_eq!(ticket_count(&db).await, 1);
}

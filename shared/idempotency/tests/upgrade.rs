//! A PostgreSQL database made before every key began with the account
//! (docs/design.md §13) is upgraded in place: every row stays, ids go on
//! after the kept ones, and a key taken before is taken still. PostgreSQL
//! only: SQLite's tables did not change.

use idempotency::{Fingerprint, IdempotencyKey, store};
use platform::{Backend, Pool, Timestamp, testing::TestDb};
use sqlx::{PgPool, migrate::Migrator};

/// The first migration that partitions the tables.
const PARTITIONED_AT: i64 = 10;

const TABLES: [&str; 4] = [
    "idempotency_operations",
    "idempotency_approvals",
    "idempotency_outbox",
    "audit_inbox",
];

/// Every row of every table, each as its JSON, in a fixed order.
async fn rows(pool: &PgPool) -> Vec<(String, Vec<String>)> {
    let mut all = Vec::new();
    for table in TABLES {
        let sql = format!("SELECT to_jsonb(t)::text FROM {table} t ORDER BY 1");
        let rows = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_all(pool)
            .await
            .unwrap();
        all.push((table.to_owned(), rows));
    }
    all
}

/// Operations of three accounts, each with an approval, an outbox event and
/// journal records waiting in the inbox.
async fn fill(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO idempotency_operations (account_id, idempotency_key, operation_id, principal_id, method, route, \
         fingerprint, state, response_status, response_body, created_at, updated_at) \
         SELECT 'acct_' || (i % 3), 'key-' || i, 'op-' || i, 'agent', 'POST', '/v1/things', repeat('a', 64), \
                'awaiting_approval', 202, '\\x7b7d', now(), now() \
         FROM generate_series(1, 30) AS i",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO idempotency_approvals (approval_id, account_id, operation_id, idempotency_key, route, \
         fingerprint, summary, requested_by, created_at, expires_at) \
         SELECT 'apr-' || i, 'acct_' || (i % 3), 'op-' || i, 'key-' || i, '/v1/things', repeat('a', 64), '{}', \
                'agent', now(), now() + interval '1 hour' \
         FROM generate_series(1, 30, 2) AS i",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO idempotency_outbox (event_id, account_id, operation_id, idempotency_key, fingerprint, route, \
         kind, payload, external_key, state, next_attempt_at, created_at, updated_at) \
         SELECT 'evt-' || i, 'acct_' || (i % 3), 'op-' || i, 'key-' || i, repeat('a', 64), '/v1/things', \
                'rollout', '{}', 'ext-' || i, 'pending', now(), now(), now() \
         FROM generate_series(2, 30, 2) AS i",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO audit_inbox (account_id, principal_id, operation_id, event, at) \
         SELECT 'acct_' || (i % 3), 'agent', 'op-' || i, 'claimed', now() FROM generate_series(1, 30) AS i",
    )
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_made_before_the_partitions_keeps_every_row_and_every_taken_key() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = TestDb::new(Backend::Postgres).await;
    let Pool::Postgres(pool) = db.db.write() else {
        unreachable!("a PostgreSQL test database")
    };
    let before = Migrator::with_migrations(
        [&platform::MIGRATIONS, &idempotency::MIGRATIONS]
            .iter()
            .flat_map(|set| set.postgres.iter())
            .filter(|m| m.version < PARTITIONED_AT)
            .cloned()
            .collect(),
    );
    before.run(pool).await.unwrap();
    fill(pool).await;
    let kept = rows(pool).await;

    db.db
        .migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS])
        .await
        .unwrap();

    assert_eq!(rows(pool).await, kept, "every row, as it was");
    let key = IdempotencyKey::parse("key-3").unwrap();
    let fingerprint = Fingerprint::from_stored("a".repeat(64));
    let claim = |key| store::NewOperation {
        account_id: "acct_0",
        key,
        operation_id: idempotency::operation::new_operation_id(),
        principal_id: "agent",
        method: "POST",
        route: "/v1/things",
        fingerprint: &fingerprint,
        lease_token: "token".into(),
        locked_until: Timestamp::now(),
        now: Timestamp::now(),
    };
    let mut tx = db.db.begin().await.unwrap();
    let again = store::claim(&mut tx, &claim(&key)).await.unwrap();
    tx.rollback().await.unwrap();
    let fresh = IdempotencyKey::parse("key-new").unwrap();
    let mut tx = db.db.begin().await.unwrap();
    let new = store::claim(&mut tx, &claim(&fresh)).await.unwrap();
    tx.commit().await.unwrap();
    assert!(again.is_none(), "a key taken before the upgrade is taken still");
    assert!(new.is_some(), "a free key is claimed");

    let (event_seq, inbox_id): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT seq FROM idempotency_outbox WHERE true ORDER BY seq DESC LIMIT 1), \
                (SELECT MAX(id) FROM audit_inbox)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let next: (i64, i64) = sqlx::query_as(
        "WITH event AS (INSERT INTO idempotency_outbox (event_id, account_id, operation_id, idempotency_key, \
             fingerprint, route, kind, payload, external_key, state, next_attempt_at, created_at, updated_at) \
             VALUES ('evt-new', 'acct_1', 'op-1', 'key-1', 'f', '/v1/things', 'rollout', '{}', 'ext-new', \
                     'pending', now(), now(), now()) RETURNING seq), \
         record AS (INSERT INTO audit_inbox (account_id, principal_id, event, at) \
             VALUES ('acct_1', 'agent', 'claimed', now()) RETURNING id) \
         SELECT (SELECT seq FROM event), (SELECT id FROM record)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(
        next.0 > event_seq,
        "new events come after the kept ones: {next:?} after {event_seq}"
    );
    assert!(
        next.1 > inbox_id,
        "new records come after the kept ones: {next:?} after {inbox_id}"
    );
}

//! One schema on both backends (docs/design.md §9): the dialects differ in
//! statement text only, never in the tables and columns the code relies on
//! or the rows the database refuses.

use platform::{Backend, Migrations, Timestamp, testing::TestDb};

/// Every table the platform's and the idempotency layer's migrations make,
/// each with its columns in order.
async fn tables_and_columns(backend: Backend) -> Vec<(String, Vec<String>)> {
    let db = TestDb::new(backend).await;
    db.db
        .migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS])
        .await
        .unwrap();
    let (tables_sql, columns_sql) = match backend {
        Backend::Postgres => (
            // a partition is where a table keeps some of its rows, not a table the code names
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_name <> '_sqlx_migrations' \
               AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.relname = table_name AND c.relispartition) \
             ORDER BY 1",
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
        ),
        Backend::Sqlite => (
            "SELECT name FROM sqlite_schema WHERE type = 'table' \
             AND name NOT IN ('_sqlx_migrations', 'sqlite_sequence') ORDER BY 1",
            "SELECT name FROM pragma_table_info($1) ORDER BY cid",
        ),
    };
    let tables: Vec<String> = platform::on_pool!(db.db.read(), |pool| sqlx::query_scalar(tables_sql)
        .fetch_all(pool)
        .await
        .unwrap());
    let mut schema = Vec::new();
    for table in tables {
        let columns = platform::on_pool!(db.db.read(), |pool| sqlx::query_scalar(columns_sql)
            .bind(&table)
            .fetch_all(pool)
            .await
            .unwrap());
        schema.push((table, columns));
    }
    schema
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_backends_have_the_same_tables_with_the_same_columns_in_the_same_order() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let sqlite = tables_and_columns(Backend::Sqlite).await;
    let postgres = tables_and_columns(Backend::Postgres).await;

    let names: Vec<&str> = sqlite.iter().map(|(table, _)| table.as_str()).collect();
    assert!(
        names.contains(&"idempotency_operations") && names.contains(&"audit_inbox"),
        "{names:?}"
    );
    assert_eq!(sqlite, postgres);
}

/// Writes one operation in `state`, with or without a stored answer, in a
/// transaction of its own. `Err`: the database refused it.
async fn write_operation(db: &TestDb, key: &str, state: &str, answered: bool) -> Result<(), sqlx::Error> {
    const SQL: &str = "INSERT INTO idempotency_operations \
         (account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state, \
          response_status, response_body, created_at, updated_at) \
         VALUES ('acme', $1, $1, 'acme-agent', 'POST', '/v1/things', $2, $3, $4, $5, $6, $6)";
    let mut tx = db.db.begin().await?;
    let tx_ref = &mut tx;
    let written = platform::on_tx!(tx_ref, |conn| sqlx::query(SQL)
        .bind(key)
        .bind("a".repeat(64))
        .bind(state)
        .bind(answered.then_some(201_i32))
        .bind(answered.then(|| b"{}".to_vec()))
        .bind(Timestamp::now())
        .execute(conn)
        .await
        .map(drop));
    match written {
        Ok(()) => tx.commit().await,
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

fn is_check_violation(refused: Result<(), sqlx::Error>) -> bool {
    matches!(refused, Err(sqlx::Error::Database(e)) if e.kind() == sqlx::error::ErrorKind::CheckViolation)
}

/// The database holds an operation to the states the layer knows, and a
/// finished one to its stored answer; the SQLite schema spells these checks
/// as comparisons and PostgreSQL's as `IN` (docs/design.md §9), and both
/// refuse the same rows.
async fn an_unknown_state_and_a_finished_operation_without_its_answer_are_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.db
        .migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS])
        .await
        .unwrap();

    for state in [
        "in_progress",
        "awaiting_approval",
        "completed",
        "failed",
        "unknown",
        "rejected",
    ] {
        write_operation(&db, &format!("answered-{state}"), state, true)
            .await
            .unwrap_or_else(|e| panic!("{state} with its answer was refused: {e}"));
    }
    for state in ["awaiting_approval", "unknown"] {
        write_operation(&db, &format!("unanswered-{state}"), state, false)
            .await
            .unwrap_or_else(|e| panic!("{state} without an answer was refused: {e}"));
    }
    for state in ["completed", "failed", "rejected"] {
        let refused = write_operation(&db, &format!("finished-{state}"), state, false).await;
        assert!(
            is_check_violation(refused),
            "{state} without its answer was not refused"
        );
    }
    for state in ["done", "Completed", ""] {
        let refused = write_operation(&db, &format!("unknown-{state}"), state, true).await;
        assert!(is_check_violation(refused), "the state `{state}` was not refused");
    }
}

platform::both_backends!(an_unknown_state_and_a_finished_operation_without_its_answer_are_refused);

/// The tables of every crate and service, each service's own as its folder
/// of migrations has them: one database holds them all, as none overlap.
static SERVICES: [Migrations; 3] = [
    Migrations {
        postgres: sqlx::migrate!("../../migrations/tickets/postgres"),
        sqlite: sqlx::migrate!("../../migrations/tickets/sqlite"),
    },
    Migrations {
        postgres: sqlx::migrate!("../../migrations/payments/postgres"),
        sqlite: sqlx::migrate!("../../migrations/payments/sqlite"),
    },
    Migrations {
        postgres: sqlx::migrate!("../../migrations/deployments/postgres"),
        sqlite: sqlx::migrate!("../../migrations/deployments/sqlite"),
    },
];

/// The high-volume tables, hash-partitioned by account on PostgreSQL.
const PARTITIONED: [&str; 3] = ["audit_inbox", "idempotency_operations", "idempotency_outbox"];

/// The keys that do not name the account at all (docs/design.md §13): an
/// API key is looked up before any account is known, and the journal's `seq`
/// is one chain across every account.
const KEYS_ACROSS_ACCOUNTS: [&str; 2] = ["api_keys_pkey", "audit_journal_pkey"];

/// The keys that name the account second, after the order a walk across
/// accounts reads: the retention reaper's by operation id, the chainer's by
/// the inbox's id. Leading with the account, each would need a second index.
const KEYS_LED_BY_A_WALK: [&str; 2] = ["audit_inbox_pkey", "idempotency_operations_operation_id_key"];

// PostgreSQL only: the partitions and keys are the shape a distributed
// PostgreSQL shards; a SQLite file is never sharded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_names_the_account_and_the_high_volume_tables_are_hash_partitioned_by_it() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = TestDb::new(Backend::Postgres).await;
    let [tickets, payments, deployments] = &SERVICES;
    db.db
        .migrate(&[
            &platform::MIGRATIONS,
            &idempotency::MIGRATIONS,
            tickets,
            payments,
            deployments,
        ])
        .await
        .unwrap();
    let platform::Pool::Postgres(pool) = db.db.read() else {
        unreachable!("a PostgreSQL test database")
    };

    let partitioned: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT c.relname::text, p.partstrat::text, a.attname::text, \
                (SELECT COUNT(*) FROM pg_inherits i WHERE i.inhparent = c.oid) \
         FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid \
         JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = p.partattrs[0] \
         WHERE c.relnamespace = current_schema()::regnamespace AND p.partnatts = 1 ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let expected: Vec<(String, String, String, i64)> = PARTITIONED
        .iter()
        .map(|table| (table.to_string(), "h".into(), "account_id".into(), 8))
        .collect();
    assert_eq!(partitioned, expected, "(table, strategy, column, partitions)");

    // (table, key, its first column, whether any of its columns is the account)
    let keys: Vec<(String, String, String, bool)> = sqlx::query_as(
        "SELECT t.relname::text, i.relname::text, a.attname::text, \
                EXISTS (SELECT 1 FROM pg_attribute c WHERE c.attrelid = t.oid \
                          AND c.attnum = ANY (x.indkey::int2[]) AND c.attname = 'account_id') \
         FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid \
         JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[0] \
         WHERE x.indisunique AND t.relnamespace = current_schema()::regnamespace \
           AND NOT t.relispartition AND t.relname <> '_sqlx_migrations' ORDER BY 1, 2",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let tables: std::collections::BTreeSet<&str> = keys.iter().map(|(table, ..)| table.as_str()).collect();
    assert!(
        tables.len() >= 14 && tables.contains("ticket_comments") && tables.contains("deployment_history"),
        "every project table is looked at: {tables:?}"
    );
    let across: Vec<&str> = keys
        .iter()
        .filter(|(.., names_the_account)| !names_the_account)
        .map(|(_, key, ..)| key.as_str())
        .collect();
    assert_eq!(across, KEYS_ACROSS_ACCOUNTS, "keys that do not name account_id");
    let led_by_a_walk: Vec<&str> = keys
        .iter()
        .filter(|(_, _, first, names_the_account)| *names_the_account && first != "account_id")
        .map(|(_, key, ..)| key.as_str())
        .collect();
    assert_eq!(
        led_by_a_walk, KEYS_LED_BY_A_WALK,
        "keys that name account_id after another column"
    );
}

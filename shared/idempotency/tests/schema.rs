//! One schema on both backends (docs/design.md §9): the dialects differ in
//! statement text only, never in the tables and columns the code relies on.

use platform::{Backend, testing::TestDb};

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
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_name <> '_sqlx_migrations' ORDER BY 1",
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

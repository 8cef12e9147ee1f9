//! The benchmark's databases: fresh ones for each measurement, and the
//! large seeded one kept between runs.

use std::path::Path;

use platform::{Backend, Db, Pool, Timestamp, on_pool};
use sqlx::migrate::Migrator;

/// Opens a fresh database `name` for `backend` (dropped and made anew).
/// A new, empty tickets database.
pub async fn fresh_db(backend: Backend, name: &str) -> Db {
    let db = empty_db(backend, name).await;
    tickets::migrate(&db).await.expect("migrations apply");
    db
}

/// A new tickets database migrated only up to, not including, migration
/// `version`: an earlier schema, for today's code to be measured on.
pub async fn fresh_db_before(backend: Backend, name: &str, version: i64) -> Db {
    let db = empty_db(backend, name).await;
    let sets = [&platform::MIGRATIONS, &idempotency::MIGRATIONS, &tickets::MIGRATIONS];
    let migrations = sets
        .iter()
        .flat_map(|set| match backend {
            Backend::Postgres => set.postgres.iter(),
            Backend::Sqlite => set.sqlite.iter(),
        })
        .filter(|migration| migration.version < version)
        .cloned()
        .collect();
    let migrator = Migrator::with_migrations(migrations);
    match db.write() {
        Pool::Postgres(pool) => migrator.run(pool).await,
        Pool::Sqlite(pool) => migrator.run(pool).await,
    }
    .expect("the earlier migrations apply");
    db
}

/// A new database with no tables yet, for any service's migrations.
pub async fn empty_db(backend: Backend, name: &str) -> Db {
    Db::connect(&database_url(backend, name, true).await, 16)
        .await
        .expect("a benchmark database")
}

/// Has PostgreSQL analyze `db`'s tables, as its autovacuum does within about
/// a minute of a new table's first rows. Until then a lookup by
/// `(account_id, id)` can be planned on another key that begins with
/// `account_id`, and that plan, kept by each connection, scans the whole
/// account (docs/design.md §13); a run here is shorter than that minute.
pub async fn analyze(db: &Db) {
    if let Db::Postgres(_) = db {
        on_pool!(db.write(), |pool| {
            sqlx::query("ANALYZE").execute(pool).await.expect("ANALYZE");
        });
    }
}

pub async fn database_url(backend: Backend, name: &str, fresh: bool) -> String {
    match backend {
        Backend::Sqlite => {
            let dir = Path::new("target/bench-data");
            std::fs::create_dir_all(dir).unwrap();
            let file = dir.join(format!("{name}.db"));
            if fresh {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
                }
            }
            format!("sqlite://{}", file.display())
        }
        Backend::Postgres => {
            let admin = platform::testing::postgres_admin_url();
            let database = format!("rsbench_{name}");
            if fresh {
                let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
                    .await
                    .expect("PostgreSQL");
                let drop = format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)");
                sqlx::query(sqlx::AssertSqlSafe(drop))
                    .execute(&mut connection)
                    .await
                    .unwrap();
            }
            let (server, _) = admin.rsplit_once('/').unwrap_or((&admin, ""));
            format!("{server}/{database}")
        }
    }
}

pub async fn count_tickets_titled(db: &Db, title: &str) -> i64 {
    on_pool!(db.read(), |pool| sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM tickets WHERE title = $1"
    )
    .bind(title)
    .fetch_one(pool)
    .await
    .unwrap())
}

/// A database with `operations` finished operations already stored, made once
/// and kept (seeding ten million rows takes minutes).
pub async fn seeded_db(backend: Backend, operations: u64) -> Db {
    let name = format!("seeded_{operations}");
    let mut db = Db::connect(&database_url(backend, &name, false).await, 16)
        .await
        .expect("a seeded database");
    if let Err(e) = tickets::migrate(&db).await {
        // seeded under migrations that have changed since: seed it afresh
        println!("the seeded database no longer matches the migrations ({e}); seeding it again");
        db.close().await;
        db = Db::connect(&database_url(backend, &name, true).await, 16)
            .await
            .expect("a seeded database");
        tickets::migrate(&db).await.expect("migrations apply");
    }
    let have: i64 = on_pool!(db.read(), |pool| sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM idempotency_operations WHERE idempotency_key LIKE 'seed-%'"
    )
    .fetch_one(pool)
    .await
    .unwrap());
    let mut next = have as u64 + 1;
    let batch = 500_000;
    while next <= operations {
        let last = (next + batch - 1).min(operations);
        eprintln!("  seeding operations {next}..={last} of {operations}");
        seed(&db, next as i64, last as i64).await;
        next = last + 1;
    }
    db
}

pub async fn seed(db: &Db, first: i64, last: i64) {
    let now = Timestamp::now();
    match db.write() {
        Pool::Postgres(pool) => {
            sqlx::query(
                "INSERT INTO idempotency_operations (account_id, idempotency_key, operation_id, principal_id, method, \
                 route, fingerprint, state, attempts, response_status, response_content_type, response_body, \
                 created_at, updated_at) \
                 SELECT 'acme', 'seed-' || g, 'op_seed_' || g, 'acme-agent', 'POST', '/v1/tickets', \
                        md5(g::text) || md5((g + 1)::text), 'completed', 1, 201, 'application/json', '\\x7b7d'::bytea, $3, $3 \
                 FROM generate_series($1::bigint, $2::bigint) AS g",
            )
            .bind(first)
            .bind(last)
            .bind(now)
            .execute(pool)
            .await
            .unwrap();
        }
        Pool::Sqlite(pool) => {
            sqlx::query(
                "WITH RECURSIVE g(n) AS (SELECT $1 UNION ALL SELECT n + 1 FROM g WHERE n < $2) \
                 INSERT INTO idempotency_operations (account_id, idempotency_key, operation_id, principal_id, method, \
                 route, fingerprint, state, attempts, response_status, response_content_type, response_body, \
                 created_at, updated_at) \
                 SELECT 'acme', 'seed-' || n, 'op_seed_' || n, 'acme-agent', 'POST', '/v1/tickets', \
                        printf('%064x', n), 'completed', 1, 201, 'application/json', X'7b7d', $3, $3 FROM g",
            )
            .bind(first)
            .bind(last)
            .bind(now)
            .execute(pool)
            .await
            .unwrap();
        }
    }
}

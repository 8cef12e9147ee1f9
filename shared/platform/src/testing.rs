//! Test support: a fresh database per test on either backend, and the
//! [`both_backends!`](crate::both_backends) macro that runs one test body on
//! SQLite and on PostgreSQL.
//!
//! PostgreSQL is found at `TEST_DATABASE_URL` (else `DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/postgres`). Where it cannot be reached,
//! the PostgreSQL half of each test says so and passes — except under
//! `CI=true`, where an unreachable PostgreSQL fails the test.

use std::str::FromStr;

use sqlx::{
    ConnectOptions, Connection,
    postgres::{PgConnectOptions, PgConnection},
};
use tokio::sync::OnceCell;

use crate::db::{Backend, Db};

/// A database made for one test and dropped after it.
#[derive(Debug)]
pub struct TestDb {
    pub db: Db,
    /// The URL a separate process (a real service binary) can open.
    pub url: String,
    cleanup: Cleanup,
}

#[derive(Debug)]
enum Cleanup {
    Sqlite(#[allow(dead_code)] tempfile::TempDir),
    Postgres { admin_url: String, database: String },
}

pub fn postgres_admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .ok()
        .filter(|u| u.starts_with("postgres"))
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether tests on `backend` can run here. Under `CI=true` an unreachable
/// PostgreSQL panics instead of answering `false`.
pub async fn backend_available(backend: Backend) -> bool {
    static POSTGRES: OnceCell<Result<(), String>> = OnceCell::const_new();
    if backend == Backend::Sqlite {
        return true;
    }
    let reachable = POSTGRES
        .get_or_init(|| async {
            let options = PgConnectOptions::from_str(&postgres_admin_url()).map_err(|e| e.to_string())?;
            let connection = tokio::time::timeout(std::time::Duration::from_secs(5), options.connect())
                .await
                .map_err(|_| "timed out".to_owned())?
                .map_err(|e| e.to_string())?;
            connection.close().await.map_err(|e| e.to_string())
        })
        .await;
    match reachable {
        Ok(()) => true,
        Err(e) if in_ci() => panic!(
            "PostgreSQL at {} is unreachable under CI=true: {e}",
            postgres_admin_url()
        ),
        Err(e) => {
            eprintln!(
                "skipped: PostgreSQL at {} is unreachable ({e}); set TEST_DATABASE_URL to run this half",
                postgres_admin_url()
            );
            false
        }
    }
}

impl TestDb {
    /// A new, empty database (no migrations applied).
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let url = format!("sqlite://{}", dir.path().join("test.db").display());
                let db = Db::connect(&url, 16).await.expect("a SQLite test database");
                TestDb {
                    db,
                    url,
                    cleanup: Cleanup::Sqlite(dir),
                }
            }
            Backend::Postgres => {
                let admin_url = postgres_admin_url();
                let database = format!("rs_test_{}", uuid::Uuid::new_v4().simple());
                let options = PgConnectOptions::from_str(&admin_url).expect("a PostgreSQL URL");
                let url = options.clone().database(&database).to_url_lossy().to_string();
                // Db::connect creates the database
                let db = Db::connect(&url, 16).await.expect("a PostgreSQL test database");
                TestDb {
                    db,
                    url,
                    cleanup: Cleanup::Postgres { admin_url, database },
                }
            }
        }
    }

    pub fn backend(&self) -> Backend {
        self.db.backend()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Cleanup::Postgres { admin_url, database } = &self.cleanup {
            let (admin_url, database, db) = (admin_url.clone(), database.clone(), self.db.clone());
            // Drop runs inside the test's runtime, so the async clean-up gets a thread of its own.
            let _ = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                runtime.block_on(async move {
                    db.close().await;
                    let mut admin = PgConnection::connect(&admin_url).await.ok()?;
                    let drop = format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)");
                    sqlx::query(sqlx::AssertSqlSafe(drop)).execute(&mut admin).await.ok()?;
                    admin.close().await.ok()
                })
            })
            .join();
        }
    }
}

/// Runs each named `async fn name(backend: Backend)` twice, as
/// `sqlite::name` and `postgres::name`: one test body on both backends.
///
/// ```ignore
/// async fn replay_returns_the_stored_answer(backend: Backend) { … }
/// platform::both_backends!(replay_returns_the_stored_answer);
/// ```
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::db::Backend::Sqlite).await
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if $crate::testing::backend_available($crate::db::Backend::Postgres).await {
                        super::$name($crate::db::Backend::Postgres).await
                    }
                }
            )+
        }
    };
}

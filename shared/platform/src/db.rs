//! The one seam between services and their two storage backends.
//!
//! A service holds a [`Db`] and hands out [`Tx`] transactions; every store
//! function matches on the variant once and runs that backend's own SQL. The
//! handler code stays backend-free and the SQL stays explicit and idiomatic per
//! backend: enum dispatch, with no backend generic spreading into every handler.
//! What differs between the backends, and why: docs/design.md §9.

use std::{
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use sqlx::{
    ConnectOptions, Connection, PgPool, Postgres, Sqlite, SqlitePool,
    migrate::{MigrateError, Migrator},
    postgres::{PgConnectOptions, PgPoolOptions},
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};

/// Which database a [`Db`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }
}

/// A connection pool to one service's database.
#[derive(Clone, Debug)]
pub enum Db {
    Postgres(PgPools),
    Sqlite(SqlitePools),
}

/// PostgreSQL: one pool for everything that must be durable, and a small one
/// with `synchronous_commit = off` for writes whose loss in a database crash
/// changes no outcome (counting attempts): a replay then never waits for a
/// WAL flush.
#[derive(Clone, Debug)]
pub struct PgPools {
    pub main: PgPool,
    pub relaxed: PgPool,
    outages: Outages,
}

/// SQLite allows one writer at a time. Writers queue for the single write
/// connection inside the process (fair, and woken at once) instead of
/// polling SQLite's lock with `busy_timeout` sleeps, which under load turns
/// milliseconds into seconds. Readers never wait for writers (WAL).
#[derive(Clone, Debug)]
pub struct SqlitePools {
    pub read: SqlitePool,
    pub write: SqlitePool,
    outages: Outages,
}

/// How many times this process has seen its database unavailable or
/// replaced: a request answered 503 `database_unavailable`, a `/healthz`
/// probe that found it unreachable or taking no writes, or another server
/// found behind the same address ([`Db::still_the_same_server`]). What was
/// read from the database before an outage may be gone after it: a failover
/// to a standby that had not received the last commits takes them away. So
/// what a process keeps of the database in memory (the replay cache) is kept
/// under this count and forgotten when it goes up.
#[derive(Clone, Debug, Default)]
pub struct Outages {
    seen: Arc<AtomicU64>,
    /// The server last found behind the address, and when: `None` until one
    /// is found, and again once it could not be reached.
    server: Arc<tokio::sync::Mutex<Option<(std::time::Instant, String)>>>,
    /// When the server was last found to be the one before, in microseconds
    /// after [`since_start`]'s start (0: not found to be). Read with no lock,
    /// so that the many replays of a moment do not queue at `server` to learn
    /// what the last of them learned.
    confirmed_at: Arc<AtomicU64>,
}

/// Microseconds since this process first asked, at least 1: 0 stands for never.
fn since_start() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    (start.elapsed().as_micros() as u64).max(1)
}

impl Outages {
    /// The outages seen so far.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::SeqCst)
    }

    /// Counts one more.
    pub fn saw_one(&self) {
        self.seen.fetch_add(1, Ordering::SeqCst);
    }
}

/// How long the server found behind the database's address is taken to be
/// there still: a failover puts another there, and it takes longer than
/// this to promote a standby.
const SAME_SERVER_FOR: Duration = Duration::from_millis(250);

/// How many connections a pool holds, how many of them are idle, and how
/// many it may open.
#[derive(Debug, Clone, Copy)]
pub struct PoolStats {
    pub name: &'static str,
    pub size: u32,
    pub idle: usize,
    pub max: u32,
}

/// A pool to run one statement on: [`Db::read`] or [`Db::write`].
#[derive(Clone, Copy, Debug)]
pub enum Pool<'a> {
    Postgres(&'a PgPool),
    Sqlite(&'a SqlitePool),
}

/// A transaction on a [`Db`]: the unit in which a business write and the
/// completion of its operation commit together.
#[derive(Debug)]
pub enum Tx {
    Postgres(sqlx::Transaction<'static, Postgres>),
    Sqlite(sqlx::Transaction<'static, Sqlite>),
}

/// The migrations a crate owns, for each backend. A service applies the sets
/// of every crate it uses (idempotency, platform, its own) as one ordered list.
#[derive(Debug)]
pub struct Migrations {
    pub postgres: Migrator,
    pub sqlite: Migrator,
}

/// How long a writer waits for SQLite's single write lock before giving up.
/// Duplicates of one key queue here, so it must outlast a 200-way storm.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(30);

impl Db {
    /// Connects to `url` (`postgres://…` or `sqlite:…`), creating the database
    /// if it does not exist yet.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Db, sqlx::Error> {
        if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            // generic plans: a statement on a partitioned table is otherwise planned
            // anew at every execution, as PostgreSQL's plan cache prices a generic
            // plan at every partition, not the one it prunes to (docs/design.md §13)
            let options = PgConnectOptions::from_str(url)?
                .log_statements(tracing::log::LevelFilter::Trace)
                .options([("plan_cache_mode", "force_generic_plan")]);
            create_postgres_database_if_missing(&options).await?;
            let main = PgPoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(options.clone())
                .await?;
            let relaxed = PgPoolOptions::new()
                .max_connections(max_connections.div_ceil(4))
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(options.options([("synchronous_commit", "off")]))
                .await?;
            let db = Db::Postgres(PgPools {
                main,
                relaxed,
                outages: Outages::default(),
            });
            // the server found now is the one every answer learned from now on comes from
            db.still_the_same_server().await;
            Ok(db)
        } else {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .foreign_keys(true)
                .busy_timeout(SQLITE_BUSY_TIMEOUT)
                .log_statements(tracing::log::LevelFilter::Trace);
            let write = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(SQLITE_BUSY_TIMEOUT)
                .connect_with(options.clone())
                .await?;
            let read = SqlitePoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(SQLITE_BUSY_TIMEOUT)
                .connect_with(options.read_only(true))
                .await?;
            Ok(Db::Sqlite(SqlitePools {
                read,
                write,
                outages: Outages::default(),
            }))
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Db::Postgres(_) => Backend::Postgres,
            Db::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// The outages of this database this process has seen.
    pub fn outages(&self) -> &Outages {
        match self {
            Db::Postgres(pools) => &pools.outages,
            Db::Sqlite(pools) => &pools.outages,
        }
    }

    /// The pool for statements that only read.
    pub fn read(&self) -> Pool<'_> {
        match self {
            Db::Postgres(pools) => Pool::Postgres(&pools.main),
            Db::Sqlite(pools) => Pool::Sqlite(&pools.read),
        }
    }

    /// The pool for statements that write outside a transaction.
    pub fn write(&self) -> Pool<'_> {
        match self {
            Db::Postgres(pools) => Pool::Postgres(&pools.main),
            Db::Sqlite(pools) => Pool::Sqlite(&pools.write),
        }
    }

    /// The pool for writes that may be lost in a database crash without
    /// changing any outcome. (SQLite in WAL mode with `synchronous = NORMAL`
    /// never waits for a flush at commit anyway.)
    pub fn write_relaxed(&self) -> Pool<'_> {
        match self {
            Db::Postgres(pools) => Pool::Postgres(&pools.relaxed),
            Db::Sqlite(pools) => Pool::Sqlite(&pools.write),
        }
    }

    /// Whether the database answers a query within `within`: what `/healthz`
    /// reports. On PostgreSQL it also asks that the server take writes, since
    /// a standby (or a demoted primary) answers reads but refuses every claim.
    /// A database found otherwise counts as an outage seen ([`Outages`]).
    pub async fn reachable(&self, within: Duration) -> bool {
        let asked = async {
            match self {
                // a connection of its own: the pool may be busy, or waiting out its
                // back-off after refused connections, while the server is fine
                Db::Postgres(pools) => {
                    use sqlx::{ConnectOptions, Connection};
                    let Ok(mut connection) = pools.main.connect_options().connect().await else {
                        return false;
                    };
                    let writable = sqlx::query_scalar::<_, bool>("SELECT NOT pg_is_in_recovery()")
                        .fetch_one(&mut connection)
                        .await
                        .unwrap_or(false);
                    let _ = connection.close().await;
                    writable
                }
                Db::Sqlite(pools) => sqlx::query("SELECT 1").execute(&pools.read).await.is_ok(),
            }
        };
        let reachable = tokio::time::timeout(within, asked).await.unwrap_or(false);
        if !reachable {
            self.outages().saw_one();
        }
        reachable
    }

    /// Whether the server this process reaches is the one it reached a
    /// moment ago, asked at most every `SAME_SERVER_FOR` and one caller at a
    /// time. On PostgreSQL a server is told by its postmaster's start time: a
    /// promoted standby behind the same address is another server, and so
    /// is a restarted primary. Another server, or none within a second,
    /// counts as an outage seen; so does the first one found, since what was
    /// learned before it cannot be vouched for. A SQLite file does not fail
    /// over: always.
    pub async fn still_the_same_server(&self) -> bool {
        let Db::Postgres(pools) = self else {
            return true;
        };
        let confirmed_at = &pools.outages.confirmed_at;
        let confirmed = confirmed_at.load(Ordering::SeqCst);
        if confirmed != 0 && since_start().saturating_sub(confirmed) < SAME_SERVER_FOR.as_micros() as u64 {
            return true;
        }
        let mut found = pools.outages.server.lock().await;
        if found.as_ref().is_some_and(|(at, _)| at.elapsed() < SAME_SERVER_FOR) {
            return true;
        }
        let asked = sqlx::query_scalar::<_, String>("SELECT pg_postmaster_start_time()::text").fetch_one(&pools.main);
        let same = match tokio::time::timeout(Duration::from_secs(1), asked).await {
            Ok(Ok(server)) => {
                let same = found.as_ref().is_some_and(|(_, known)| *known == server);
                *found = Some((std::time::Instant::now(), server));
                same
            }
            _ => {
                *found = None;
                false
            }
        };
        // another server, or none, is vouched for by no one until it is found again
        confirmed_at.store(if same { since_start() } else { 0 }, Ordering::SeqCst);
        if !same {
            pools.outages.saw_one();
        }
        same
    }

    /// Applies every given set of migrations, in version order, as one list.
    pub async fn migrate(&self, sets: &[&Migrations]) -> Result<(), MigrateError> {
        let pick = |set: &&Migrations| match self {
            Db::Postgres(_) => set.postgres.iter().cloned().collect::<Vec<_>>(),
            Db::Sqlite(_) => set.sqlite.iter().cloned().collect(),
        };
        let migrator = Migrator::with_migrations(sets.iter().flat_map(pick).collect());
        let migrated = match self {
            Db::Postgres(pools) => migrator.run(&pools.main).await,
            Db::Sqlite(pools) => migrator.run(&pools.write).await,
        };
        if let Err(MigrateError::VersionMissing(version) | MigrateError::VersionMismatch(version)) = &migrated {
            // no release has shipped, so no upgrade path is kept from an earlier schema
            tracing::error!(
                version,
                "this database was made by an earlier, unreleased schema and cannot be upgraded: \
                 remove it (the sandbox keeps its databases in ./.sandbox) and start again"
            );
        }
        migrated
    }

    /// Begins a write transaction. On SQLite it takes the write lock at once
    /// (`BEGIN IMMEDIATE`): a deferred transaction that reads and then writes
    /// can fail with SQLITE_BUSY instead of waiting its turn.
    pub async fn begin(&self) -> Result<Tx, sqlx::Error> {
        Ok(match self {
            Db::Postgres(pools) => Tx::Postgres(pools.main.begin().await?),
            Db::Sqlite(pools) => Tx::Sqlite(pools.write.begin_with("BEGIN IMMEDIATE").await?),
        })
    }

    /// Measures how far the database server's clock is from this process's
    /// and makes [`Timestamp::now`](crate::Timestamp::now) follow the
    /// server's, so that replicas agree on when leases and retention end. The
    /// server's time is taken as having been read halfway through the round
    /// trip. SQLite's clock is the process's: nothing to measure.
    pub async fn sync_clock(&self) -> Result<(), sqlx::Error> {
        let Db::Postgres(pg) = self else {
            return Ok(());
        };
        // the connection first: only the query's round trip is timed
        let mut connection = pg.main.acquire().await?;
        let sent = crate::time::local_now();
        let server: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&mut *connection)
            .await?;
        let received = crate::time::local_now();
        let halfway = sent + (received - sent) / 2;
        crate::time::set_database_offset(server - halfway);
        Ok(())
    }

    /// Measures the database's clock again every minute, forever: clocks
    /// drift apart, and leases and retention are measured on it.
    pub async fn keep_clock_synced(self) {
        loop {
            tokio::time::sleep(Duration::from_secs(60)).await;
            if let Err(e) = self.sync_clock().await {
                tracing::warn!(error = %e, "could not read the database's clock; keeping the last offset");
            }
        }
    }

    /// Each pool's connections, for the metrics.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        fn stats<D: sqlx::Database>(name: &'static str, pool: &sqlx::Pool<D>) -> PoolStats {
            PoolStats {
                name,
                size: pool.size(),
                idle: pool.num_idle(),
                max: pool.options().get_max_connections(),
            }
        }
        match self {
            Db::Postgres(pg) => vec![stats("main", &pg.main), stats("relaxed", &pg.relaxed)],
            Db::Sqlite(lite) => vec![stats("read", &lite.read), stats("write", &lite.write)],
        }
    }

    pub async fn close(&self) {
        match self {
            Db::Postgres(pools) => {
                pools.relaxed.close().await;
                pools.main.close().await;
            }
            Db::Sqlite(pools) => {
                pools.read.close().await;
                pools.write.close().await;
            }
        }
    }
}

impl Tx {
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            Tx::Postgres(tx) => tx.commit().await,
            Tx::Sqlite(tx) => tx.commit().await,
        }
    }

    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        match self {
            Tx::Postgres(tx) => tx.rollback().await,
            Tx::Sqlite(tx) => tx.rollback().await,
        }
    }

    /// Inserts `rows`, a JSON array of `expected` rows, by the backend's
    /// statement that reads it (`[on_postgres, on_sqlite]`), and fails unless
    /// every row went in. One statement whose text never changes, however
    /// many rows: bound a field at a time, thousands of rows would make SQLite
    /// scan its parameter list once for every parameter bound.
    pub async fn insert_json_rows(
        &mut self,
        [on_postgres, on_sqlite]: [&'static str; 2],
        rows: String,
        expected: usize,
    ) -> Result<(), sqlx::Error> {
        let inserted = match self {
            Tx::Postgres(tx) => sqlx::query(on_postgres)
                .bind(rows)
                .execute(&mut **tx)
                .await?
                .rows_affected(),
            Tx::Sqlite(tx) => sqlx::query(on_sqlite)
                .bind(rows)
                .execute(&mut **tx)
                .await?
                .rows_affected(),
        };
        if inserted != expected as u64 {
            // cannot happen: the database refuses the whole statement, or takes every row
            return Err(sqlx::Error::Protocol(format!("{inserted} of {expected} rows went in")));
        }
        Ok(())
    }
}

/// Creates the database named in `options` through the server's `postgres`
/// database. `CREATE DATABASE` itself decides a race between two starting
/// services: the loser's "already exists" error is expected and ignored.
async fn create_postgres_database_if_missing(options: &PgConnectOptions) -> Result<(), sqlx::Error> {
    let Some(name) = options.get_database().map(str::to_owned) else {
        return Ok(());
    };
    let mut admin = options.clone().database("postgres").connect().await?;
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(&name)
        .fetch_one(&mut admin)
        .await?;
    if !exists {
        let create = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        match sqlx::query(sqlx::AssertSqlSafe(create)).execute(&mut admin).await {
            Ok(_) => {}
            // 42P04 duplicate_database, 23505 when two CREATEs race on pg_database
            Err(sqlx::Error::Database(e)) if matches!(e.code().as_deref(), Some("42P04" | "23505")) => {}
            Err(e) => return Err(e),
        }
    }
    admin.close().await
}

/// Runs `body` with `$pool` bound to a [`Pool`] (`db.read()` or
/// `db.write()`) of whichever backend it is: for SQL that both dialects spell
/// the same (`$1` placeholders work on both). The body is compiled once per
/// backend, so every bind is type-checked twice.
#[macro_export]
macro_rules! on_pool {
    ($pool_of:expr, |$pool:ident| $body:expr) => {
        match $pool_of {
            $crate::db::Pool::Postgres($pool) => $body,
            $crate::db::Pool::Sqlite($pool) => $body,
        }
    };
}

/// Like [`on_pool!`], inside a transaction: `$conn` is the transaction's connection.
#[macro_export]
macro_rules! on_tx {
    ($tx:expr, |$conn:ident| $body:expr) => {
        match $tx {
            $crate::db::Tx::Postgres(tx) => {
                let $conn = &mut **tx;
                $body
            }
            $crate::db::Tx::Sqlite(tx) => {
                let $conn = &mut **tx;
                $body
            }
        }
    };
}

/// True when `error` is a unique-constraint violation, on either backend.
pub fn is_unique_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.is_unique_violation())
}

//! The agent's durable operation journal: an embedded SQLite file that keeps,
//! for each task-level operation name, the idempotency key (made once and
//! stored **before the first send**), a digest of what was intended, the last
//! known state and the result — so a retry after a restart of the agent sends
//! the same key, and a changed payload under the same name is caught here,
//! before it reaches any service.

use std::{path::Path, str::FromStr};

use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::{
    SqlitePool,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions},
};

use crate::{AgentError, Outcome, Request};

static MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/agent/sqlite");

/// One operation as the journal keeps it.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub name: String,
    pub idempotency_key: String,
    pub payload_digest: String,
    pub method: String,
    pub target: String,
    /// `None` until an outcome is known.
    pub state: Option<Outcome>,
    pub operation_id: Option<String>,
    pub result_status: Option<u16>,
    pub result_body: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// One request the agent made for an operation, or a pause, and what it learned.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptRecord {
    pub name: String,
    pub at: String,
    pub action: String,
    pub status: Option<u16>,
    pub note: String,
}

#[derive(Debug, Clone)]
pub struct Journal {
    pool: SqlitePool,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// sha256 of the canonical JSON (RFC 8785) of the method, the path and the
/// body: member order and white space do not change it, and neither does
/// where the service is reached (a proxy, a moved port).
pub fn payload_digest(request: &Request) -> String {
    let intended = serde_json::json!({
        "method": request.method.as_str(),
        "path": request.path,
        "body": request.body,
    });
    let canonical = serde_json_canonicalizer::to_vec(&intended).unwrap_or_default();
    hex::encode(Sha256::digest(canonical))
}

/// Applies `migrator` under SQLite's write lock, taken first: processes that
/// open one new journal at once (replicas of the MCP server) apply each
/// migration once, instead of racing to create the same table.
pub async fn migrate(pool: &SqlitePool, migrator: &sqlx::migrate::Migrator) -> Result<(), sqlx::migrate::MigrateError> {
    use sqlx::Connection;
    let mut connection = pool.acquire().await?;
    let mut exclusive = connection.begin_with("BEGIN IMMEDIATE").await?;
    // `run` on a transaction trips sqlx's "Acquire is not general enough";
    // `run_direct` is its way around that
    migrator.run_direct(None, &mut *exclusive, false).await?;
    exclusive.commit().await?;
    Ok(())
}

impl Journal {
    /// Opens (and makes, the first time) the journal at `path`.
    pub async fn open(path: &Path) -> Result<Journal, AgentError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| AgentError::Journal(e.to_string()))?;
        }
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(std::time::Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await?;
        migrate(&pool, &MIGRATIONS)
            .await
            .map_err(|e| AgentError::Journal(e.to_string()))?;
        Ok(Journal { pool })
    }

    /// The operation `name`: the one the journal has — refused if it was for
    /// another payload — or a new one, with a new key, written and committed
    /// before this returns (so before anything is sent).
    pub async fn begin(&self, name: &str, request: &Request) -> Result<Entry, AgentError> {
        let digest = payload_digest(request);
        let at = now();
        sqlx::query(
            "INSERT INTO agent_operations (name, idempotency_key, payload_digest, method, target, state, \
             created_at, updated_at) VALUES ($1, $2, $3, $4, $5, 'pending', $6, $6) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(&digest)
        .bind(request.method.as_str())
        .bind(request.target())
        .bind(&at)
        .execute(&self.pool)
        .await?;
        let entry = self
            .entry(name)
            .await?
            .ok_or_else(|| AgentError::Journal(format!("operation `{name}` vanished")))?;
        if entry.payload_digest != digest {
            return Err(AgentError::ChangedPayload { name: name.to_owned() });
        }
        Ok(entry)
    }

    /// Records operation `name` under a key made elsewhere (a workflow
    /// engine that owns the keys hands one over), instead of making one.
    /// Refused like [`Journal::begin`] if the name is known with another payload.
    pub async fn adopt(&self, name: &str, key: &str, request: &Request) -> Result<Entry, AgentError> {
        let at = now();
        sqlx::query(
            "INSERT INTO agent_operations (name, idempotency_key, payload_digest, method, target, state, \
             created_at, updated_at) VALUES ($1, $2, $3, $4, $5, 'pending', $6, $6) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(key)
        .bind(payload_digest(request))
        .bind(request.method.as_str())
        .bind(request.target())
        .bind(&at)
        .execute(&self.pool)
        .await?;
        self.begin(name, request).await
    }

    pub async fn entry(&self, name: &str) -> Result<Option<Entry>, AgentError> {
        let row: Option<EntryRow> = sqlx::query_as(
            "SELECT name, idempotency_key, payload_digest, method, target, state, operation_id, result_status, \
             result_body, created_at, updated_at FROM agent_operations WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(Entry::from))
    }

    /// The operation sent with `key`, under whatever name.
    pub async fn entry_by_key(&self, key: &str) -> Result<Option<Entry>, AgentError> {
        let row: Option<EntryRow> = sqlx::query_as(
            "SELECT name, idempotency_key, payload_digest, method, target, state, operation_id, result_status, \
             result_body, created_at, updated_at FROM agent_operations WHERE idempotency_key = $1",
        )
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(Entry::from))
    }

    /// Forgets the outcome recorded for `name`, keeping its key: the answer
    /// was about the caller (a key the service did not accept), not the
    /// operation, so the next run sends again.
    pub async fn reopen(&self, name: &str) -> Result<(), AgentError> {
        sqlx::query("UPDATE agent_operations SET state = 'pending', updated_at = $2 WHERE name = $1")
            .bind(name)
            .bind(now())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every operation, oldest first.
    pub async fn entries(&self) -> Result<Vec<Entry>, AgentError> {
        let rows: Vec<EntryRow> = sqlx::query_as(
            "SELECT name, idempotency_key, payload_digest, method, target, state, operation_id, result_status, \
             result_body, created_at, updated_at FROM agent_operations ORDER BY created_at, name",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(Entry::from).collect())
    }

    /// Records what is known of the operation now.
    pub async fn record_state(
        &self,
        name: &str,
        state: Outcome,
        operation_id: Option<&str>,
        result: Option<(u16, &str)>,
    ) -> Result<(), AgentError> {
        sqlx::query(
            "UPDATE agent_operations SET state = $2, operation_id = COALESCE($3, operation_id), \
             result_status = COALESCE($4, result_status), result_body = COALESCE($5, result_body), updated_at = $6 \
             WHERE name = $1",
        )
        .bind(name)
        .bind(state.as_str())
        .bind(operation_id)
        .bind(result.map(|(status, _)| i64::from(status)))
        .bind(result.map(|(_, body)| body))
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn record_attempt(
        &self,
        name: &str,
        action: &str,
        status: Option<u16>,
        note: &str,
    ) -> Result<(), AgentError> {
        sqlx::query("INSERT INTO agent_attempts (name, at, action, status, note) VALUES ($1, $2, $3, $4, $5)")
            .bind(name)
            .bind(now())
            .bind(action)
            .bind(status.map(i64::from))
            .bind(note)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every attempt, in order (of one operation, if named).
    pub async fn attempts(&self, name: Option<&str>) -> Result<Vec<AttemptRecord>, AgentError> {
        let rows: Vec<(String, String, String, Option<i64>, String)> = sqlx::query_as(
            "SELECT name, at, action, status, note FROM agent_attempts WHERE $1 IS NULL OR name = $1 ORDER BY seq",
        )
        .bind(name)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(name, at, action, status, note)| AttemptRecord {
                name,
                at,
                action,
                status: status.and_then(|s| u16::try_from(s).ok()),
                note,
            })
            .collect())
    }

    /// The journal's database, for a front end that keeps tables of its own
    /// beside the agent's (under its own migration ledger).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

type EntryRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<i64>,
    Option<String>,
    String,
    String,
);

impl From<EntryRow> for Entry {
    fn from(row: EntryRow) -> Self {
        let (
            name,
            idempotency_key,
            payload_digest,
            method,
            target,
            state,
            operation_id,
            result_status,
            result_body,
            created_at,
            updated_at,
        ) = row;
        Entry {
            name,
            idempotency_key,
            payload_digest,
            method,
            target,
            state: Outcome::parse(&state),
            operation_id,
            result_status: result_status.and_then(|s| u16::try_from(s).ok()),
            result_body,
            created_at,
            updated_at,
        }
    }
}

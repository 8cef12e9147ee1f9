//! The agent's durable operation journal: an embedded SQLite file that keeps,
//! for each task-level operation name, the idempotency key (made once and
//! stored **before the first send**), a digest of what was intended, the last
//! known state and the result — so a retry after a restart of the agent sends
//! the same key, and a changed payload under the same name is caught here,
//! before it reaches any service.
//!
//! A journal handle belongs to one [`Account`]: names and keys are unique per
//! account, and every statement reads and writes that account's rows alone,
//! so agents that act for different accounts may share one file.

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

/// Whose operations a journal handle keeps: a named account (`account acme`),
/// or, when none is named, a mark of the API key (`key 1f0c…`, a prefix of
/// its SHA-256, never the key). A named account outlives a rotated key; a
/// mark does not.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Account(String);

impl Account {
    pub fn named(id: &str) -> Account {
        Account(format!("account {id}"))
    }

    pub fn of_key(api_key: &str) -> Account {
        Account(format!("key {}", hex::encode(&Sha256::digest(api_key.as_bytes())[..8])))
    }

    /// `account` when it is named, else the mark of `api_key`.
    pub fn of(account: Option<&str>, api_key: &str) -> Account {
        account.map_or_else(|| Account::of_key(api_key), Account::named)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Only a mark of a key: it changes when the key does.
    fn is_mark(&self) -> bool {
        self.0.starts_with("key ")
    }
}

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The account of an operation made before the journal kept accounts: the
/// first account that names it takes it (see the migration).
const UNCLAIMED: &str = "";

/// One account's operations in a journal file.
#[derive(Debug, Clone)]
pub struct Journal {
    pool: SqlitePool,
    account: Account,
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

/// The journal file at `path`, made the first time and migrated: every
/// account's. A reader of the whole file (an operator's tool) takes it as is;
/// an agent takes its account's [`Journal`].
pub async fn open_file(path: &Path) -> Result<SqlitePool, AgentError> {
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
    Ok(pool)
}

impl Journal {
    /// Opens (and makes, the first time) the journal at `path`, for `account`.
    pub async fn open(path: &Path, account: Account) -> Result<Journal, AgentError> {
        Ok(Journal {
            pool: open_file(path).await?,
            account,
        })
    }

    /// The same file, as `account`'s journal.
    pub fn for_account(&self, account: Account) -> Journal {
        Journal {
            pool: self.pool.clone(),
            account,
        }
    }

    pub fn account(&self) -> &Account {
        &self.account
    }

    /// The operation `name`: the one the journal has — refused if it was for
    /// another payload — or a new one, with a new key, written and committed
    /// before this returns (so before anything is sent).
    pub async fn begin(&self, name: &str, request: &Request) -> Result<Entry, AgentError> {
        self.claim(name, request).await?;
        self.refuse_if_known_elsewhere(name).await?;
        self.insert(name, &uuid::Uuid::new_v4().to_string(), request).await?;
        let entry = self
            .entry(name)
            .await?
            .ok_or_else(|| AgentError::Journal(format!("operation `{name}` vanished")))?;
        for_request(entry, request)
    }

    /// Records operation `name` under a key made elsewhere (a workflow
    /// engine that owns the keys hands one over), instead of making one.
    /// Refused like [`Journal::begin`] if the name is known with another
    /// payload, and if the key is another of this account's operations.
    pub async fn adopt(&self, name: &str, key: &str, request: &Request) -> Result<Entry, AgentError> {
        self.claim(name, request).await?;
        self.refuse_if_known_elsewhere(name).await?;
        self.insert(name, key, request).await?;
        // nothing under the name: the insert met the key, another operation's
        let entry = self
            .entry(name)
            .await?
            .ok_or_else(|| AgentError::KeyOfAnotherOperation { name: name.to_owned() })?;
        for_request(entry, request)
    }

    /// Takes operation `name` for this account if it was made before the
    /// journal kept accounts, for this very request, and no account has
    /// named it since. `OR IGNORE`: if this account has `name` already, its
    /// own stays.
    async fn claim(&self, name: &str, request: &Request) -> Result<(), AgentError> {
        sqlx::query(
            "UPDATE OR IGNORE agent_operations SET account = $1 \
             WHERE account = $2 AND name = $3 AND payload_digest = $4",
        )
        .bind(self.account.as_str())
        .bind(UNCLAIMED)
        .bind(name)
        .bind(payload_digest(request))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Refuses a name this account does not have when the journal has it
    /// under another account and either is only a key's mark: a rotated key
    /// or an account named since would otherwise make a second key for the
    /// same action. Two named accounts keep their names apart, as tenants do.
    async fn refuse_if_known_elsewhere(&self, name: &str) -> Result<(), AgentError> {
        if self.entry(name).await?.is_some() {
            return Ok(());
        }
        let elsewhere: Option<String> = sqlx::query_scalar(
            "SELECT account FROM agent_operations WHERE name = $1 AND account NOT IN ($2, $3) \
             AND ($4 OR account LIKE 'key %') LIMIT 1",
        )
        .bind(name)
        .bind(self.account.as_str())
        .bind(UNCLAIMED)
        .bind(self.account.is_mark())
        .fetch_optional(&self.pool)
        .await?;
        match elsewhere {
            Some(_) => Err(AgentError::KnownUnderAnotherAccount { name: name.to_owned() }),
            None => Ok(()),
        }
    }

    /// Writes operation `name` with `key` unless the account has the name,
    /// or the key, already: the unique indexes decide, not a read before.
    async fn insert(&self, name: &str, key: &str, request: &Request) -> Result<(), AgentError> {
        sqlx::query(
            "INSERT INTO agent_operations (account, name, idempotency_key, payload_digest, method, target, state, \
             created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $7) ON CONFLICT DO NOTHING",
        )
        .bind(self.account.as_str())
        .bind(name)
        .bind(key)
        .bind(payload_digest(request))
        .bind(request.method.as_str())
        .bind(request.target())
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn entry(&self, name: &str) -> Result<Option<Entry>, AgentError> {
        let row: Option<EntryRow> = sqlx::query_as(
            "SELECT name, idempotency_key, payload_digest, method, target, state, operation_id, result_status, \
             result_body, created_at, updated_at FROM agent_operations WHERE account = $1 AND name = $2",
        )
        .bind(self.account.as_str())
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(Entry::from))
    }

    /// The account's operation sent with `key`, under whatever name.
    pub async fn entry_by_key(&self, key: &str) -> Result<Option<Entry>, AgentError> {
        let row: Option<EntryRow> = sqlx::query_as(
            "SELECT name, idempotency_key, payload_digest, method, target, state, operation_id, result_status, \
             result_body, created_at, updated_at FROM agent_operations WHERE account = $1 AND idempotency_key = $2",
        )
        .bind(self.account.as_str())
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(Entry::from))
    }

    /// Binds `name` to `request` again, under the same key, when all it came
    /// to was a refusal that claimed nothing: a final failure that belongs
    /// to no operation, as the 400 of a body that fails validation. The
    /// service holds nothing under the key, so it may carry the fixed body
    /// (docs/contract.md §1). A name the service has an operation for keeps
    /// its payload.
    pub async fn rebind_unclaimed(&self, name: &str, request: &Request) -> Result<(), AgentError> {
        sqlx::query(
            "UPDATE agent_operations SET payload_digest = $3, method = $4, target = $5, state = 'pending', \
             result_status = NULL, result_body = NULL, updated_at = $6 \
             WHERE account = $1 AND name = $2 AND state = $7 AND operation_id IS NULL AND payload_digest <> $3",
        )
        .bind(self.account.as_str())
        .bind(name)
        .bind(payload_digest(request))
        .bind(request.method.as_str())
        .bind(request.target())
        .bind(now())
        .bind(Outcome::Failed.as_str())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Forgets the outcome recorded for `name`, keeping its key: the answer
    /// was about the caller (a key the service did not accept), not the
    /// operation, so the next run sends again.
    pub async fn reopen(&self, name: &str) -> Result<(), AgentError> {
        sqlx::query("UPDATE agent_operations SET state = 'pending', updated_at = $3 WHERE account = $1 AND name = $2")
            .bind(self.account.as_str())
            .bind(name)
            .bind(now())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every operation of the account, oldest first.
    pub async fn entries(&self) -> Result<Vec<Entry>, AgentError> {
        let rows: Vec<EntryRow> = sqlx::query_as(
            "SELECT name, idempotency_key, payload_digest, method, target, state, operation_id, result_status, \
             result_body, created_at, updated_at FROM agent_operations WHERE account = $1 ORDER BY created_at, name",
        )
        .bind(self.account.as_str())
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
            "UPDATE agent_operations SET state = $3, operation_id = COALESCE($4, operation_id), \
             result_status = COALESCE($5, result_status), result_body = COALESCE($6, result_body), updated_at = $7 \
             WHERE account = $1 AND name = $2",
        )
        .bind(self.account.as_str())
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
        sqlx::query(
            "INSERT INTO agent_attempts (account, name, at, action, status, note) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(self.account.as_str())
        .bind(name)
        .bind(now())
        .bind(action)
        .bind(status.map(i64::from))
        .bind(note)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every attempt of the account, in order (of one operation, if named).
    pub async fn attempts(&self, name: Option<&str>) -> Result<Vec<AttemptRecord>, AgentError> {
        let rows: Vec<(String, String, String, Option<i64>, String)> = sqlx::query_as(
            "SELECT name, at, action, status, note FROM agent_attempts WHERE account = $1 AND ($2 IS NULL OR name = $2) \
             ORDER BY seq",
        )
        .bind(self.account.as_str())
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

/// The operation as the journal has it, if it was made for `request`: the
/// same name with another payload is a new intention, refused.
fn for_request(entry: Entry, request: &Request) -> Result<Entry, AgentError> {
    if entry.payload_digest != payload_digest(request) {
        return Err(AgentError::ChangedPayload { name: entry.name });
    }
    Ok(entry)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_account_outlives_its_key_and_an_unnamed_one_is_a_mark_of_the_key_never_the_key() {
        assert_eq!(
            Account::of(Some("acme"), "rs_live_old"),
            Account::of(Some("acme"), "rs_live_new")
        );
        let marked = Account::of(None, "rs_live_secret");
        assert_ne!(marked, Account::of(None, "rs_live_other"));
        assert!(marked.as_str().starts_with("key "), "{marked}");
        assert!(!marked.as_str().contains("secret"), "{marked}");
    }
}

//! The MCP server's journal of tool calls: every call with its account,
//! session, tool, intent, key, the digest of what it asked for, its outcome
//! and its operation id (docs/contract.md §13). It shares the agent journal's
//! SQLite file, under a migration ledger of its own.

use agent::Account;
use serde::Serialize;
use sqlx::SqlitePool;

/// One tool call as journaled.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ToolCall {
    pub at: String,
    /// The account the call acted for (an [`Account`]); `None` for a call
    /// that asked every service of a server whose services are different
    /// accounts'.
    pub account: Option<String>,
    pub session: String,
    pub tool: String,
    pub intent: Option<String>,
    pub idempotency_key: Option<String>,
    pub payload_digest: Option<String>,
    pub outcome: String,
    pub operation_id: Option<String>,
    pub http_status: Option<i64>,
    pub approval_id: Option<String>,
}

impl ToolCall {
    /// A call as it starts: what it comes to is filled in before it is recorded.
    pub fn new(session: &str, tool: &str) -> ToolCall {
        ToolCall {
            at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            account: None,
            session: session.to_owned(),
            tool: tool.to_owned(),
            intent: None,
            idempotency_key: None,
            payload_digest: None,
            outcome: String::new(),
            operation_id: None,
            http_status: None,
            approval_id: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Calls {
    pool: SqlitePool,
}

impl Calls {
    /// The call journal in the agent journal's file, made the first time.
    pub async fn open(pool: SqlitePool) -> Result<Calls, sqlx::migrate::MigrateError> {
        let mut migrator = sqlx::migrate!("../../migrations/mcp/sqlite");
        // the agent's migrations keep their own ledger in the same file
        migrator.dangerous_set_table_name("_mcp_migrations");
        agent::journal::migrate(&pool, &migrator).await?;
        Ok(Calls { pool })
    }

    pub async fn record(&self, call: &ToolCall) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO mcp_tool_calls (at, account, session, tool, intent, idempotency_key, payload_digest, \
             outcome, operation_id, http_status, approval_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&call.at)
        .bind(&call.account)
        .bind(&call.session)
        .bind(&call.tool)
        .bind(&call.intent)
        .bind(&call.idempotency_key)
        .bind(&call.payload_digest)
        .bind(&call.outcome)
        .bind(&call.operation_id)
        .bind(call.http_status)
        .bind(&call.approval_id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The tool and operation of `account`'s call that was told to wait for `approval_id`.
    pub async fn waiting_for(
        &self,
        account: &Account,
        approval_id: &str,
    ) -> Result<Option<(String, String)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT tool, operation_id FROM mcp_tool_calls WHERE approval_id = $1 AND account = $2 \
             AND operation_id IS NOT NULL ORDER BY seq LIMIT 1",
        )
        .bind(approval_id)
        .bind(account.as_str())
        .fetch_optional(&self.pool)
        .await
    }

    /// Every call of every account, in the order they were answered: the
    /// file's own record, for its operator (`mcp journal`).
    pub async fn all(&self) -> Result<Vec<ToolCall>, sqlx::Error> {
        sqlx::query_as(
            "SELECT at, account, session, tool, intent, idempotency_key, payload_digest, outcome, operation_id, http_status, \
             approval_id FROM mcp_tool_calls ORDER BY seq",
        )
        .fetch_all(&self.pool)
        .await
    }
}

//! The writes on a claimed operation, each a compare-and-set on its lease or
//! its state, so of two racing attempts exactly one wins (docs/design.md §3).

use platform::{Timestamp, Tx, on_tx};

use crate::{
    key::IdempotencyKey,
    operation::{OperationRecord, OperationState, ResourceRef, StoredResponse},
};

use super::row::OperationRow;

/// Holds `operation` under a new lease if it is as it was read: a dead holder's (the same token,
/// run out), or an approved operation's run (`awaiting_approval` → `in_progress`). `None`:
/// another attempt got there first. Only those two can match: a lease exists only `in_progress`
/// (the schema's CHECK), and handed-on or finished work has none, so `lease_token = $7` is never true.
pub async fn hold(
    tx: &mut Tx,
    operation: &OperationRecord,
    new_token: &str,
    locked_until: Timestamp,
    now: Timestamp,
) -> Result<Option<OperationRecord>, sqlx::Error> {
    const SQL: &str = concat!(
        "UPDATE idempotency_operations \
         SET state = 'in_progress', lease_token = $3, locked_until = $4, updated_at = $5 \
         WHERE account_id = $1 AND idempotency_key = $2 AND state = $6 \
           AND (state = 'awaiting_approval' OR (lease_token = $7 AND locked_until <= $5)) \
         RETURNING ",
        columns!()
    );
    Ok(on_tx!(tx, |conn| {
        sqlx::query_as::<_, OperationRow>(SQL)
            .bind(&operation.account_id)
            .bind(operation.key.as_str())
            .bind(new_token)
            .bind(locked_until)
            .bind(now)
            .bind(operation.state.into_str())
            .bind(operation.lease_token.as_deref().unwrap_or(""))
            .fetch_optional(conn)
            .await?
            .map(OperationRecord::try_from)
            .transpose()?
    }))
}

/// How an operation ends: its final state, its first answer, what it made.
#[derive(Debug)]
pub struct Completion<'a> {
    pub state: OperationState,
    pub response: &'a StoredResponse,
    pub resource: Option<&'a ResourceRef>,
    pub external_ref: Option<&'a str>,
    pub now: Timestamp,
}

impl<'a> Completion<'a> {
    /// A final business failure: its problem answer, nothing made.
    pub fn failed(response: &'a StoredResponse) -> Self {
        Completion {
            state: OperationState::Failed,
            response,
            resource: None,
            external_ref: None,
            now: Timestamp::now(),
        }
    }
}

const COMPLETE_SQL: &str = "UPDATE idempotency_operations SET state = $4, lease_token = NULL, locked_until = NULL, \
     response_status = $5, response_content_type = $6, response_location = $7, response_body = $8, \
     resource_type = $9, resource_id = $10, resource_url = $11, external_ref = $12, updated_at = $13 \
     WHERE account_id = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress'";

/// Finishes the operation in its effect's transaction if this attempt still
/// holds the lease. `false`: it was lost; the caller must roll back.
pub async fn complete(
    tx: &mut Tx,
    account_id: &str,
    key: &IdempotencyKey,
    lease_token: &str,
    completion: &Completion<'_>,
) -> Result<bool, sqlx::Error> {
    let done = on_tx!(tx, |conn| {
        let query = sqlx::query(COMPLETE_SQL)
            .bind(account_id)
            .bind(key.as_str())
            .bind(lease_token);
        bind_completion!(query, completion).execute(conn).await?.rows_affected()
    });
    Ok(done == 1)
}

/// Frees an operation after a server error: deleted, or back to
/// `awaiting_approval` if it has an approval. `false`: the lease was lost.
pub async fn give_back(tx: &mut Tx, operation: &OperationRecord, lease_token: &str) -> Result<bool, sqlx::Error> {
    let sql = if operation.approval_id.is_some() {
        "UPDATE idempotency_operations SET state = 'awaiting_approval', lease_token = NULL, locked_until = NULL \
         WHERE account_id = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress'"
    } else {
        "DELETE FROM idempotency_operations \
         WHERE account_id = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress'"
    };
    let freed = on_tx!(tx, |conn| {
        sqlx::query(sql)
            .bind(&operation.account_id)
            .bind(operation.key.as_str())
            .bind(lease_token)
            .execute(conn)
            .await?
            .rows_affected()
    });
    Ok(freed == 1)
}

//! Claiming a key: one insert under the primary key, so of two attempts with
//! one key exactly one writes (docs/design.md §2).

use std::sync::LazyLock;

use platform::{Timestamp, Tx, on_tx};
use sqlx::error::DatabaseError;

use crate::{
    fingerprint::Fingerprint,
    key::IdempotencyKey,
    operation::{OperationIdentity, OperationRecord, OperationState, StoredResponse},
    transitions::{
        AuditEvent, Record, Sink,
        inbox::{INBOX_COLUMNS, INBOX_INSERT, bind_records, placeholders},
    },
};

use super::{Completion, row::OperationRow};

/// What a first attempt writes when it claims a key.
#[derive(Debug)]
pub struct NewOperation<'a> {
    pub account_id: &'a str,
    pub key: &'a IdempotencyKey,
    pub operation_id: String,
    pub principal_id: &'a str,
    pub method: &'a str,
    pub route: &'a str,
    pub fingerprint: &'a Fingerprint,
    pub lease_token: String,
    pub locked_until: Timestamp,
    pub now: Timestamp,
}

/// Binds $1–$7, what every claim writes first: key, account, principal, request.
macro_rules! bind_new {
    ($query:expr, $new:expr) => {
        $query
            .bind($new.account_id)
            .bind($new.key.as_str())
            .bind(&$new.operation_id)
            .bind($new.principal_id)
            .bind($new.method)
            .bind($new.route)
            .bind($new.fingerprint.as_str())
    };
}

/// Claims the key under a lease. `None`: the key is taken, nothing was written, and `tx` must be
/// rolled back.
pub async fn claim(tx: &mut Tx, new: &NewOperation<'_>) -> Result<Option<OperationRecord>, sqlx::Error> {
    const SQL: &str = concat!(
        "INSERT INTO idempotency_operations \
         (account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state, \
          lease_token, locked_until, attempts, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'in_progress', $8, $9, 1, $10, $10) \
         RETURNING ",
        columns!()
    );
    let row = on_tx!(tx, |conn| {
        bind_new!(sqlx::query_as::<_, OperationRow>(SQL), new)
            .bind(&new.lease_token)
            .bind(new.locked_until)
            .bind(new.now)
            .fetch_one(conn)
            .await
    });
    unless_taken(row)?.map(OperationRecord::try_from).transpose()
}

/// A claim is a plain insert, and the key's own unique violation is its "taken" (docs/design.md §2,
/// §13); PostgreSQL then refuses the transaction's further statements, so the caller rolls back.
fn unless_taken<T>(inserted: Result<T, sqlx::Error>) -> Result<Option<T>, sqlx::Error> {
    match inserted {
        Err(sqlx::Error::Database(e)) if is_the_key(&*e) => Ok(None),
        inserted => inserted.map(Some),
    }
}

/// The operations' primary key, not another: by each partition's name on PostgreSQL
/// (`idempotency_operations_3_pkey`), by its columns on SQLite, which names no constraint.
fn is_the_key(e: &dyn DatabaseError) -> bool {
    e.is_unique_violation()
        && match e.constraint() {
            Some(name) => name.starts_with("idempotency_operations") && name.ends_with("_pkey"),
            None => e.message().contains("idempotency_operations.idempotency_key"),
        }
}

/// [`claim_finished`]'s insert: $1–$7 by `bind_new!`, $8–$17 by `bind_completion!`.
const CLAIM_FINISHED_SQL: &str = "INSERT INTO idempotency_operations \
     (account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state, attempts, \
      response_status, response_content_type, response_location, response_body, \
      resource_type, resource_id, resource_url, external_ref, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1, $9, $10, $11, $12, $13, $14, $15, $16, $17, $17)";

/// Claims the key with the operation finished, in its effect's transaction
/// ([`ClaimMode::InTransaction`](crate::ClaimMode)), and journals it there.
/// `false`: the key is taken, nothing was written, and the caller must roll its effect back.
pub async fn claim_finished(
    tx: &mut Tx,
    new: &NewOperation<'_>,
    completion: &Completion<'_>,
    attempted_at: Timestamp,
    sink: &dyn Sink,
) -> Result<bool, sqlx::Error> {
    let journaled = match completion.state {
        OperationState::Completed => vec![new.audit(AuditEvent::Completed, completion.now).by_attempt(1)],
        OperationState::Failed => vec![new.audit(AuditEvent::Failed, completion.now).by_attempt(1)],
        _ => vec![
            new.audit(AuditEvent::Attempted, attempted_at),
            new.audit(AuditEvent::Claimed, completion.now),
        ],
    };
    if sink.reads_the_inbox() {
        // one call: a write transaction holds its locks (SQLite's one writer)
        // across every call. The entries go in only if the claim did.
        let sql = claim_journaled(tx, journaled.len());
        let written = on_tx!(tx, |conn| {
            let query = bind_completion!(bind_new!(sqlx::query(sql), new), completion);
            bind_records!(query, &journaled).execute(conn).await.map(drop)
        });
        return Ok(unless_taken(written)?.is_some());
    }
    let claimed = on_tx!(tx, |conn| {
        bind_completion!(bind_new!(sqlx::query(CLAIM_FINISHED_SQL), new), completion)
            .execute(conn)
            .await
            .map(drop)
    });
    let claimed = unless_taken(claimed)?.is_some();
    if claimed {
        sink.record(tx, &journaled).await?;
    }
    Ok(claimed)
}

/// [`claim_finished`]'s insert and its `records` (1 or 2) journal records' inbox rows as one call,
/// for `tx`'s backend. Every create sends one, so each of the four texts is built once.
fn claim_journaled(tx: &Tx, records: usize) -> &'static str {
    static TEXTS: LazyLock<[[String; 2]; 2]> = LazyLock::new(|| {
        let text = |postgres: bool, records: usize| {
            let entries = format!(
                "{INBOX_INSERT} SELECT * FROM (VALUES {}) AS journaled",
                placeholders(18, records, INBOX_COLUMNS)
            );
            if postgres {
                // read, so that the claim runs first: a taken key writes no entry before it fails
                format!(
                    "WITH claimed AS ({CLAIM_FINISHED_SQL} RETURNING 1) {entries} WHERE EXISTS (SELECT 1 FROM claimed)"
                )
            } else {
                // no writable CTE: a second statement, which sqlx runs only if the first succeeded
                format!("{CLAIM_FINISHED_SQL}; {entries}")
            }
        };
        [[text(true, 1), text(true, 2)], [text(false, 1), text(false, 2)]]
    });
    let backend = usize::from(matches!(tx, Tx::Sqlite(_)));
    &TEXTS[backend][records - 1]
}

/// Claims the key as `awaiting_approval`, its answer the 202 approval request.
/// `false`: the key is taken, nothing was written, and `tx` must be rolled back.
pub async fn claim_awaiting_approval(
    tx: &mut Tx,
    new: &NewOperation<'_>,
    answer: &StoredResponse,
    approval_id: &str,
) -> Result<bool, sqlx::Error> {
    const SQL: &str = "INSERT INTO idempotency_operations \
         (account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state, attempts, \
          response_status, response_content_type, response_location, response_body, approval_id, \
          created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'awaiting_approval', 1, $8, $9, $10, $11, $12, $13, $13)";
    let inserted = on_tx!(tx, |conn| {
        bind_new!(sqlx::query(SQL), new)
            .bind(i32::from(answer.status.as_u16()))
            .bind(&answer.content_type)
            .bind(answer.location.as_deref())
            .bind(&answer.body)
            .bind(approval_id)
            .bind(new.now)
            .execute(conn)
            .await
            .map(drop)
    });
    Ok(unless_taken(inserted)?.is_some())
}

impl NewOperation<'_> {
    /// Who this operation is.
    pub fn identity(&self) -> OperationIdentity<'_> {
        OperationIdentity {
            account_id: self.account_id,
            operation_id: &self.operation_id,
            idempotency_key: self.key.as_str(),
            fingerprint: self.fingerprint.as_str(),
            route: self.route,
        }
    }

    /// A journal record of this operation, by the principal claiming it.
    pub fn audit(&self, event: AuditEvent, at: Timestamp) -> Record {
        self.identity().audit(event, self.principal_id, None, at)
    }
}

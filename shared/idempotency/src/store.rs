//! The operations table, on both backends. Every statement here is the one
//! place its rule is enforced: the claim by the primary key, the takeover and
//! the completion by compare-and-set on the lease.

use axum::http::StatusCode;
use platform::{Db, Timestamp, Tx, on_pool, on_tx};
use sqlx::Row;

use crate::{
    audit::{self, AuditEvent, Record},
    fingerprint::Fingerprint,
    key::IdempotencyKey,
    operation::{OperationRecord, OperationState, ResourceRef, StoredResponse},
};

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

/// Every column, in the order `decode` reads them by name.
macro_rules! columns {
    () => {
        "account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state, \
     lease_token, locked_until, attempts, response_status, response_content_type, response_location, response_body, \
     resource_type, resource_id, resource_url, external_ref, approval_id, created_at, updated_at"
    };
}

/// Claims the key: one insert under the primary key. `None` means the key
/// already names an operation; nothing was written.
pub async fn claim(tx: &mut Tx, new: &NewOperation<'_>) -> Result<Option<OperationRecord>, sqlx::Error> {
    const SQL: &str = concat!(
        "INSERT INTO idempotency_operations \
         (account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state, \
          lease_token, locked_until, attempts, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'in_progress', $8, $9, 1, $10, $10) \
         ON CONFLICT (account_id, idempotency_key) DO NOTHING \
         RETURNING ",
        columns!()
    );
    let row = on_tx!(tx, |conn| {
        sqlx::query(SQL)
            .bind(new.account_id)
            .bind(new.key.as_str())
            .bind(&new.operation_id)
            .bind(new.principal_id)
            .bind(new.method)
            .bind(new.route)
            .bind(new.fingerprint.as_str())
            .bind(&new.lease_token)
            .bind(new.locked_until)
            .bind(new.now)
            .fetch_optional(conn)
            .await?
            .map(|row| decode(&row))
            .transpose()?
    });
    Ok(row)
}

/// Adds `n` requests to an operation's `attempts`, with relaxed durability
/// (see [`AttemptCounter`](crate::attempts::AttemptCounter)).
pub async fn add_attempts(db: &Db, account_id: &str, key: &str, n: i32) -> Result<(), sqlx::Error> {
    on_pool!(db.write_relaxed(), |pool| {
        sqlx::query(
            "UPDATE idempotency_operations SET attempts = attempts + $3 WHERE account_id = $1 AND idempotency_key = $2",
        )
        .bind(account_id)
        .bind(key)
        .bind(n)
        .execute(pool)
        .await?;
    });
    Ok(())
}

/// Takes over an operation whose lease has run out: compare-and-set on the
/// old lease token and its expiry, so of two racing takers exactly one wins.
pub async fn take_over(
    tx: &mut Tx,
    operation: &OperationRecord,
    new_token: &str,
    locked_until: Timestamp,
    now: Timestamp,
) -> Result<Option<OperationRecord>, sqlx::Error> {
    const SQL: &str = concat!(
        "UPDATE idempotency_operations SET lease_token = $3, locked_until = $4, updated_at = $5 \
         WHERE account_id = $1 AND idempotency_key = $2 AND state = 'in_progress' \
           AND lease_token = $6 AND locked_until <= $5 \
         RETURNING ",
        columns!()
    );
    Ok(on_tx!(tx, |conn| {
        sqlx::query(SQL)
            .bind(&operation.account_id)
            .bind(operation.key.as_str())
            .bind(new_token)
            .bind(locked_until)
            .bind(now)
            .bind(operation.lease_token.as_deref().unwrap_or(""))
            .fetch_optional(conn)
            .await?
            .map(|row| decode(&row))
            .transpose()?
    }))
}

/// Starts an approved operation: `awaiting_approval` → `in_progress` under a
/// new lease, compare-and-set on the state, so of two racing retries exactly
/// one runs it.
pub async fn start_approved(
    tx: &mut Tx,
    operation: &OperationRecord,
    token: &str,
    locked_until: Timestamp,
    now: Timestamp,
) -> Result<Option<OperationRecord>, sqlx::Error> {
    const SQL: &str = concat!(
        "UPDATE idempotency_operations SET state = 'in_progress', lease_token = $3, locked_until = $4, updated_at = $5 \
         WHERE account_id = $1 AND idempotency_key = $2 AND state = 'awaiting_approval' \
         RETURNING ",
        columns!()
    );
    Ok(on_tx!(tx, |conn| {
        sqlx::query(SQL)
            .bind(&operation.account_id)
            .bind(operation.key.as_str())
            .bind(token)
            .bind(locked_until)
            .bind(now)
            .fetch_optional(conn)
            .await?
            .map(|row| decode(&row))
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

macro_rules! bind_completion {
    ($query:expr, $account:expr, $key:expr, $token:expr, $c:expr) => {
        $query
            .bind($account)
            .bind($key.as_str())
            .bind($token)
            .bind($c.state.as_str())
            .bind(i32::from($c.response.status.as_u16()))
            .bind(&$c.response.content_type)
            .bind($c.response.location.as_deref())
            .bind(&$c.response.body)
            .bind($c.resource.map(|r| r.kind.as_str()))
            .bind($c.resource.map(|r| r.id.as_str()))
            .bind($c.resource.map(|r| r.url.as_str()))
            .bind($c.external_ref)
            .bind($c.now)
    };
}

/// Finishes the operation inside the transaction of its effect, if this
/// attempt still holds the lease. `false`: the lease was lost, and the caller
/// must roll the effect back.
pub async fn complete(
    tx: &mut Tx,
    account_id: &str,
    key: &IdempotencyKey,
    lease_token: &str,
    completion: &Completion<'_>,
) -> Result<bool, sqlx::Error> {
    let done = on_tx!(tx, |conn| {
        bind_completion!(sqlx::query(COMPLETE_SQL), account_id, key, lease_token, completion)
            .execute(conn)
            .await?
            .rows_affected()
    });
    Ok(done == 1)
}

/// Moves an operation whose work went to the outbox — it answered, and
/// holds no lease — to how that work ended: `completed` with the external
/// system's reference, `failed`, or `unknown`. The stored answer stays the
/// first one given. `false`: the operation is not waiting for a delivery.
pub async fn settle_external(
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    state: OperationState,
    external_ref: Option<&str>,
    now: Timestamp,
) -> Result<bool, sqlx::Error> {
    let done = on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE idempotency_operations SET state = $3, external_ref = COALESCE($4, external_ref), updated_at = $5 \
             WHERE account_id = $1 AND operation_id = $2 AND lease_token IS NULL \
               AND response_status IS NOT NULL AND state IN ('in_progress', 'unknown')",
        )
        .bind(account_id)
        .bind(operation_id)
        .bind(state.as_str())
        .bind(external_ref)
        .bind(now)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(done == 1)
}

/// Ends an operation that waits for its approval (a rejection, an expiry).
/// `false`: it was not waiting any more.
pub async fn settle_awaiting(
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    completion: &Completion<'_>,
) -> Result<bool, sqlx::Error> {
    let done = on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE idempotency_operations SET state = $3, response_status = $4, response_content_type = $5, \
             response_location = $6, response_body = $7, updated_at = $8 \
             WHERE account_id = $1 AND operation_id = $2 AND state = 'awaiting_approval'",
        )
        .bind(account_id)
        .bind(operation_id)
        .bind(completion.state.as_str())
        .bind(i32::from(completion.response.status.as_u16()))
        .bind(&completion.response.content_type)
        .bind(completion.response.location.as_deref())
        .bind(&completion.response.body)
        .bind(completion.now)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(done == 1)
}

/// PostgreSQL's claim of [`claim_finished`], binding $1–$17 as [`bind_claim_finished!`]
/// does (its journal records follow, in the inbox).
const CLAIM_FINISHED_SQL: &str = "INSERT INTO idempotency_operations \
     (account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state, attempts, \
      response_status, response_content_type, response_location, response_body, \
      resource_type, resource_id, resource_url, external_ref, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1, $9, $10, $11, $12, $13, $14, $15, $16, $17, $17) \
     ON CONFLICT (account_id, idempotency_key) DO NOTHING";

/// SQLite's claim of [`claim_finished`]: the same, and what its journal
/// entries say that the row does not ($18: when the attempt started; the
/// state it was claimed in, $8, which stays while `state` moves on).
const CLAIM_FINISHED_SQLITE: &str = "INSERT INTO idempotency_operations \
     (account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state, attempts, \
      response_status, response_content_type, response_location, response_body, \
      resource_type, resource_id, resource_url, external_ref, created_at, updated_at, attempted_at, claimed_state) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1, $9, $10, $11, $12, $13, $14, $15, $16, $17, $17, $18, $8) \
     ON CONFLICT (account_id, idempotency_key) DO NOTHING";

macro_rules! bind_claim_finished {
    ($query:expr, $new:expr, $c:expr) => {
        $query
            .bind($new.account_id)
            .bind($new.key.as_str())
            .bind(&$new.operation_id)
            .bind($new.principal_id)
            .bind($new.method)
            .bind($new.route)
            .bind($new.fingerprint.as_str())
            .bind($c.state.as_str())
            .bind(i32::from($c.response.status.as_u16()))
            .bind(&$c.response.content_type)
            .bind($c.response.location.as_deref())
            .bind(&$c.response.body)
            .bind($c.resource.map(|r| r.kind.as_str()))
            .bind($c.resource.map(|r| r.id.as_str()))
            .bind($c.resource.map(|r| r.url.as_str()))
            .bind($c.external_ref)
            .bind($c.now)
    };
}

/// Claims the key with the operation already finished, inside the
/// transaction of its effect ([`ClaimMode::InTransaction`](crate::ClaimMode)),
/// and journals the claim ([`audit::finished_claim`]: the attempt that
/// started at `attempted_at`, the claim, its outcome) with it: one insert
/// under the primary key carries the claim and the answer. `false`: another
/// attempt holds the key (PostgreSQL waited for it to commit), nothing was
/// written, and the caller must roll its effect back. The lease fields of
/// `new` are not used: a claim that finishes in its own transaction is never
/// seen running.
///
/// The claim and its journal records travel in *one* round trip, because
/// every round trip inside a write transaction is time the transaction holds
/// its locks (on SQLite, the one writer):
/// - PostgreSQL: a writable CTE puts the records in the inbox (see
///   [`audit::record`]) if the claim inserted its row;
/// - SQLite: the row itself keeps what they say, and the chain round makes
///   them from it (see [`audit::finished_claim`] for why).
pub async fn claim_finished(
    tx: &mut Tx,
    new: &NewOperation<'_>,
    completion: &Completion<'_>,
    attempted_at: Timestamp,
) -> Result<bool, sqlx::Error> {
    let written = match tx {
        Tx::Postgres(pg) => {
            let journaled = audit::finished_claim(
                |event, at| new.audit(event, at),
                attempted_at,
                completion.now,
                completion.state,
            );
            let (inbox, values) = (
                audit::INBOX_INSERT,
                audit::placeholders(18, journaled.len(), audit::INBOX_COLUMNS),
            );
            let sql = format!(
                "WITH claimed AS ({CLAIM_FINISHED_SQL} RETURNING 1) \
                 {inbox} SELECT * FROM (VALUES {values}) AS journaled WHERE EXISTS (SELECT 1 FROM claimed)"
            );
            let query = bind_claim_finished!(sqlx::query(sqlx::AssertSqlSafe(sql.as_str())), new, completion);
            audit::bind_records!(query, &journaled)
                .execute(&mut **pg)
                .await?
                .rows_affected()
        }
        Tx::Sqlite(lite) => bind_claim_finished!(sqlx::query(CLAIM_FINISHED_SQLITE), new, completion)
            .bind(attempted_at)
            .execute(&mut **lite)
            .await?
            .rows_affected(),
    };
    Ok(written > 0)
}

/// Claims the key for an operation that waits for a human: stored as
/// `awaiting_approval` with its 202 answer (the approval request) and the
/// approval's id. `false`: the key is taken, nothing was written.
pub async fn claim_awaiting_approval(
    tx: &mut Tx,
    new: &NewOperation<'_>,
    answer: &StoredResponse,
    approval_id: &str,
) -> Result<bool, sqlx::Error> {
    let inserted = on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO idempotency_operations \
             (account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state, attempts, \
              response_status, response_content_type, response_location, response_body, approval_id, \
              created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'awaiting_approval', 1, $8, $9, $10, $11, $12, $13, $13) \
             ON CONFLICT (account_id, idempotency_key) DO NOTHING",
        )
        .bind(new.account_id)
        .bind(new.key.as_str())
        .bind(&new.operation_id)
        .bind(new.principal_id)
        .bind(new.method)
        .bind(new.route)
        .bind(new.fingerprint.as_str())
        .bind(i32::from(answer.status.as_u16()))
        .bind(&answer.content_type)
        .bind(answer.location.as_deref())
        .bind(&answer.body)
        .bind(approval_id)
        .bind(new.now)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(inserted == 1)
}

/// Gives an operation back after a server error: nothing happened. A plain
/// operation is forgotten, so the next attempt claims afresh; one bound to an
/// approval goes back to `awaiting_approval`, keeping its approval for the
/// next retry. `false`: the lease was lost.
pub async fn release(tx: &mut Tx, operation: &OperationRecord, lease_token: &str) -> Result<bool, sqlx::Error> {
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

pub async fn find_by_key(db: &Db, account_id: &str, key: &str) -> Result<Option<OperationRecord>, sqlx::Error> {
    const SQL: &str = concat!(
        "SELECT ",
        columns!(),
        " FROM idempotency_operations WHERE account_id = $1 AND idempotency_key = $2"
    );
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query(SQL)
            .bind(account_id)
            .bind(key)
            .fetch_optional(pool)
            .await?
            .map(|row| decode(&row))
            .transpose()?
    }))
}

pub async fn find_by_id(db: &Db, account_id: &str, operation_id: &str) -> Result<Option<OperationRecord>, sqlx::Error> {
    const SQL: &str = concat!(
        "SELECT ",
        columns!(),
        " FROM idempotency_operations WHERE account_id = $1 AND operation_id = $2"
    );
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query(SQL)
            .bind(account_id)
            .bind(operation_id)
            .fetch_optional(pool)
            .await?
            .map(|row| decode(&row))
            .transpose()?
    }))
}

/// Deletes finished operations last touched before `cutoff`. Operations
/// `in_progress`, `awaiting_approval` or `unknown` are never reaped.
pub async fn reap(db: &Db, cutoff: Timestamp) -> Result<u64, sqlx::Error> {
    // Operation ids are UUIDv7, which sort by creation time, and an operation
    // finishes after it is created: every operation finished before `cutoff`
    // has an id below the first id of `cutoff`'s millisecond. So the reaper
    // walks the operation_id index up to there, and no index of its own costs
    // every write an entry.
    //
    // On SQLite an operation whose claim the journal has not linked yet (above
    // the chain round's mark) keeps its row: the row is what its entries are
    // made from (see `audit::finished_claim`).
    let sql = match db.backend() {
        platform::Backend::Postgres => {
            "DELETE FROM idempotency_operations \
             WHERE operation_id < $1 AND state IN ('completed', 'failed', 'rejected') AND updated_at < $2"
        }
        platform::Backend::Sqlite => {
            "DELETE FROM idempotency_operations \
             WHERE operation_id < $1 AND state IN ('completed', 'failed', 'rejected') AND updated_at < $2 \
               AND seq <= (SELECT operations_seq FROM audit_progress)"
        }
    };
    Ok(on_pool!(db.write(), |pool| {
        sqlx::query(sql)
            .bind(crate::operation::first_operation_id_at(cutoff))
            .bind(cutoff)
            .execute(pool)
            .await?
            .rows_affected()
    }))
}

fn decode<R>(row: &R) -> Result<OperationRecord, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i32>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<Vec<u8>>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<Timestamp>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let corrupt = |what: &str| sqlx::Error::Decode(format!("idempotency_operations: {what}").into());
    let state: String = row.try_get("state")?;
    let state = OperationState::parse(&state).ok_or_else(|| corrupt("unknown state"))?;
    let key: String = row.try_get("idempotency_key")?;
    // stored unquoted: parsing it again would unquote a key that begins with `"`
    let key = IdempotencyKey::from_stored(key);
    let response = match (
        row.try_get::<Option<i32>, _>("response_status")?,
        row.try_get::<Option<Vec<u8>>, _>("response_body")?,
    ) {
        (Some(status), Some(body)) => Some(StoredResponse {
            status: u16::try_from(status)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or_else(|| corrupt("invalid status"))?,
            content_type: row
                .try_get::<Option<String>, _>("response_content_type")?
                .unwrap_or_else(|| "application/json".into()),
            location: row.try_get("response_location")?,
            body,
        }),
        _ => None,
    };
    let resource = match (
        row.try_get::<Option<String>, _>("resource_type")?,
        row.try_get::<Option<String>, _>("resource_id")?,
        row.try_get::<Option<String>, _>("resource_url")?,
    ) {
        (Some(kind), Some(id), Some(url)) => Some(ResourceRef { kind, id, url }),
        _ => None,
    };
    Ok(OperationRecord {
        account_id: row.try_get("account_id")?,
        key,
        operation_id: row.try_get("operation_id")?,
        principal_id: row.try_get("principal_id")?,
        method: row.try_get("method")?,
        route: row.try_get("route")?,
        fingerprint: Fingerprint::from_stored(row.try_get("fingerprint")?),
        state,
        lease_token: row.try_get("lease_token")?,
        locked_until: row.try_get("locked_until")?,
        attempts: row.try_get("attempts")?,
        response,
        resource,
        external_ref: row.try_get("external_ref")?,
        approval_id: row.try_get("approval_id")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

impl NewOperation<'_> {
    /// Who an outbox event of this operation belongs to.
    pub(crate) fn event_of(&self) -> crate::outbox::EventOf<'_> {
        crate::outbox::EventOf {
            account_id: self.account_id,
            operation_id: &self.operation_id,
            idempotency_key: self.key.as_str(),
            fingerprint: self.fingerprint.as_str(),
            route: self.route,
        }
    }

    /// An audit record of this operation, by the principal claiming it.
    pub fn audit(&self, event: AuditEvent, at: Timestamp) -> Record {
        Record {
            account_id: self.account_id.to_owned(),
            principal_id: self.principal_id.to_owned(),
            operation_id: Some(self.operation_id.clone()),
            idempotency_key: Some(self.key.as_str().to_owned()),
            fingerprint: Some(self.fingerprint.as_str().to_owned()),
            route: Some(self.route.to_owned()),
            event,
            external_ref: None,
            at,
            change: None,
        }
    }
}

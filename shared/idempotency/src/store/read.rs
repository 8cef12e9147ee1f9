//! Reading an operation, by its key or by its id, and decoding a row on
//! either backend; and the attempt count a status read shows, written apart
//! from the claim with relaxed durability.

use axum::http::StatusCode;
use platform::{Db, Timestamp, on_pool};
use sqlx::Row;

use crate::{
    fingerprint::Fingerprint,
    key::IdempotencyKey,
    operation::{OperationRecord, OperationState, ResourceRef, StoredResponse},
};

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

pub(super) fn decode<R>(row: &R) -> Result<OperationRecord, sqlx::Error>
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

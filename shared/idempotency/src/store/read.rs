//! Reading an operation by its key or its id, and writing its attempt count.

use platform::{Db, on_pool};

use super::row::OperationRow;
use crate::operation::OperationRecord;

pub async fn find_by_key(db: &Db, account_id: &str, key: &str) -> Result<Option<OperationRecord>, sqlx::Error> {
    const SQL: &str = concat!(
        "SELECT ",
        columns!(),
        " FROM idempotency_operations WHERE account_id = $1 AND idempotency_key = $2"
    );
    find(db, SQL, account_id, key).await
}

pub async fn find_by_id(db: &Db, account_id: &str, operation_id: &str) -> Result<Option<OperationRecord>, sqlx::Error> {
    const SQL: &str = concat!(
        "SELECT ",
        columns!(),
        " FROM idempotency_operations WHERE account_id = $1 AND operation_id = $2"
    );
    find(db, SQL, account_id, operation_id).await
}

/// The operation `sql` finds in the account by `$2`.
async fn find(db: &Db, sql: &'static str, account_id: &str, by: &str) -> Result<Option<OperationRecord>, sqlx::Error> {
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query_as::<_, OperationRow>(sql)
            .bind(account_id)
            .bind(by)
            .fetch_optional(pool)
            .await?
            .map(OperationRecord::try_from)
            .transpose()?
    }))
}

/// Adds `n` to an operation's `attempts`, with relaxed durability
/// ([`AttemptCounter`](crate::attempts::AttemptCounter)).
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

//! Reading one account's rows: one by its ids, or a page of a list. Every
//! resource's get and list is one of these two, so each service writes only
//! its statement and its row type.
//!
//! The statement takes the account as `$1` and names it in its `WHERE`: a
//! read never reaches another account's rows. The row type is decoded with
//! `sqlx::FromRow` on either backend.

use sqlx::{FromRow, Row, postgres::PgRow, sqlite::SqliteRow};

use crate::{
    db::Db,
    error::ApiError,
    on_pool,
    page::{Page, PageRequest, number_new_rows},
};

/// A row type read the same way on PostgreSQL and SQLite.
pub trait AnyRow: for<'r> FromRow<'r, PgRow> + for<'r> FromRow<'r, SqliteRow> + Send + Unpin {}

impl<T> AnyRow for T where T: for<'r> FromRow<'r, PgRow> + for<'r> FromRow<'r, SqliteRow> + Send + Unpin {}

/// The account's row that `sql` selects with `account_id = $1` and `ids` as
/// `$2`, `$3`…; `None` if it has none.
pub async fn get<T: AnyRow>(db: &Db, sql: &'static str, account_id: &str, ids: &[&str]) -> Result<Option<T>, ApiError> {
    debug_assert!(sql.contains("account_id = $1"), "a read is scoped by account");
    Ok(on_pool!(db.read(), |pool| {
        let mut query = sqlx::query_as(sql).bind(account_id);
        for id in ids {
            query = query.bind(*id);
        }
        query.fetch_optional(pool).await?
    }))
}

/// One page of `table`'s rows of the account, in list order (see
/// [`crate::page`]). `sql` selects `list_seq` and the row's columns with
/// `account_id = $1`, the `filters` as `$2`, `$3`… (`NULL` for a filter not
/// given), then `list_seq > $n ORDER BY list_seq LIMIT $n+1` for the page.
pub async fn list<T: AnyRow>(
    db: &Db,
    table: &'static str,
    sql: &'static str,
    account_id: &str,
    filters: &[Option<&str>],
    page: PageRequest,
) -> Result<Page<T>, ApiError> {
    debug_assert!(sql.contains("account_id = $1"), "a list is scoped by account");
    number_new_rows(db, table, account_id).await?;
    let rows: Vec<Listed<T>> = on_pool!(db.read(), |pool| {
        let mut query = sqlx::query_as(sql).bind(account_id);
        for filter in filters {
            query = query.bind(*filter);
        }
        query
            .bind(page.after_seq)
            .bind(page.fetch_limit())
            .fetch_all(pool)
            .await?
    });
    Ok(Page::from_rows(
        rows.into_iter().map(|row| (row.0, row.1)).collect(),
        page,
    ))
}

/// A listed row with its place in the list.
struct Listed<T>(i64, T);

impl<'r, R, T> FromRow<'r, R> for Listed<T>
where
    R: Row,
    T: FromRow<'r, R>,
    &'static str: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        Ok(Listed(row.try_get("list_seq")?, T::from_row(row)?))
    }
}

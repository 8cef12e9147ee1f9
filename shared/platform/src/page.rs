//! Cursor pagination (docs/contract.md §10): `limit` (default 50, at most 200)
//! and an opaque `cursor`; answers are
//! `{"data": [...], "next_cursor": string | null}` in the order rows were
//! placed in the list (below).
//!
//! # Why a list has its own numbers
//!
//! A cursor is "after the row numbered N", so a row must never get a number
//! below one a reader has already passed. A row's `seq` cannot promise that
//! on PostgreSQL: it is taken at insert, and a transaction that took 10 may
//! commit after one that took 11 and a reader that went past 11 in between.
//! So listed rows carry a second number, `list_seq`, given once a row has
//! committed: a reader first numbers the account's rows that have none
//! ([`number_new_rows`]), under a transaction-scoped lock, in one
//! transaction per round. A row committed after a round is numbered by a
//! later round, above everything numbered before; and a reader that sees a
//! round's numbers sees every earlier round's. SQLite has one writer, so
//! the order is the same there, and the same statements run on both.

use crate::db::{Db, Tx};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use serde::Serialize;

use crate::error::ApiError;

pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 200;

/// A validated page request: rows after `after_seq`, at most `limit` of them.
#[derive(Debug, Clone, Copy)]
pub struct PageRequest {
    pub after_seq: i64,
    pub limit: i64,
}

impl PageRequest {
    pub fn parse(limit: Option<i64>, cursor: Option<&str>) -> Result<Self, ApiError> {
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(ApiError::invalid_field("limit", format!("must be 1 to {MAX_LIMIT}")));
        }
        let after_seq = match cursor {
            None | Some("") => 0,
            Some(cursor) => decode_cursor(cursor)
                .ok_or_else(|| ApiError::invalid_field("cursor", "is not a cursor this API gave out"))?,
        };
        Ok(PageRequest { after_seq, limit })
    }

    /// How many rows to fetch: one more than the page, to know if another follows.
    pub fn fetch_limit(&self) -> i64 {
        self.limit + 1
    }
}

/// One page of a list.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Page<T> {
    pub data: Vec<T>,
    /// Pass as `cursor` to get the next page; `null` on the last one.
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// The cursor that continues after the row numbered `seq`.
    pub fn cursor_after(seq: i64) -> String {
        encode_cursor(seq)
    }

    /// Builds a page from rows fetched with [`PageRequest::fetch_limit`], each with its sequence number.
    pub fn from_rows(mut rows: Vec<(i64, T)>, request: PageRequest) -> Self {
        let more = rows.len() as i64 > request.limit;
        rows.truncate(request.limit as usize);
        let next_cursor = more.then(|| rows.last().map(|(seq, _)| encode_cursor(*seq))).flatten();
        Page {
            data: rows.into_iter().map(|(_, item)| item).collect(),
            next_cursor,
        }
    }
}

/// Numbers the committed rows of `table` of `account_id` that have no
/// `list_seq` yet (by `seq`, among themselves), after the account's highest: what [`PageRequest`]'s
/// cursors count. `table` is one of the service's listed tables (a name
/// written in its code, never input); it has `seq`, `account_id` and
/// `list_seq`, and a unique index on `(account_id, list_seq)`.
pub async fn number_new_rows(db: &Db, table: &'static str, account_id: &str) -> Result<(), sqlx::Error> {
    // most lists find nothing to number: ask the read pool before taking a writer
    let unnumbered = format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE account_id = $1 AND list_seq IS NULL)");
    let waiting: bool = crate::on_pool!(db.read(), |pool| sqlx::query_scalar(sqlx::AssertSqlSafe(
        unnumbered.as_str()
    ))
    .bind(account_id)
    .fetch_one(pool)
    .await?);
    if !waiting {
        return Ok(());
    }
    let number = format!(
        "UPDATE {table} SET list_seq = numbered.list_seq \
         FROM (SELECT seq, (SELECT COALESCE(MAX(list_seq), 0) FROM {table} WHERE account_id = $1) \
                           + ROW_NUMBER() OVER (ORDER BY seq) AS list_seq \
               FROM {table} WHERE account_id = $1 AND list_seq IS NULL) AS numbered \
         WHERE {table}.account_id = $1 AND {table}.seq = numbered.seq"
    );
    let mut tx = db.begin().await?;
    if let Tx::Postgres(pg) = &mut tx {
        // one round per list at a time; released at commit, so the next round sees this one's numbers
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))")
            .bind(table)
            .bind(account_id)
            .execute(&mut **pg)
            .await?;
    }
    crate::on_tx!(&mut tx, |conn| sqlx::query(sqlx::AssertSqlSafe(number.as_str()))
        .bind(account_id)
        .execute(conn)
        .await?
        .rows_affected());
    tx.commit().await
}

fn encode_cursor(seq: i64) -> String {
    URL_SAFE_NO_PAD.encode(format!("after:{seq}"))
}

fn decode_cursor(cursor: &str) -> Option<i64> {
    let bytes = URL_SAFE_NO_PAD.decode(cursor).ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    text.strip_prefix("after:")?.parse().ok().filter(|seq: &i64| *seq >= 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_given_out_reads_back_and_a_forged_one_is_refused() {
        assert_eq!(decode_cursor(&encode_cursor(42)), Some(42));
        assert!(PageRequest::parse(None, Some("not-a-cursor")).is_err());
        assert!(PageRequest::parse(Some(201), None).is_err());
        assert!(PageRequest::parse(Some(0), None).is_err());
        assert_eq!(PageRequest::parse(None, None).unwrap().limit, 50);
    }
}

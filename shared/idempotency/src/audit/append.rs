//! Writing entries onto the chain: under the chain's lock (PostgreSQL's
//! advisory lock, SQLite's one writer), read the head, link, insert.

use platform::{Db, Tx, on_tx};

use super::chain::{AuditEntry, GENESIS, Record, chained};

/// Serialises appenders on PostgreSQL (`pg_advisory_xact_lock`); any constant
/// that no other part of the database uses.
const CHAIN_LOCK: i64 = 0x0a0d_1700_c4a1;

/// Appends `records` to the chain inside `tx`, in the order given: each
/// entry's `prev_hash` is the hash of the one before. Appenders are
/// serialised (PostgreSQL: an advisory lock held to the end of `tx`;
/// SQLite: its one writer), and the database refuses a fork even if they
/// were not.
pub async fn append(tx: &mut Tx, records: &[Record]) -> Result<Vec<AuditEntry>, sqlx::Error> {
    lock_chain(tx).await?;
    append_locked(tx, records).await
}

/// Appends `records` in a transaction of their own.
pub async fn append_now(db: &Db, records: &[Record]) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let entries = append(&mut tx, records).await?;
    tx.commit().await?;
    Ok(entries)
}

pub(super) async fn lock_chain(tx: &mut Tx) -> Result<(), sqlx::Error> {
    if let Tx::Postgres(pg) = tx {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(CHAIN_LOCK)
            .execute(&mut **pg)
            .await?;
    }
    Ok(())
}

pub(crate) async fn append_locked(tx: &mut Tx, records: &[Record]) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let head = head_or_genesis(on_tx!(tx, |conn| sqlx::query_as(HEAD).fetch_optional(conn).await?));
    let entries = chained(head, records.to_vec());
    insert_entries(tx, &entries).await?;
    Ok(entries)
}

/// The chain's last entry, `(seq, hash)` (none while the chain is empty).
pub(super) const HEAD: &str = "SELECT seq, hash FROM audit_journal ORDER BY seq DESC LIMIT 1";

/// What the next entry follows: the last entry's `(seq, hash)`, or `(0, GENESIS)`.
pub(super) fn head_or_genesis(last: Option<(i64, String)>) -> (i64, String) {
    last.unwrap_or((0, GENESIS.to_owned()))
}

/// Entries per INSERT: a round after an outage may link many thousands, and
/// one statement of them all would hold parameters of that size.
const ENTRIES_PER_STATEMENT: usize = 2_000;

/// Appends `entries`, in order, a chunk a statement. A VALUES list would
/// bind a dozen parameters an entry, and binding them would cost more than
/// writing the rows, so each backend takes the chunk whole:
/// - PostgreSQL takes each column as one array parameter and zips them with
///   `unnest`: arrays travel in binary, so nothing is parsed;
/// - SQLite has no arrays: it takes one JSON array and reads it with
///   `jsonb_each`, whose elements are binary JSON, so each field is read
///   without parsing the element's text again.
///
/// The database checks each entry's link as it goes in.
pub(super) async fn insert_entries(tx: &mut Tx, entries: &[AuditEntry]) -> Result<(), sqlx::Error> {
    for chunk in entries.chunks(ENTRIES_PER_STATEMENT) {
        let inserted = match &mut *tx {
            Tx::Postgres(pg) => {
                let column = |field: fn(&AuditEntry) -> Option<&str>| chunk.iter().map(field).collect::<Vec<_>>();
                sqlx::query(
                    "INSERT INTO audit_journal (seq, account_id, principal_id, operation_id, idempotency_key, \
                     fingerprint, route, event, external_ref, at, prev_hash, hash, resource_type, resource_id, state) \
                     SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], \
                          $6::text[], $7::text[], $8::text[], $9::text[], $10::timestamptz[], $11::text[], $12::text[], \
                          $13::text[], $14::text[], $15::text[]) \
                     ORDER BY 1",
                )
                .bind(chunk.iter().map(|e| e.seq).collect::<Vec<_>>())
                .bind(column(|e| Some(&e.account_id)))
                .bind(column(|e| Some(&e.principal_id)))
                .bind(column(|e| e.operation_id.as_deref()))
                .bind(column(|e| e.idempotency_key.as_deref()))
                .bind(column(|e| e.fingerprint.as_deref()))
                .bind(column(|e| e.route.as_deref()))
                .bind(column(|e| Some(e.event.as_str())))
                .bind(column(|e| e.external_ref.as_deref()))
                .bind(chunk.iter().map(|e| e.at).collect::<Vec<_>>())
                .bind(column(|e| Some(&e.prev_hash)))
                .bind(column(|e| Some(&e.hash)))
                .bind(column(|e| e.resource_type.as_deref()))
                .bind(column(|e| e.resource_id.as_deref()))
                .bind(column(|e| e.state.as_deref()))
                .execute(&mut **pg)
                .await?
                .rows_affected()
            }
            Tx::Sqlite(lite) => sqlx::query(
                "INSERT INTO audit_journal (seq, account_id, principal_id, operation_id, idempotency_key, \
                 fingerprint, route, event, external_ref, at, prev_hash, hash, resource_type, resource_id, state) \
                 SELECT value->>'seq', value->>'account_id', value->>'principal_id', value->>'operation_id', \
                        value->>'idempotency_key', value->>'fingerprint', value->>'route', value->>'event', \
                        value->>'external_ref', value->>'at', value->>'prev_hash', value->>'hash', \
                        value->>'resource_type', value->>'resource_id', value->>'state' \
                 FROM jsonb_each($1) ORDER BY key",
            )
            .bind(serde_json::to_string(chunk).map_err(|e| sqlx::Error::Encode(e.into()))?)
            .execute(&mut **lite)
            .await?
            .rows_affected(),
        };
        if inserted != chunk.len() as u64 {
            // cannot happen: the database refuses the whole statement, or takes every entry
            return Err(sqlx::Error::Protocol(format!(
                "{} audit entries went in as {inserted}",
                chunk.len()
            )));
        }
    }
    Ok(())
}

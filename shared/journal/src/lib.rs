//! The audit journal (docs/contract.md §8): an append-only, hash-chained record
//! of what happened to every operation, one chain per service database.
//!
//! Each entry carries `prev_hash` and `hash = sha256(prev_hash ‖
//! canonical_json(entry))`, the entry being every field but `hash`. The
//! database refuses UPDATE, DELETE and TRUNCATE on the table (triggers), an
//! insert that would replace an entry (SQLite's `INSERT OR REPLACE`, an
//! upsert), and an entry whose `prev_hash` is not the hash of the entry
//! before it (`seq` is the primary key): no writer can fork the chain or
//! leave a gap in it.
//! Rounds of appends are serialised (PostgreSQL: an advisory lock held to
//! the end of the round's transaction; SQLite: its one writer).
//! [`verify`] checks a chain offline and names the first broken entry; a
//! [`Head`] pinned earlier (`GET /v1/audit/head`, the service's log) lets it
//! catch a cut tail too.
//!
//! How events reach the chain without serialising every write on it: see
//! [`Journal`] and docs/design.md §8.
//!
//! A service's layer reports to it as its sink
//! (`Idempotency::new(…).with_sink(Journal::default())`), mounts [`routes()`],
//! and the layer's background work links the chain. It depends on the
//! `idempotency` crate, never the reverse: the core knows only its
//! `transitions::Sink` and the inbox row (`transitions::inbox`) a transition
//! is written as. The journal's tables stay in the core's one migration set
//! (`migrations/idempotency`, `idempotency::MIGRATIONS`): a claim writes the
//! inbox in its own statement.
//!
//! The crate, file by file: `chain.rs` (the entries and their hashes, no
//! database: what the `audit` command verifies with), `inbox.rs` (what a
//! service journals itself), `chainer.rs` (the rounds that link them),
//! `query.rs` (reading it back), and `routes.rs` (`GET /v1/audit` and its head).

mod chain;
mod chainer;
mod inbox;
mod query;
pub mod routes;

pub use chain::*;
use chainer::log_unlinked;
pub use chainer::{CHAIN_LOCK, ChainError, Journal, OBSERVATIONS_HELD_AT_MOST, Round};
/// Writes transitions as inbox rows in their transaction (the core's).
pub use idempotency::transitions::inbox::record;
use idempotency::{BoxFuture, transitions::Sink};
pub use inbox::*;
use platform::{
    Db,
    metrics::{Metrics, names},
    on_pool,
};
pub use query::*;
pub use routes::routes;

/// The journal is the sink a service's layer reports to: a transition goes to
/// the inbox in its own transaction, an observation is held for a round.
impl Sink for Journal {
    fn record<'a>(&'a self, tx: &'a mut platform::Tx, records: &'a [Record]) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(record(tx, records))
    }

    fn observe<'a>(&'a self, db: &'a Db, record: Record) -> BoxFuture<'a, ()> {
        Box::pin(Journal::observe(self, db, record))
    }

    /// The chainer takes every record from the inbox.
    fn reads_the_inbox(&self) -> bool {
        true
    }

    /// The chainer: it logs the chain's head first, the head the service
    /// starts from, for operators to pin, and the one its rounds refuse to go
    /// behind; then it links what waits, round after round.
    fn keep(&self, db: Db, metrics: Metrics) -> Option<BoxFuture<'static, ()>> {
        let journal = self.clone();
        Some(Box::pin(async move {
            if let Some(head) = log_head(&db, "at start-up").await {
                journal.remember(head);
            }
            journal.chain_continuously(&db, &metrics).await
        }))
    }

    /// Links every event recorded or observed so far into the chain, so a
    /// read of the journal shows them. A failure is logged: the events wait
    /// for the next round.
    fn flush<'a>(&'a self, db: &'a Db, metrics: &'a Metrics) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.chain_pending(db, metrics).await {
                log_unlinked(&e);
            }
        })
    }

    /// The last round, then the chain's head, the last entry this process
    /// linked included.
    fn stop<'a>(&'a self, db: &'a Db, metrics: &'a Metrics) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.flush(db, metrics).await;
            log_head(db, "on shutdown").await;
        })
    }

    /// What waits to be linked: inbox rows, and observations held in memory.
    fn read_gauges<'a>(&'a self, db: &'a Db, metrics: &'a Metrics) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let inbox: i64 = on_pool!(db.read(), |pool| sqlx::query_scalar("SELECT COUNT(*) FROM audit_inbox")
                .fetch_one(pool)
                .await?);
            metrics.set(names::JOURNAL_BACKLOG, &[], inbox as f64 + self.queued() as f64);
            Ok(())
        })
    }
}

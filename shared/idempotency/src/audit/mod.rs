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
//! The module, file by file: `chain.rs` (the entries and their hashes, no
//! database: what the `audit` command verifies with), `inbox.rs` (how a
//! transition records its entries), `chainer.rs` (the rounds that link
//! them), and `query.rs` (reading it back).

mod chain;
mod chainer;
mod inbox;
mod query;

pub use chain::*;
pub(crate) use chainer::log_unlinked;
pub use chainer::{CHAIN_LOCK, ChainError, Journal, OBSERVATIONS_HELD_AT_MOST, Round};
pub(crate) use inbox::bind_records;
pub use inbox::*;
pub use query::*;

/// The journal is the sink a service's layer reports to: a transition goes to
/// the inbox in its own transaction, an observation is held for a round.
impl crate::transitions::Sink for Journal {
    fn record<'a>(&'a self, tx: &'a mut platform::Tx, records: &'a [Record]) -> crate::transitions::Recording<'a> {
        Box::pin(inbox::record(tx, records))
    }

    fn observe<'a>(&'a self, db: &'a platform::Db, record: Record) -> crate::transitions::Observing<'a> {
        Box::pin(Journal::observe(self, db, record))
    }
}

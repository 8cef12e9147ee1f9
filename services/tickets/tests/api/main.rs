//! The tickets API against docs/contract.md §1–§4, §6 (approvals), §7 Tickets
//! and §8 (the audit journal), every test on SQLite and on PostgreSQL; the
//! connection limits of §1 against a real socket.

mod support;

mod approvals;
mod audit;
mod auth_and_scoping;
mod connections;
mod lists;
mod metrics;
mod outcomes;
mod races;
mod replay_cache;
mod tickets;
mod validation;

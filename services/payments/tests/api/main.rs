//! The payments API against docs/contract.md §1–§7 Payments, every test on
//! SQLite and on PostgreSQL, with the simulated payment provider as a real HTTP
//! server beside it.

mod support;

mod approvals;
mod by_hand;
mod captures;
mod intents;
mod lost_in_a_failover;
mod refunds;

//! The deployments API against docs/contract.md §3–§7 Deployments, every test
//! on SQLite and on PostgreSQL, with the simulated deployment controller as a
//! real HTTP server beside it.

mod support;

mod approvals;
mod by_hand;
mod cancels;
mod deployments;
mod references;

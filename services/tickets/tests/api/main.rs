//! The tickets API against CONTRACT §1–§4 and §7 Tickets, every test on
//! SQLite and on PostgreSQL.

mod support;

mod auth_and_scoping;
mod outcomes;
mod races;
mod tickets;
mod validation;

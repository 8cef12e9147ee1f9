//! The audit journal: a hash chain that verifies, that concurrent writers
//! cannot fork, and that the database refuses to change — on both backends.

mod chain;
mod guards;
mod held;
mod support;

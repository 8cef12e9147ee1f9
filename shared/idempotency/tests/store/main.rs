//! The idempotency layer below HTTP: claims, replays, mismatches, leases and
//! takeovers, atomicity of effect and completion, and the reaper — each on
//! SQLite and on PostgreSQL.

mod claims;
mod leases;
mod retention;
mod support;

//! `sqlx::migrate!` embeds this crate's migrations when the crate compiles,
//! and Cargo does not see a migration file added later: without this, a new
//! migration would be missing from builds until some source file changed.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations/agent");
}

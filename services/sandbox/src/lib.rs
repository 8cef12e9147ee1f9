//! The Retrysafe sandbox: every service in one process (`cargo run`), and the
//! approval console the sandbox serves beside them ([`console`]).

pub mod console;

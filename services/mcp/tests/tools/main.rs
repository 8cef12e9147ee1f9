//! Every tool through a real MCP client (rmcp's) against the real services,
//! on both backends: what each tool maps onto, and every outcome an agent
//! can be answered with (docs/contract.md §13).

#[path = "../support/mod.rs"]
mod support;

mod approvals;
mod bound;
mod endpoints;
mod intents;
mod journal;
mod listing;

use std::time::Duration;

use serde_json::Value;
use support::Client;

/// Reads with `tool` until `done` holds for the resource.
async fn eventually(mcp: &Client, tool: &str, arguments: Value, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..200 {
        let read = mcp.call(tool, arguments.clone()).await;
        if done(&read.json["resource"]) {
            return read.json["resource"].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{tool} never showed what was awaited");
}

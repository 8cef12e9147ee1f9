//! Streamable HTTP as the sandbox serves it: stateless, so any replica
//! behind one address answers any call, and loopback hosts only unless
//! configured.

mod support;

use std::time::Duration;

use platform::{Backend, config::ConnectionLimits};
use serde_json::{Value, json};
use support::*;

/// An MCP server over streamable HTTP on a loopback port, on `world`'s
/// journal: a replica.
async fn replica(world: &World, allowed_hosts: &[&str]) -> String {
    let mut config = world.config();
    config.allowed_hosts = allowed_hosts.iter().map(|h| (*h).to_owned()).collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move {
        if let Err(e) = mcp::serve_http(config, listener, ConnectionLimits::default(), std::future::pending()).await {
            panic!("the replica stopped: {e}");
        }
    });
    url
}

/// One JSON-RPC request, as any MCP client posts it to a stateless server.
async fn post(url: &str, host: Option<&str>, body: Value) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .json(&body);
    if let Some(host) = host {
        request = request.header("host", host);
    }
    for _ in 0..100 {
        match request.try_clone().unwrap().send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                return (status, response.json().await.unwrap_or(Value::Null));
            }
            // the replica may not listen yet
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    panic!("{url} never answered");
}

fn call(tool: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}})
}

async fn any_replica_answers_any_call_of_an_intent(backend: Backend) {
    let world = World::start(backend).await;
    let project = unique("ops");
    let (first, second) = (
        replica(&world, &["127.0.0.1"]).await,
        replica(&world, &["127.0.0.1"]).await,
    );
    let arguments = ticket("one ticket, two replicas", &project, "Disk full");

    let (status, created) = post(&first, None, call("create_ticket", arguments.clone())).await;
    assert_eq!(status, 200);
    assert_eq!(
        created["result"]["structuredContent"]["outcome"], "created",
        "{created}"
    );
    let (_, replayed) = post(&second, None, call("create_ticket", arguments)).await;
    assert_eq!(
        replayed["result"]["structuredContent"]["outcome"], "replayed",
        "{replayed}"
    );
    assert_eq!(
        replayed["result"]["structuredContent"]["idempotency_key"],
        created["result"]["structuredContent"]["idempotency_key"]
    );
    assert_eq!(world.tickets_in(&project).await.len(), 1);
}

async fn a_host_that_is_not_configured_is_refused(backend: Backend) {
    let world = World::start(backend).await;
    let url = replica(&world, &["127.0.0.1"]).await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    let (status, body) = post(&url, None, list.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(body["result"]["tools"].as_array().unwrap().len(), 17);
    // a page on another site that rebinds its name to this machine
    let (status, _) = post(&url, Some("attacker.example"), list.clone()).await;
    assert_eq!(status, 403);

    let configured = replica(&world, &["127.0.0.1", "mcp.internal"]).await;
    let (status, _) = post(&configured, Some("mcp.internal"), list).await;
    assert_eq!(status, 200);
}

async fn the_server_names_itself_and_its_version(backend: Backend) {
    let world = World::start(backend).await;
    let url = replica(&world, &["127.0.0.1"]).await;
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}});
    let (_, body) = post(&url, None, initialize).await;
    assert_eq!(body["result"]["serverInfo"]["name"], "retrysafe-mcp");
    assert_eq!(body["result"]["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(body["result"]["instructions"].as_str().unwrap().contains("intent"));
}

platform::both_backends!(
    any_replica_answers_any_call_of_an_intent,
    a_host_that_is_not_configured_is_refused,
    the_server_names_itself_and_its_version,
);

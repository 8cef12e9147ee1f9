//! Streamable HTTP as the sandbox serves it: stateless, so any replica
//! behind one address answers any call; loopback hosts and origins only
//! unless configured; the services' connection limits; and outside the
//! sandbox, a token of its own.

mod support;

use std::time::Duration;

use mcp::{HttpToken, McpConfig};
use platform::{
    Backend,
    config::{ConnectionCap, ConnectionLimits},
};
use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An MCP server over streamable HTTP on a loopback port, on `world`'s
/// journal: a replica.
async fn replica(world: &World, allowed_hosts: &[&str]) -> String {
    let mut config = world.config();
    config.allowed_hosts = allowed_hosts.iter().map(|h| (*h).to_owned()).collect();
    serve(config, ConnectionLimits::default()).await.0
}

/// `config` served over streamable HTTP on a loopback port with `limits`:
/// its URL, and its address.
async fn serve(config: McpConfig, limits: ConnectionLimits) -> (String, std::net::SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        if let Err(e) = mcp::serve_http(config, listener, limits, std::future::pending()).await {
            panic!("the replica stopped: {e}");
        }
    });
    (format!("http://{addr}/mcp"), addr)
}

/// One JSON-RPC request, as any MCP client posts it to a stateless server.
async fn post(url: &str, host: Option<&str>, body: Value) -> (u16, Value) {
    let headers: Vec<(&str, &str)> = host.map(|host| ("host", host)).into_iter().collect();
    let (status, _, body) = post_with(url, &headers, body).await;
    (status, body)
}

/// … with `headers`: its status, headers and body.
async fn post_with(url: &str, headers: &[(&str, &str)], body: Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    for _ in 0..100 {
        match request.try_clone().unwrap().send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let headers = response.headers().clone();
                return (status, headers, response.json().await.unwrap_or(Value::Null));
            }
            // the replica may not listen yet
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    panic!("{url} never answered");
}

fn tools_list() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
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
    let list = tools_list();
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

async fn headers_not_complete_within_the_header_timeout_close_the_connection_as_the_services_do(backend: Backend) {
    let world = World::start(backend).await;
    let limits = ConnectionLimits {
        header_timeout: Duration::from_secs(1),
        ..ConnectionLimits::default()
    };
    let (_, addr) = serve(world.config(), limits.clone()).await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")
        .await
        .unwrap();

    let mut buffer = [0u8; 1024];
    let closed = tokio::time::timeout(limits.header_timeout * 3, async {
        while let Ok(read) = stream.read(&mut buffer).await
            && read > 0
        {}
    })
    .await;
    assert!(
        closed.is_ok(),
        "a client that never finishes its headers does not keep its connection"
    );
}

async fn past_the_connection_cap_the_endpoint_answers_503_with_retry_after(backend: Backend) {
    let world = World::start(backend).await;
    let limits = ConnectionLimits {
        connections: ConnectionCap::new(1),
        ..ConnectionLimits::default()
    };
    let (url, addr) = serve(world.config(), limits).await;
    let _held = tokio::net::TcpStream::connect(addr).await.unwrap();

    let (status, headers, body) = post_with(&url, &[], tools_list()).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(body["code"], "too_many_connections");
}

async fn a_page_of_another_origin_is_refused_and_a_page_on_this_machine_is_served(backend: Backend) {
    let world = World::start(backend).await;
    let url = replica(&world, &["127.0.0.1"]).await;

    // a page on another site, in a browser of someone who reaches this endpoint
    let (status, _, _) = post_with(&url, &[("origin", "https://attacker.example")], tools_list()).await;
    assert_eq!(status, 403);
    let (status, _, _) = post_with(&url, &[("origin", "null")], tools_list()).await;
    assert_eq!(status, 403, "a sandboxed frame or a file is no origin of this machine");
    // an MCP client's own page on this machine, as the MCP Inspector's is
    let (status, _, body) = post_with(&url, &[("origin", "http://localhost:6274")], tools_list()).await;
    assert_eq!(status, 200);
    assert_eq!(body["result"]["tools"].as_array().unwrap().len(), 17);

    let mut config = world.config();
    config.allowed_origins = vec!["https://agents.example.com".into()];
    let (configured, _) = serve(config, ConnectionLimits::default()).await;
    let (status, _, _) = post_with(&configured, &[("origin", "https://agents.example.com")], tools_list()).await;
    assert_eq!(status, 200);
    let (status, _, _) = post_with(&configured, &[("origin", "http://localhost:6274")], tools_list()).await;
    assert_eq!(status, 403, "a configured list replaces the loopback origins");
}

/// The MCP endpoint's own token in the tests: no service knows it.
const MCP_TOKEN: &str = "mcp-token-0123456789abcdef0123456789abcdef";

async fn outside_the_sandbox_a_request_without_the_endpoints_token_is_401_and_with_it_is_served(backend: Backend) {
    let world = World::start(backend).await;
    let mut config = world.config();
    config.sandbox = false;
    config.http_token = Some(HttpToken::new(MCP_TOKEN).unwrap());
    let (url, _) = serve(config, ConnectionLimits::default()).await;

    let agent_key = format!("Bearer {ACME_AGENT}");
    let wrong = format!("Bearer {}", MCP_TOKEN.replace('0', "1"));
    for headers in [
        vec![],
        vec![("authorization", agent_key.as_str())],
        vec![("authorization", wrong.as_str())],
    ] {
        let (status, answer, body) = post_with(&url, &headers, tools_list()).await;
        assert_eq!(status, 401, "{headers:?}");
        assert_eq!(answer["www-authenticate"], "Bearer");
        assert_eq!(body["code"], "unauthenticated");
        assert!(!body.to_string().contains(MCP_TOKEN));
    }

    let token = format!("Bearer {MCP_TOKEN}");
    let (status, _, body) = post_with(&url, &[("authorization", &token)], tools_list()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["tools"].as_array().unwrap().len(), 17);
}

async fn the_health_endpoint_answers_a_probe_that_knows_no_token(backend: Backend) {
    let world = World::start(backend).await;
    let mut config = world.config();
    config.sandbox = false;
    config.http_token = Some(HttpToken::new(MCP_TOKEN).unwrap());
    let (_, addr) = serve(config, ConnectionLimits::default()).await;
    let health = reqwest::get(format!("http://{addr}/healthz")).await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.json::<Value>().await.unwrap()["status"], "ok");
}

async fn outside_the_sandbox_streamable_http_does_not_start_without_a_token(backend: Backend) {
    let world = World::start(backend).await;
    let mut config = world.config();
    config.sandbox = false;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();

    let serving = mcp::serve_http(config, listener, ConnectionLimits::default(), std::future::pending());
    let refused = tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("it refuses to start rather than serve")
        .expect_err("no token, no endpoint");
    assert!(refused.to_string().contains("MCP_HTTP_TOKEN"), "{refused}");
}

async fn a_message_larger_than_the_endpoint_reads_is_413(backend: Backend) {
    let world = World::start(backend).await;
    let url = replica(&world, &["127.0.0.1"]).await;
    let mut call = call("create_ticket", ticket("a large one", "ops", "Disk full"));
    call["params"]["arguments"]["description"] = json!("x".repeat(mcp::MAX_MESSAGE_BYTES));

    let (status, _, _) = post_with(&url, &[], call).await;
    assert_eq!(status, 413);
}

platform::both_backends!(
    any_replica_answers_any_call_of_an_intent,
    a_host_that_is_not_configured_is_refused,
    the_server_names_itself_and_its_version,
    headers_not_complete_within_the_header_timeout_close_the_connection_as_the_services_do,
    past_the_connection_cap_the_endpoint_answers_503_with_retry_after,
    a_page_of_another_origin_is_refused_and_a_page_on_this_machine_is_served,
    outside_the_sandbox_a_request_without_the_endpoints_token_is_401_and_with_it_is_served,
    outside_the_sandbox_streamable_http_does_not_start_without_a_token,
    the_health_endpoint_answers_a_probe_that_knows_no_token,
    a_message_larger_than_the_endpoint_reads_is_413,
);

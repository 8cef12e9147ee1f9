//! The bound on calls under way: past it a call waits its turn, and none is dropped.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use platform::Backend;
use serde_json::json;

use crate::support::*;

/// Requests a stand-in tickets service holds: now, the most at once, and in all.
#[derive(Debug, Default)]
struct Held {
    now: AtomicUsize,
    most: AtomicUsize,
    all: AtomicUsize,
}

/// A stand-in for the tickets service that holds each request a moment
/// before it creates the ticket, counting the requests it holds at once.
async fn holding_tickets_service() -> (String, Arc<Held>) {
    let held = Arc::new(Held::default());
    let counted = held.clone();
    let router = axum::Router::new().route(
        "/v1/tickets",
        axum::routing::post(move || {
            let held = counted.clone();
            async move {
                let now = held.now.fetch_add(1, Ordering::SeqCst) + 1;
                held.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
                held.now.fetch_sub(1, Ordering::SeqCst);
                let n = held.all.fetch_add(1, Ordering::SeqCst);
                (
                    axum::http::StatusCode::CREATED,
                    [("operation-id", format!("op_{n}"))],
                    axum::Json(json!({"id": format!("tkt_{n}"), "status": "open"})),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (url, held)
}

async fn past_the_bound_on_calls_under_way_a_call_waits_for_one_to_end_and_none_is_dropped(backend: Backend) {
    let world = World::start(backend).await;
    let (url, held) = holding_tickets_service().await;
    let mut config = world.config();
    config.tickets.url = url;
    config.max_runs = 2;
    let mcp = world.connect_with(config).await;
    let project = unique("ops");

    let calls = (0..6).map(|n| mcp.call("create_ticket", ticket(&format!("run {n}"), &project, "Disk full")));
    futures::future::join_all(calls).await;

    let most = held.most.load(Ordering::SeqCst);
    assert_eq!(
        most, 2,
        "requests sent at once: as many as the bound allows, never more"
    );
    assert_eq!(held.all.load(Ordering::SeqCst), 6, "every call was sent, once");
}

platform::both_backends!(past_the_bound_on_calls_under_way_a_call_waits_for_one_to_end_and_none_is_dropped,);

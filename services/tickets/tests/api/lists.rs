//! Lists in commit order (docs/contract.md §10): a cursor never passes a
//! ticket whose transaction commits after the reader went by. Only
//! PostgreSQL can commit out of order — SQLite has one writer, so a row's
//! number and its commit come in the same order there — so this test runs
//! on PostgreSQL alone.

use axum::http::StatusCode;
use platform::Backend;
use serde_json::Value;
use tickets::domain::{CreateTicket, Priority};

use crate::support::*;

fn titles(page: &Value) -> Vec<&str> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["title"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_a_ticket_committed_after_a_later_one_comes_on_the_next_page_and_is_never_skipped() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let app = TestApp::spawn(Backend::Postgres).await;
    // a ticket inserted first, whose transaction is still open: its row is numbered first
    let mut slow = app.db.db.begin().await.unwrap();
    let late = CreateTicket {
        project: "ops".into(),
        title: "Committed late".into(),
        description: None,
        priority: Priority::High,
        source_event_id: None,
        labels: vec![],
    };
    tickets::store::create_ticket(&mut slow, "acme", &late).await.unwrap();
    for (key, title) in [("key-1", "First"), ("key-2", "Second")] {
        let body = format!(r#"{{"project":"ops","title":"{title}","priority":"high"}}"#);
        assert_eq!(app.create_ticket(key, &body).await.status, StatusCode::CREATED);
    }

    let first = app.get("/v1/tickets?limit=1", ACME_AGENT).await.json();
    slow.commit().await.unwrap();
    let cursor = first["next_cursor"].as_str().expect("a next page").to_owned();
    let rest = app
        .get(&format!("/v1/tickets?cursor={cursor}"), ACME_AGENT)
        .await
        .json();
    let everything = app.get("/v1/tickets", ACME_AGENT).await.json();

    assert_eq!(titles(&first), ["First"]);
    assert_eq!(
        titles(&rest),
        ["Second", "Committed late"],
        "the late commit comes after, not never"
    );
    assert_eq!(rest["next_cursor"], Value::Null);
    assert_eq!(
        titles(&everything),
        ["First", "Second", "Committed late"],
        "in commit order, every time"
    );
}

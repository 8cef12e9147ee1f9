//! Real races: many tasks at once on one key, or one alert event.

use std::collections::HashSet;

use futures::future::join_all;
use platform::Backend;

use crate::support::*;

const COPIES: usize = 48;

async fn concurrent_copies_with_one_key_make_exactly_one_ticket(backend: Backend) {
    let app = std::sync::Arc::new(TestApp::spawn(backend).await);
    let answers = join_all((0..COPIES).map(|_| {
        let app = app.clone();
        tokio::spawn(async move { app.create_ticket("storm-key", ROTATE_CERT).await })
    }))
    .await;
    let answers: Vec<TestResponse> = answers.into_iter().map(Result::unwrap).collect();

    assert_eq!(app.ticket_count().await, 1, "one key, one effect");
    let executed: Vec<_> = answers
        .iter()
        .filter(|a| a.replayed() == Some("false") && a.status == 201)
        .collect();
    assert_eq!(executed.len(), 1, "exactly one copy ran the operation");
    let operation_ids: HashSet<_> = answers.iter().map(|a| a.operation_id().to_owned()).collect();
    assert_eq!(operation_ids.len(), 1, "every copy was answered for the same operation");
    for answer in &answers {
        match answer.status.as_u16() {
            201 => assert_eq!(answer.body, executed[0].body),
            409 => assert_eq!(answer.code(), "request_in_progress"),
            other => panic!("unexpected {other}: {:?}", answer.body),
        }
    }
    let operation = app
        .get("/v1/operations?idempotency_key=storm-key", ACME_AGENT)
        .await
        .json();
    assert_eq!(operation["data"][0]["attempts"], COPIES as i64);
}

async fn concurrent_creates_with_different_keys_for_one_source_event_make_exactly_one_ticket(backend: Backend) {
    let app = std::sync::Arc::new(TestApp::spawn(backend).await);
    let answers = join_all((0..COPIES).map(|n| {
        let app = app.clone();
        tokio::spawn(async move {
            let body = format!(r#"{{"project":"ops","title":"Disk full (run {n})","source_event_id":"alert-42"}}"#);
            app.create_ticket(&format!("agent-run-{n}"), &body).await
        })
    }))
    .await;
    let answers: Vec<TestResponse> = answers.into_iter().map(Result::unwrap).collect();

    assert_eq!(app.ticket_count().await, 1, "one alert event, one ticket");
    let created = answers.iter().filter(|a| a.status == 201).count();
    let matched = answers
        .iter()
        .filter(|a| a.status == 200 && a.json()["outcome"] == "matched_existing")
        .count();
    assert_eq!((created, matched), (1, COPIES - 1));
    let ids: HashSet<_> = answers
        .iter()
        .map(|a| a.json()["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 1);
}

platform::both_backends!(
    concurrent_copies_with_one_key_make_exactly_one_ticket,
    concurrent_creates_with_different_keys_for_one_source_event_make_exactly_one_ticket,
);

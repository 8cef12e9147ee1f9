//! Replicas (docs/design.md §11): three `payments` processes on one
//! PostgreSQL database, with no leader and nothing between them but the
//! database, and a fourth killed with SIGKILL while it holds a capture's
//! outbox event. The provider's own count of charges says "exactly once".
//!
//! PostgreSQL only: it is the backend replicas share (a SQLite file belongs
//! to one host, and its single writer already orders everything).

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use futures::future::join_all;
use platform::{
    Backend,
    testing::{ACME_AGENT, ACME_APPROVER, TestDb, TestResponse},
};
use serde_json::{Value, json};

use common::Payments;

/// `retrysafe_idempotency_requests_total` for `route` and `outcome` in a
/// replica's `/metrics` (0 when it has no such series).
fn requests_counted(text: &str, route: &str, outcome: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with("retrysafe_idempotency_requests_total{"))
        .filter(|line| line.contains(&format!("route=\"{route}\"")) && line.contains(&format!("outcome=\"{outcome}\"")))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every journal entry, read through a replica as an approver, page by page.
async fn whole_journal(replica: &Payments) -> Vec<journal::AuditEntry> {
    let mut entries = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = replica
            .get(&format!("/v1/audit?limit=200&cursor={cursor}"), ACME_APPROVER)
            .await;
        entries.extend(
            page["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| serde_json::from_value(e.clone()).expect("an entry")),
        );
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_owned(),
            None => return entries,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_one_database_start_together_and_keep_every_payment_to_one_effect() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = TestDb::new(Backend::Postgres).await;
    let (provider, provider_url) = common::provider().await;

    // started at the same instant against an empty database: each migrates, one at a time
    let replicas: Vec<Payments> = join_all((0..3).map(|_| Payments::start(&db.url, &provider_url, None))).await;

    // a 200-way storm of one key, round-robin over the replicas: one intent
    let body = common::intent("order-1");
    let storm = join_all((0..200).map(|i| replicas[i % 3].post("/v1/payment_intents", "storm-1", &body))).await;
    let created: Vec<&TestResponse> = storm.iter().filter(|r| r.replayed() == Some("false")).collect();
    assert!(
        storm.iter().all(|r| r.status == StatusCode::CREATED),
        "{:?}",
        storm.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(created.len(), 1, "one request ran; every other replayed its answer");
    assert!(
        storm.iter().all(|r| r.body == created[0].body),
        "the same bytes from every replica"
    );
    let listed = replicas[2]
        .get("/v1/payment_intents?order_id=order-1", ACME_AGENT)
        .await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "{listed}");
    let intent_id = created[0].str("id");
    // each replica counts what it answered; together, the storm
    let mut counted = [0.0, 0.0];
    for replica in &replicas {
        let text = replica.0.client().get("/metrics", "").await.body;
        let text = String::from_utf8(text.to_vec()).unwrap();
        for (i, outcome) in ["executed", "replayed"].into_iter().enumerate() {
            counted[i] += requests_counted(&text, "/v1/payment_intents", outcome);
        }
    }
    assert_eq!(
        counted,
        [1.0, 199.0],
        "one executed and 199 replayed, over three replicas"
    );

    // 16 racing captures of that intent under 16 keys, spread over the replicas: one charge
    let capture_path = format!("/v1/payment_intents/{intent_id}/capture");
    let (keys, empty): (Vec<String>, Value) = ((0..16).map(|i| format!("cap-{i}")).collect(), json!({}));
    let captures = join_all((0..16).map(|i| replicas[i % 3].post(&capture_path, &keys[i], &empty))).await;
    let accepted: Vec<&TestResponse> = captures.iter().filter(|r| r.status == StatusCode::ACCEPTED).collect();
    assert_eq!(
        accepted.len(),
        1,
        "{:?}",
        captures.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    replicas[1].until_succeeded(&accepted[0].str("id")).await;
    assert_eq!(
        provider.stats().charges_made,
        1,
        "one charge for sixteen captures over three replicas"
    );

    // a fourth replica holds a capture's event at the delivery and dies with SIGKILL
    let (capture_id, charges_before) = loop {
        let mut doomed = Payments::start(&db.url, &provider_url, Some("outbox::before_delivery")).await;
        let order = format!("order-{}", uuid::Uuid::new_v4().simple());
        let intent = doomed
            .post("/v1/payment_intents", &format!("i-{order}"), &common::intent(&order))
            .await;
        let charges_before = provider.stats().charges_made;
        let capture = doomed
            .post(
                &format!("/v1/payment_intents/{}/capture", intent.str("id")),
                &format!("c-{order}"),
                &json!({}),
            )
            .await;
        assert_eq!(capture.status, StatusCode::ACCEPTED, "{:?}", capture.body);
        // its own worker is woken at once; another replica's poll may still win the event, then try again
        let held = tokio::time::timeout(Duration::from_secs(3), doomed.0.wait_for("fail point reached")).await;
        doomed.0.kill().await;
        if held.is_ok() {
            break (capture.str("id"), charges_before);
        }
    };
    let settled = replicas[0].until_succeeded(&capture_id).await;
    assert_eq!(
        provider.stats().charges_made,
        charges_before + 1,
        "charged once, by another replica, after the kill"
    );
    assert!(settled["provider_charge_id"].is_string());

    // one chain, and each operation's transitions in it once
    let journal = whole_journal(&replicas[2]).await;
    journal::verify(&journal, None).expect("the journal verifies");
    let mut completed: Vec<&str> = journal
        .iter()
        .filter(|e| e.event == journal::AuditEvent::Completed)
        .filter_map(|e| e.operation_id.as_deref())
        .collect();
    let total = completed.len();
    completed.sort_unstable();
    completed.dedup();
    assert_eq!(completed.len(), total, "no operation completed twice");
    for replica in replicas {
        replica.0.kill().await;
    }
}

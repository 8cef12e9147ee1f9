//! Real processes, really killed (docs/contract.md §5): a `payments` process
//! dies with SIGKILL while a capture's charge is on its way to the provider —
//! once after the outbox event was written and taken but before it was sent,
//! once after the provider charged but before the answer was recorded. A new
//! process on the same database finishes the work, and the provider's own count
//! says one charge.
//!
//! The provider runs in the test process (it is the external system; it is not
//! the one that dies). The binary is built with the `failpoints` feature for
//! tests; `FAILPOINTS=outbox::before_delivery=return` holds the outbox worker
//! there until the test kills the process.

mod common;

use axum::http::StatusCode;
use platform::{
    Backend,
    testing::{ACME_AGENT, ACME_APPROVER, TestDb},
};
use serde_json::json;

use common::Payments;

/// Starts a process that holds its outbox worker at `fail_point`, captures an
/// intent through it, kills it with SIGKILL, and lets a second process on the
/// same database finish. Returns the provider's charge count at the kill and
/// the journal of the capture's operation.
async fn capture_killed_at(backend: Backend, fail_point: &str) -> (u64, Vec<String>) {
    let db = TestDb::new(backend).await;
    let (provider, provider_url) = common::provider().await;

    let mut doomed = Payments::start(&db.url, &provider_url, Some(fail_point)).await;
    let intent = doomed
        .post("/v1/payment_intents", "intent-1", &common::intent("order-1"))
        .await;
    assert_eq!(intent.status, StatusCode::CREATED);
    let intent_id = intent.str("id");
    let capture_path = format!("/v1/payment_intents/{intent_id}/capture");
    let accepted = doomed.post(&capture_path, "cap-1", &json!({})).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "the agent has its answer");
    let operation_id = accepted.operation_id().to_owned();
    let capture_id = accepted.str("id");
    doomed.0.wait_for("fail point reached").await;
    doomed.0.kill().await;
    let charges_at_kill = provider.stats().charges_made;

    let restarted = Payments::start(&db.url, &provider_url, None).await;
    let settled = restarted.until_succeeded(&capture_id).await;
    let operation = restarted
        .get(&format!("/v1/operations/{operation_id}"), ACME_AGENT)
        .await;
    let retry = restarted.post(&capture_path, "cap-1", &json!({})).await;
    let journal = restarted
        .get(&format!("/v1/audit?operation_id={operation_id}"), ACME_APPROVER)
        .await;

    assert_eq!(provider.stats().charges_made, 1, "exactly one charge");
    assert_eq!(operation["state"], "completed");
    assert_eq!(operation["external_ref"], settled["provider_charge_id"]);
    assert_eq!(retry.replayed(), Some("true"));
    assert_eq!(retry.body, accepted.body, "the first answer survived the process");
    restarted.0.kill().await;
    let events = journal["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect();
    (charges_at_kill, events)
}

async fn a_capture_killed_after_its_event_was_written_and_before_delivery_is_charged_once_after_restart(
    backend: Backend,
) {
    let (charges_at_kill, events) = capture_killed_at(backend, "outbox::before_delivery").await;

    assert_eq!(charges_at_kill, 0, "nothing reached the provider before the kill");
    assert_eq!(
        events.iter().filter(|e| *e == "dispatched").count(),
        2,
        "taken by the killed worker, and again after the reconciler found nothing: {events:?}"
    );
    assert!(events.iter().any(|e| e == "accepted"), "{events:?}");
}

async fn a_capture_killed_after_the_provider_charged_and_before_it_was_recorded_is_charged_once_after_restart(
    backend: Backend,
) {
    let (charges_at_kill, events) = capture_killed_at(backend, "outbox::after_delivery").await;

    assert_eq!(charges_at_kill, 1, "the provider charged before the kill");
    assert!(
        events.iter().any(|e| e == "reconciled"),
        "the reconciler asked the provider and found the charge: {events:?}"
    );
    assert!(!events.iter().any(|e| e == "accepted"), "{events:?}");
}

platform::both_backends!(
    a_capture_killed_after_its_event_was_written_and_before_delivery_is_charged_once_after_restart,
    a_capture_killed_after_the_provider_charged_and_before_it_was_recorded_is_charged_once_after_restart,
);

//! A capture a failover took away after the provider charged it
//! (docs/design.md §6, §12): the retry is the same request at the provider.

use axum::http::StatusCode;
use platform::{Backend, on_pool};
use serde_json::json;

use crate::support::{ACME_AGENT, TestApp};

/// Takes away what a failover to a standby that lagged behind loses of an
/// acknowledged capture: its operation and event, the capture, and the
/// intent's move past `requires_capture`. The charge stays at the provider.
async fn lose_as_a_failover_would(app: &TestApp, accepted: &platform::testing::TestResponse, intent_id: &str) {
    let (capture_id, operation_id) = (accepted.str("id"), accepted.operation_id().to_owned());
    on_pool!(app.db.db.write(), |pool| {
        for (sql, id) in [
            ("DELETE FROM idempotency_outbox WHERE operation_id = $1", &operation_id),
            (
                "DELETE FROM idempotency_operations WHERE operation_id = $1",
                &operation_id,
            ),
            ("DELETE FROM payment_captures WHERE id = $1", &capture_id),
            (
                "UPDATE payment_intents SET state = 'requires_capture' WHERE id = $1",
                &intent_id.to_owned(),
            ),
        ] {
            sqlx::query(sql).bind(id).execute(pool).await.unwrap();
        }
    });
}

/// A failover can lose a capture the provider has charged. The client's retry
/// (same key, same body) then runs again as a new operation with a capture of
/// its own id, and is sent to the provider as the same request — the same key
/// and the same body, reference included — so the provider answers with the
/// first charge, and the retry's capture ends captured with it.
async fn a_capture_lost_in_a_failover_reaches_the_provider_again_under_its_first_key_and_is_never_charged_twice(
    backend: Backend,
) {
    // no replay from memory: a replica that lived through the failover has forgotten
    let config = idempotency::IdempotencyConfig {
        replay_cache_entries: 0,
        ..idempotency::IdempotencyConfig::default()
    };
    let app = TestApp::spawn_configured(backend, Default::default(), config).await;
    let intent_id = app.intent_for("order-1", "40.00").await;
    let first = app.capture(&intent_id, "cap-1", &json!({})).await;
    app.deliver().await;
    let first_charge = app
        .get(&format!("/v1/captures/{}", first.str("id")), ACME_AGENT)
        .await
        .str("provider_charge_id");
    lose_as_a_failover_would(&app, &first, &intent_id).await;

    let retry = app.capture(&intent_id, "cap-1", &json!({})).await;
    app.deliver().await;
    let settled = app.operation(retry.operation_id()).await;
    let capture = app.get(&format!("/v1/captures/{}", retry.str("id")), ACME_AGENT).await;
    let intent = app.get(&format!("/v1/payment_intents/{intent_id}"), ACME_AGENT).await;

    assert_eq!(retry.status, StatusCode::ACCEPTED, "{:?}", retry.body);
    assert_eq!(retry.replayed(), Some("false"), "the database has no such operation");
    assert_ne!(retry.operation_id(), first.operation_id());
    assert_ne!(retry.str("id"), first.str("id"), "a capture of its own");
    assert_eq!(
        retry.str("provider_idempotency_key"),
        first.str("provider_idempotency_key"),
        "the key is the request's, not the operation's"
    );
    let stats = app.provider.stats();
    assert_eq!(stats.requests, 2, "the retry reached the provider");
    assert_eq!(stats.charges_made, 1, "one charge for one order");
    let under_the_key = app
        .provider
        .charges_with_key(&first.str("provider_idempotency_key"))
        .await;
    assert_eq!(under_the_key["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(under_the_key["data"][0]["id"], first_charge.as_str());
    assert_eq!(
        under_the_key["data"][0]["merchant_reference"],
        first.str("provider_idempotency_key"),
        "the reference is the request's too, so the retry's body is the first one's"
    );
    assert_eq!(settled["state"], "completed", "{settled}");
    assert_eq!(capture.json()["state"], "succeeded", "{:?}", capture.body);
    assert_eq!(
        capture.str("provider_charge_id"),
        first_charge,
        "the retry's capture holds the first charge"
    );
    assert_eq!(intent.json()["state"], "succeeded", "{:?}", intent.body);
}

platform::both_backends!(
    a_capture_lost_in_a_failover_reaches_the_provider_again_under_its_first_key_and_is_never_charged_twice,
);

//! Captures: a 202 at once, the charge through the outbox with one stable
//! provider key, a lost answer reconciled by asking the provider, refusals,
//! races — and the provider's own count of charges says "exactly once".

use std::sync::Arc;

use axum::http::StatusCode;
use futures::future::join_all;
use outbox::{EventState, OutboxConfig};
use payment_provider::Faults;
use platform::Backend;
use serde_json::json;

use crate::support::{ACME_AGENT, GLOBEX_AGENT, TestApp};

async fn a_capture_answers_202_and_the_outbox_charges_the_provider_once_with_a_key_derived_from_the_request(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "12.50").await;

    let accepted = app.capture(&intent_id, "cap-1", &json!({})).await;
    let retried = app.capture(&intent_id, "cap-1", &json!({})).await;
    let operation_id = accepted.operation_id().to_owned();
    let before_delivery = app.operation(&operation_id).await;
    app.deliver().await;
    let after_delivery = app.operation(&operation_id).await;
    let retried_after = app.capture(&intent_id, "cap-1", &json!({})).await;
    let capture = app
        .get(&format!("/v1/captures/{}", accepted.str("id")), ACME_AGENT)
        .await
        .json();
    let intent = app
        .get(&format!("/v1/payment_intents/{intent_id}"), ACME_AGENT)
        .await
        .json();

    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{:?}", accepted.body);
    assert_eq!(accepted.json()["state"], "processing");
    assert_eq!(accepted.json()["amount_minor"], 1250);
    assert_eq!(
        accepted.json()["status_url"],
        format!("/v1/captures/{}", accepted.str("id"))
    );
    for retry in [&retried, &retried_after] {
        assert_eq!(retry.status, StatusCode::ACCEPTED);
        assert_eq!(retry.replayed(), Some("true"));
        assert_eq!(retry.body, accepted.body, "the first answer, byte for byte");
    }
    assert_eq!(before_delivery["state"], "in_progress", "{before_delivery}");
    let sent = idempotency::OperationIdentity {
        account_id: "acme",
        operation_id: &operation_id,
        idempotency_key: "cap-1",
        fingerprint: after_delivery["fingerprint"].as_str().unwrap(),
        route: after_delivery["route"].as_str().unwrap(),
    };
    assert_eq!(
        accepted.str("provider_idempotency_key"),
        outbox::external_key(&sent),
        "the key is derived from the request the client sent"
    );
    assert_eq!(after_delivery["state"], "completed");
    assert_eq!(capture["state"], "succeeded");
    assert_eq!(intent["state"], "succeeded");
    let charge_id = capture["provider_charge_id"].as_str().unwrap();
    assert_eq!(after_delivery["external_ref"], charge_id);
    assert_eq!(intent["provider_charge_id"], charge_id);
    assert_eq!(app.provider.stats().charges_made, 1);
    let at_provider = app
        .provider
        .charges_with_key(&accepted.str("provider_idempotency_key"))
        .await;
    assert_eq!(
        at_provider["data"][0]["id"], charge_id,
        "the provider was sent the key the capture recorded"
    );
    assert_eq!(at_provider["data"][0]["amount_minor"], 1250);
}

async fn while_the_outbox_delivers_a_capture_its_operation_shows_the_stored_202_every_retry_gets(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "12.50").await;

    let accepted = app.capture(&intent_id, "cap-1", &json!({})).await;
    let operation_id = accepted.operation_id().to_owned();
    let delivering = app.operation(&operation_id).await;
    app.deliver().await;
    let delivered = app.operation(&operation_id).await;

    assert_eq!(accepted.status, StatusCode::ACCEPTED);
    assert_eq!(delivering["state"], "in_progress", "{delivering}");
    assert_eq!(
        delivering["response_status"], 202,
        "the answer is stored and replayed while the work goes on"
    );
    assert_eq!(delivered["state"], "completed");
    assert_eq!(delivered["response_status"], 202);
}

/// The story: the provider charges, and its answer never arrives.
async fn a_lost_provider_answer_leaves_the_capture_unknown_until_the_reconciler_finds_the_one_charge(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "40.00").await;
    app.provider.set_faults(Faults {
        drop_next: 1,
        ..Faults::default()
    });

    let accepted = app.capture(&intent_id, "cap-1", &json!({})).await;
    let operation_id = accepted.operation_id().to_owned();
    app.deliver().await;
    let lost = app.operation(&operation_id).await;
    let capture_url = format!("/v1/captures/{}", accepted.str("id"));
    let capture_while_unknown = app.get(&capture_url, ACME_AGENT).await.json();
    let retry_while_unknown = app.capture(&intent_id, "cap-1", &json!({})).await;
    app.reconcile().await;
    let settled = app.operation(&operation_id).await;
    let retry_after = app.capture(&intent_id, "cap-1", &json!({})).await;
    let capture = app.get(&capture_url, ACME_AGENT).await.json();

    assert_eq!(lost["state"], "unknown", "{lost}");
    assert_eq!(capture_while_unknown["state"], "unknown");
    for retry in [&retry_while_unknown, &retry_after] {
        assert_eq!(retry.status, StatusCode::ACCEPTED);
        assert_eq!(retry.replayed(), Some("true"));
        assert_eq!(retry.body, accepted.body, "a retry is a replay of the first answer");
    }
    assert_eq!(settled["state"], "completed", "{settled}");
    assert_eq!(capture["state"], "succeeded");
    assert_eq!(settled["external_ref"], capture["provider_charge_id"]);
    assert_eq!(app.provider.stats().charges_made, 1, "charged exactly once");
    assert_eq!(
        app.provider.stats().requests,
        1,
        "the reconciler asked; it sent nothing again"
    );
    let events = app.journal_events(&operation_id).await;
    for event in [
        "claimed",
        "dispatched",
        "unknown",
        "replayed",
        "reconciled",
        "completed",
    ] {
        assert!(events.iter().any(|e| e == event), "`{event}` in {events:?}");
    }
    assert!(
        !events.iter().any(|e| e == "accepted"),
        "nobody saw it accepted: {events:?}"
    );
}

/// A 503 may come from a gateway whose upstream took the request: the
/// reconciler asks first, finds nothing, and the same request goes again.
async fn a_provider_that_fails_before_accepting_is_asked_and_then_sent_the_same_request_again(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "40.00").await;
    app.provider.set_faults(Faults {
        fail_next: 1,
        ..Faults::default()
    });

    let accepted = app.capture(&intent_id, "cap-1", &json!({})).await;
    let operation_id = accepted.operation_id().to_owned();
    app.deliver().await;
    let after_failure = app.operation(&operation_id).await;
    app.reconcile().await;
    let event_after_asking = outbox::event_of(&app.db.db, "acme", &operation_id).await.unwrap();
    app.deliver().await;
    let after_retry = app.operation(&operation_id).await;

    assert_eq!(
        after_failure["state"], "unknown",
        "a 503 does not prove nothing was taken"
    );
    assert_eq!(
        event_after_asking,
        Some((EventState::Pending, 1)),
        "not found, so sent again"
    );
    assert_eq!(after_retry["state"], "completed");
    assert_eq!(
        outbox::event_of(&app.db.db, "acme", &operation_id).await.unwrap(),
        Some((EventState::Delivered, 2))
    );
    let stats = app.provider.stats();
    assert_eq!((stats.requests, stats.charges_made), (2, 1));
}

/// The provider took the charge and answers as if it were still at it: a
/// conflict that is not a reused key, 425, 429 with a reason, 500, 503. None
/// of these says "not done": the capture is unknown, its order stays taken,
/// and the reconciler finds the one charge.
async fn an_answer_that_may_mean_still_processing_leaves_the_capture_unknown_and_the_order_taken_until_the_reconciler_finds_the_one_charge(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let statuses = [409, 425, 429, 500, 503];

    for (i, status) in statuses.into_iter().enumerate() {
        let order_id = format!("order-{i}");
        let intent_id = app.intent_for(&order_id, "40.00").await;
        app.provider.set_faults(Faults {
            answer_after_accepting: vec![status],
            ..Faults::default()
        });
        let accepted = app.capture(&intent_id, &format!("cap-{i}"), &json!({})).await;
        let operation_id = accepted.operation_id().to_owned();
        app.deliver().await;
        let after_answer = app.operation(&operation_id).await;
        let second_intent = app.create(&format!("another-intent-{i}"), &order_id).await;
        app.provider.set_faults(Faults::default());
        app.reconcile().await;
        let settled = app.operation(&operation_id).await;
        let capture = app
            .get(&format!("/v1/captures/{}", accepted.str("id")), ACME_AGENT)
            .await
            .json();

        assert_eq!(after_answer["state"], "unknown", "{status}: {after_answer}");
        assert_eq!(
            second_intent.status,
            StatusCode::CONFLICT,
            "{status}: {:?}",
            second_intent.body
        );
        assert_eq!(
            second_intent.json()["code"],
            "order_already_has_payment",
            "{status}: the order is not freed"
        );
        assert_eq!(settled["state"], "completed", "{status}: {settled}");
        assert_eq!(capture["state"], "succeeded", "{status}");
        let at_provider = app
            .provider
            .charges_with_key(&accepted.str("provider_idempotency_key"))
            .await;
        assert_eq!(
            at_provider["data"].as_array().map(Vec::len),
            Some(1),
            "{status}: {at_provider}"
        );
        assert_eq!(settled["external_ref"], at_provider["data"][0]["id"]);
    }
    let stats = app.provider.stats();
    assert_eq!(
        (stats.requests, stats.charges_made),
        (5, 5),
        "one charge per capture, nothing sent twice"
    );
}

async fn a_charge_the_provider_declines_fails_the_capture_and_frees_the_order(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "40.00").await;
    app.provider.set_faults(Faults {
        decline_next: 1,
        ..Faults::default()
    });

    let accepted = app.capture(&intent_id, "cap-1", &json!({})).await;
    let operation_id = accepted.operation_id().to_owned();
    app.deliver().await;
    let operation = app.operation(&operation_id).await;
    let capture = app
        .get(&format!("/v1/captures/{}", accepted.str("id")), ACME_AGENT)
        .await
        .json();
    let intent = app
        .get(&format!("/v1/payment_intents/{intent_id}"), ACME_AGENT)
        .await
        .json();
    let retry = app.capture(&intent_id, "cap-1", &json!({})).await;
    let new_intent = app.create("another-intent", "order-1").await;

    assert_eq!(operation["state"], "failed", "{operation}");
    assert_eq!(capture["state"], "failed");
    assert_eq!(intent["state"], "failed");
    assert_eq!(retry.body, accepted.body, "the stored answer is still the first one");
    assert_eq!(
        new_intent.status,
        StatusCode::CREATED,
        "a failed intent frees its order: {:?}",
        new_intent.body
    );
    assert_eq!(app.provider.stats().charges_made, 0);
    assert!(app.journal_events(&operation_id).await.contains(&"failed".to_owned()));
}

/// Something else holds the capture's key at the provider (a bug, or another
/// system sharing the merchant account): the provider refuses ours as a reused
/// key. That is not "nothing happened", and the charge under the key is not
/// ours: the capture stays unknown for a person, and nothing is sent again.
async fn a_key_collision_at_the_provider_is_never_taken_for_the_capture_s_charge(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "40.00").await;
    let accepted = app.capture(&intent_id, "cap-1", &json!({})).await;
    let operation_id = accepted.operation_id().to_owned();
    let squatted = reqwest::Client::new()
        .post(format!("{}/v1/charges", app.provider.url))
        .bearer_auth(payments::provider::SANDBOX_MERCHANT_KEY)
        .header("idempotency-key", accepted.str("provider_idempotency_key"))
        .json(&json!({"amount_minor": 1, "currency": "EUR", "merchant_reference": "elsewhere"}))
        .send()
        .await
        .unwrap();
    assert_eq!(squatted.status(), reqwest::StatusCode::CREATED);

    app.deliver().await;
    let after_delivery = app.operation(&operation_id).await;
    app.reconcile().await;
    let after_reconciling = app.operation(&operation_id).await;
    let capture = app
        .get(&format!("/v1/captures/{}", accepted.str("id")), ACME_AGENT)
        .await
        .json();

    assert_eq!(after_delivery["state"], "unknown", "{after_delivery}");
    assert_eq!(after_reconciling["state"], "unknown", "the 1-cent charge is not ours");
    assert_eq!(capture["state"], "unknown");
    assert_eq!(capture["provider_charge_id"], serde_json::Value::Null);
    assert_eq!(
        outbox::event_of(&app.db.db, "acme", &operation_id).await.unwrap(),
        Some((EventState::Unknown, 1)),
        "asked about again later, never sent again"
    );
    let stats = app.provider.stats();
    assert_eq!(
        (stats.requests, stats.charges_made),
        (2, 1),
        "only the squatter's charge"
    );
}

async fn a_capture_is_refused_unless_its_intent_waits_for_one_and_a_refusal_before_the_claim_claims_nothing(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.intent_for("order-1", "40.00").await;

    let too_much = app.capture(&intent_id, "cap-1", &json!({"amount": "40.01"})).await;
    let no_such_intent = app.capture("pi_missing", "cap-1", &json!({})).await;
    let number = app.capture(&intent_id, "cap-1", &json!({"amount": 40})).await;
    let first = app.capture(&intent_id, "cap-1", &json!({"amount": "40.00"})).await;
    let second = app.capture(&intent_id, "cap-2", &json!({})).await;
    let cancelled_id = app.intent_for("order-2", "10.00").await;
    let cancel = app
        .post_without_key(&format!("/v1/payment_intents/{cancelled_id}/cancel"))
        .await;
    let on_cancelled = app.capture(&cancelled_id, "cap-3", &json!({})).await;

    assert_eq!(too_much.status, StatusCode::BAD_REQUEST);
    assert_eq!(too_much.json()["errors"][0]["field"], "amount");
    assert_eq!(no_such_intent.status, StatusCode::NOT_FOUND);
    assert_eq!(number.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        first.status,
        StatusCode::ACCEPTED,
        "the refusals claimed nothing: the key still works: {:?}",
        first.body
    );
    assert_eq!(cancel.status, StatusCode::OK);
    for refused in [&second, &on_cancelled] {
        assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
        assert_eq!(refused.json()["code"], "invalid_state");
    }
    assert_eq!(app.count("payment_captures").await, 1);
    assert_eq!(
        app.count("idempotency_outbox").await,
        1,
        "a refused capture sends nothing"
    );
}

async fn sixteen_racing_captures_of_one_intent_start_exactly_one_charge(backend: Backend) {
    let app = Arc::new(TestApp::spawn(backend).await);
    let intent_id = app.intent_for("order-1", "40.00").await;

    let racers = join_all((0..16).map(|n| {
        let (app, intent_id) = (app.clone(), intent_id.clone());
        tokio::spawn(async move { app.capture(&intent_id, &format!("cap-{n}"), &json!({})).await })
    }))
    .await;
    app.deliver().await;

    let answers: Vec<_> = racers.into_iter().map(|r| r.unwrap()).collect();
    let accepted = answers.iter().filter(|a| a.status == StatusCode::ACCEPTED).count();
    assert_eq!(accepted, 1, "exactly one capture started");
    for refused in answers.iter().filter(|a| a.status != StatusCode::ACCEPTED) {
        assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
        assert_eq!(refused.json()["code"], "invalid_state");
    }
    assert_eq!(app.count("payment_captures").await, 1);
    assert_eq!(app.provider.stats().charges_made, 1);
}

async fn an_omitted_amount_is_the_whole_amount_with_one_fingerprint_and_a_partial_capture_takes_less(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let whole_id = app.intent_for("order-1", "12.50").await;
    let partial_id = app.intent_for("order-2", "12.50").await;

    let omitted = app.capture(&whole_id, "cap-1", &json!({})).await;
    let explicit = app.capture(&whole_id, "cap-1", &json!({"amount": "12.5"})).await;
    let partial = app.capture(&partial_id, "cap-2", &json!({"amount": "5.00"})).await;
    app.deliver().await;

    assert_eq!(omitted.json()["amount_minor"], 1250);
    assert_eq!(
        explicit.replayed(),
        Some("true"),
        "`{{}}` and the whole amount are one request: {:?}",
        explicit.body
    );
    assert_eq!(partial.json()["amount"], "5.00");
    let charges = app
        .provider
        .charges_with_key(&partial.str("provider_idempotency_key"))
        .await;
    assert_eq!(
        charges["data"][0]["amount_minor"], 500,
        "the rest of the intent is released"
    );
}

async fn four_outbox_workers_racing_on_one_database_send_each_charge_once(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let mut operations = Vec::new();
    for n in 0..20 {
        let intent_id = app.intent_for(&format!("order-{n}"), "7.00").await;
        let accepted = app.capture(&intent_id, &format!("cap-{n}"), &json!({})).await;
        operations.push(accepted.operation_id().to_owned());
    }

    // four workers — as if in four processes — take one event at a time from one
    // outbox (on SQLite their takes queue for its one writer; on PostgreSQL they
    // really overlap, and SKIP LOCKED and the re-checked condition keep them apart)
    let workers = join_all((0..4).map(|_| {
        let outbox = app.another_outbox(OutboxConfig {
            batch: 1,
            ..crate::support::outbox_config()
        });
        tokio::spawn(async move {
            let mut taken = 0;
            loop {
                match outbox.deliver_due().await.unwrap() {
                    0 => return taken,
                    n => taken += n,
                }
            }
        })
    }))
    .await;

    let taken: usize = workers.into_iter().map(|w| w.unwrap()).sum();
    assert_eq!(taken, 20, "every event was taken by exactly one worker");
    let stats = app.provider.stats();
    assert_eq!((stats.requests, stats.charges_made), (20, 20), "each charge sent once");
    for operation_id in &operations {
        assert_eq!(
            outbox::event_of(&app.db.db, "acme", operation_id).await.unwrap(),
            Some((EventState::Delivered, 1))
        );
        assert_eq!(app.operation(operation_id).await["state"], "completed");
    }
}

/// The benchmark's baseline switch turns the layer off; work for the outbox
/// needs its operation, so such a route refuses rather than never sending it.
async fn with_the_idempotency_layer_off_a_capture_is_refused_and_nothing_is_left_unsent(backend: Backend) {
    let app = TestApp::spawn_configured(
        backend,
        payments::domain::PaymentsPolicy::default(),
        idempotency::IdempotencyConfig {
            enabled: false,
            ..Default::default()
        },
    )
    .await;
    let intent_id = app.intent_for("order-1", "10.00").await;

    let capture = app.capture(&intent_id, "cap-1", &json!({})).await;

    assert_eq!(capture.status, StatusCode::INTERNAL_SERVER_ERROR, "{:?}", capture.body);
    assert_eq!(app.count("payment_captures").await, 0, "nothing committed");
    let intent = app
        .get(&format!("/v1/payment_intents/{intent_id}"), ACME_AGENT)
        .await
        .json();
    assert_eq!(intent["state"], "requires_capture");
}

async fn another_account_can_neither_see_nor_capture_an_intent(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let intent_id = app.captured_intent("order-1", "10.00").await;
    let capture_id = app
        .get(&format!("/v1/payment_intents/{intent_id}"), ACME_AGENT)
        .await
        .str("capture_id");

    let capture = app
        .post(
            &format!("/v1/payment_intents/{intent_id}/capture"),
            GLOBEX_AGENT,
            "cap-x",
            &json!({}),
        )
        .await;
    let refund = app
        .post(
            &format!("/v1/payment_intents/{intent_id}/refunds"),
            GLOBEX_AGENT,
            "refund-x",
            &json!({"amount": "1.00"}),
        )
        .await;
    let seen = app.get(&format!("/v1/captures/{capture_id}"), GLOBEX_AGENT).await;
    let listed = app
        .get(&format!("/v1/payment_intents/{intent_id}/captures"), GLOBEX_AGENT)
        .await;

    for answer in [&capture, &refund, &seen, &listed] {
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{:?}", answer.body);
    }
    assert_eq!(app.count("payment_refunds").await, 0);
}

platform::both_backends!(
    four_outbox_workers_racing_on_one_database_send_each_charge_once,
    while_the_outbox_delivers_a_capture_its_operation_shows_the_stored_202_every_retry_gets,
    a_capture_answers_202_and_the_outbox_charges_the_provider_once_with_a_key_derived_from_the_request,
    a_lost_provider_answer_leaves_the_capture_unknown_until_the_reconciler_finds_the_one_charge,
    a_provider_that_fails_before_accepting_is_asked_and_then_sent_the_same_request_again,
    an_answer_that_may_mean_still_processing_leaves_the_capture_unknown_and_the_order_taken_until_the_reconciler_finds_the_one_charge,
    a_charge_the_provider_declines_fails_the_capture_and_frees_the_order,
    a_key_collision_at_the_provider_is_never_taken_for_the_capture_s_charge,
    another_account_can_neither_see_nor_capture_an_intent,
    with_the_idempotency_layer_off_a_capture_is_refused_and_nothing_is_left_unsent,
    a_capture_is_refused_unless_its_intent_waits_for_one_and_a_refusal_before_the_claim_claims_nothing,
    sixteen_racing_captures_of_one_intent_start_exactly_one_charge,
    an_omitted_amount_is_the_whole_amount_with_one_fingerprint_and_a_partial_capture_takes_less,
);

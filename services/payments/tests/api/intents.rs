//! Payment intents through the API: money in minor units, one live intent
//! per order under racing keys, cancellation.

use std::sync::Arc;

use axum::{
    body::Body,
    http::{Request, StatusCode},
};
use futures::future::join_all;
use platform::{Backend, on_pool};
use serde_json::json;

use crate::support::{ACME_AGENT, ACME_APPROVER, GLOBEX_AGENT, TestApp, TestResponse, intent};

async fn an_intent_shows_its_amount_as_a_string_and_in_minor_units_and_a_retry_replays_it(backend: Backend) {
    let app = TestApp::spawn(backend).await;

    let first = app
        .post(
            "/v1/payment_intents",
            ACME_AGENT,
            "k1",
            &intent("order-1", json!("12.5")),
        )
        .await;
    let again = app
        .post(
            "/v1/payment_intents",
            ACME_AGENT,
            "k1",
            &intent("order-1", json!("12.50")),
        )
        .await;

    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let body = first.json();
    assert_eq!(body["amount"], "12.50");
    assert_eq!(body["amount_minor"], 1250);
    assert_eq!(body["currency"], "EUR");
    assert_eq!(body["state"], "requires_capture");
    assert!(body["id"].as_str().unwrap().starts_with("pi_"));
    assert_eq!(again.replayed(), Some("true"), "12.5 and 12.50 EUR are one request");
    assert_eq!(again.body, first.body);
    assert_eq!(app.count("payment_intents").await, 1);
}

async fn an_amount_sent_as_a_json_number_claims_nothing_and_the_key_then_works(backend: Backend) {
    let app = TestApp::spawn(backend).await;

    let number = app
        .post("/v1/payment_intents", ACME_AGENT, "k1", &intent("order-1", json!(12.5)))
        .await;
    let precise = app
        .post(
            "/v1/payment_intents",
            ACME_AGENT,
            "k1",
            &intent("order-1", json!("12.505")),
        )
        .await;
    let fixed = app
        .post(
            "/v1/payment_intents",
            ACME_AGENT,
            "k1",
            &intent("order-1", json!("12.50")),
        )
        .await;

    for refused in [&number, &precise] {
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
        assert_eq!(refused.json()["code"], "invalid_request");
        assert_eq!(refused.json()["errors"][0]["field"], "amount", "{:?}", refused.body);
    }
    assert_eq!(fixed.status, StatusCode::CREATED, "nothing was claimed by the 400s");
}

async fn sixteen_racing_keys_for_one_order_make_one_live_intent(backend: Backend) {
    let app = Arc::new(TestApp::spawn(backend).await);

    let racers = join_all((0..16).map(|n| {
        let app = app.clone();
        tokio::spawn(async move {
            app.post(
                "/v1/payment_intents",
                ACME_AGENT,
                &format!("key-{n}"),
                &intent("order-1", json!("99.00")),
            )
            .await
        })
    }))
    .await;

    let answers: Vec<TestResponse> = racers.into_iter().map(|r| r.unwrap()).collect();
    let created: Vec<&TestResponse> = answers.iter().filter(|a| a.status == StatusCode::CREATED).collect();
    assert_eq!(created.len(), 1, "exactly one key made the intent");
    let winner = created[0].json()["id"].clone();
    for refused in answers.iter().filter(|a| a.status != StatusCode::CREATED) {
        assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
        assert_eq!(refused.json()["code"], "order_already_has_payment");
        assert_eq!(
            refused.json()["payment_intent_id"],
            winner,
            "the 409 names the live intent"
        );
    }
    assert_eq!(app.count("payment_intents").await, 1);
}

async fn a_cancelled_intent_frees_its_order_and_cancelling_it_again_answers_it_unchanged(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app.create("k1", "order-1").await.json();
    let cancel = format!("/v1/payment_intents/{}/cancel", first["id"].as_str().unwrap());

    let cancelled = app.post(&cancel, ACME_AGENT, "cancel-1", &json!({})).await;
    let replayed = app.post(&cancel, ACME_AGENT, "cancel-1", &json!({})).await;
    let again = app.post(&cancel, ACME_AGENT, "cancel-2", &json!({})).await;
    let keyless = app.post_without_key(&cancel).await;
    let next = app.create("k2", "order-1").await;

    assert_eq!(cancelled.status, StatusCode::OK, "{:?}", cancelled.body);
    assert_eq!(cancelled.json()["state"], "cancelled");
    assert_eq!(replayed.replayed(), Some("true"));
    for repeat in [&again, &keyless] {
        assert_eq!(
            repeat.status,
            StatusCode::OK,
            "cancelling what is cancelled is a no-op: {:?}",
            repeat.body
        );
        assert_eq!(repeat.json()["updated_at"], cancelled.json()["updated_at"], "unchanged");
    }
    assert_eq!(next.status, StatusCode::CREATED, "a cancelled intent frees its order");
    let by_order = app.get("/v1/payment_intents?order_id=order-1", ACME_AGENT).await.json();
    assert_eq!(by_order["data"].as_array().unwrap().len(), 2);
}

async fn another_account_can_neither_see_nor_cancel_an_intent(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let ours = app
        .post(
            "/v1/payment_intents",
            ACME_AGENT,
            "k1",
            &intent("order-1", json!("5.00")),
        )
        .await
        .json();
    let id = ours["id"].as_str().unwrap();

    let seen = app.get(&format!("/v1/payment_intents/{id}"), GLOBEX_AGENT).await;
    let cancelled = app
        .post(
            &format!("/v1/payment_intents/{id}/cancel"),
            GLOBEX_AGENT,
            "c1",
            &json!({}),
        )
        .await;
    let listed = app
        .get("/v1/payment_intents?order_id=order-1", GLOBEX_AGENT)
        .await
        .json();
    let theirs = app
        .post(
            "/v1/payment_intents",
            GLOBEX_AGENT,
            "k1",
            &intent("order-1", json!("5.00")),
        )
        .await;

    assert_eq!(seen.status, StatusCode::NOT_FOUND);
    assert_eq!(cancelled.status, StatusCode::NOT_FOUND);
    assert_eq!(listed["data"], json!([]));
    assert_eq!(
        theirs.status,
        StatusCode::CREATED,
        "orders and keys belong to their account"
    );
    assert_eq!(
        app.get(&format!("/v1/payment_intents/{id}"), ACME_AGENT).await.json()["state"],
        "requires_capture"
    );
}

async fn a_cancel_needs_no_key_and_one_past_requires_capture_is_refused(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app.create("k1", "order-1").await.json();
    let id = first["id"].as_str().unwrap().to_owned();
    let cancel = format!("/v1/payment_intents/{id}/cancel");

    let cancelled = app.post_without_key(&cancel).await;
    // an intent past requires_capture (a capture on its way) cannot be cancelled
    on_pool!(app.db.db.write(), |pool| {
        sqlx::query("UPDATE payment_intents SET state = 'processing' WHERE id = $1")
            .bind(&id)
            .execute(pool)
            .await
            .unwrap();
    });
    let refused = app.post_without_key(&cancel).await;

    assert_eq!(cancelled.status, StatusCode::OK, "{:?}", cancelled.body);
    assert_eq!(cancelled.json()["state"], "cancelled");
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert_eq!(refused.json()["code"], "invalid_state");
}

async fn creates_racing_a_cancel_of_the_order_s_intent_are_told_which_intent_is_live(backend: Backend) {
    let app = Arc::new(TestApp::spawn(backend).await);
    for round in 0..5 {
        let order = format!("order-{round}");
        let first = app.create(&format!("first-{round}"), &order).await.json();
        let cancel = format!("/v1/payment_intents/{}/cancel", first["id"].as_str().unwrap());

        let canceller = {
            let app = app.clone();
            tokio::spawn(async move { app.post_without_key(&cancel).await })
        };
        let creators = join_all((0..8).map(|n| {
            let (app, order) = (app.clone(), order.clone());
            tokio::spawn(async move { app.create(&format!("racer-{round}-{n}"), &order).await })
        }))
        .await;

        assert_eq!(canceller.await.unwrap().status, StatusCode::OK);
        for answer in creators.into_iter().map(|c| c.unwrap()) {
            assert!(
                answer.status == StatusCode::CREATED || answer.json()["code"] == "order_already_has_payment",
                "a create racing the cancel is created or told the live intent, never a 500: {:?}",
                answer.body
            );
        }
        let live = app
            .get(&format!("/v1/payment_intents?order_id={order}"), ACME_AGENT)
            .await
            .json();
        let live = live["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["state"] == "requires_capture")
            .count();
        assert!(live <= 1, "at most one live intent per order");
    }
}

async fn an_amount_above_ten_to_the_fifteen_minor_units_is_refused_naming_amount_and_claims_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;

    // As doubles, these two are one number: a fingerprint would not tell them apart.
    let huge = app
        .post(
            "/v1/payment_intents",
            ACME_AGENT,
            "k1",
            &intent("order-1", json!("92233720368547758.07")),
        )
        .await;
    let other_huge = app
        .post(
            "/v1/payment_intents",
            ACME_AGENT,
            "k1",
            &intent("order-1", json!("92233720368547755.00")),
        )
        .await;
    let fixed = app
        .post(
            "/v1/payment_intents",
            ACME_AGENT,
            "k1",
            &intent("order-1", json!("12.50")),
        )
        .await;

    for refused in [&huge, &other_huge] {
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{:?}", refused.body);
        assert_eq!(refused.json()["code"], "invalid_request");
        assert_eq!(refused.json()["errors"][0]["field"], "amount", "{:?}", refused.body);
        assert_eq!(refused.replayed(), None);
    }
    assert_eq!(fixed.status, StatusCode::CREATED, "nothing was claimed by the 400s");
    assert_eq!(fixed.json()["amount_minor"], 1250);
    assert_eq!(app.count("payment_intents").await, 1);
}

async fn an_intent_takes_at_most_ten_to_the_fifteen_minor_units(backend: Backend) {
    let app = TestApp::spawn(backend).await;

    let at_the_limit = app
        .post(
            "/v1/payment_intents",
            ACME_AGENT,
            "k1",
            &intent("order-1", json!("10000000000000.00")),
        )
        .await;
    let one_cent_more = app
        .post(
            "/v1/payment_intents",
            ACME_AGENT,
            "k2",
            &intent("order-2", json!("10000000000000.01")),
        )
        .await;

    assert_eq!(at_the_limit.status, StatusCode::CREATED, "{:?}", at_the_limit.body);
    assert_eq!(at_the_limit.json()["amount_minor"], 1_000_000_000_000_000_i64);
    assert_eq!(
        one_cent_more.status,
        StatusCode::BAD_REQUEST,
        "{:?}",
        one_cent_more.body
    );
    assert_eq!(one_cent_more.json()["errors"][0]["field"], "amount");
}

async fn a_payee_naming_a_member_twice_is_400_naming_it_and_claims_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let post = |body: &'static str| {
        app.send(
            Request::post("/v1/payment_intents")
                .header("authorization", format!("Bearer {ACME_AGENT}"))
                .header("content-type", "application/json")
                .header("idempotency-key", "k1")
                .body(Body::from(body))
                .unwrap(),
        )
    };

    let ambiguous = post(
        r#"{"order_id":"order-1","amount":"5.00","currency":"EUR",
            "payee":{"name":"Acme Supplies GmbH","account":"DE89370400440532013000","name":"Mallory Ltd"}}"#,
    )
    .await;
    let fixed = post(
        r#"{"order_id":"order-1","amount":"5.00","currency":"EUR",
            "payee":{"name":"Acme Supplies GmbH","account":"DE89370400440532013000"}}"#,
    )
    .await;

    assert_eq!(ambiguous.status, StatusCode::BAD_REQUEST);
    assert_eq!(ambiguous.json()["code"], "invalid_request");
    assert_eq!(
        ambiguous.json()["errors"][0]["field"],
        "payee.name",
        "{:?}",
        ambiguous.body
    );
    assert_eq!(fixed.status, StatusCode::CREATED, "nothing was claimed by the 400");
}

/// A cancel with no key leaves no operation behind, but the journal still
/// says who cancelled which intent, through which route; cancelling it again
/// changes nothing and journals nothing.
async fn a_cancel_without_a_key_is_journaled_with_its_principal_route_and_new_state(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let id = app.create("k1", "order-1").await.str("id");
    let cancel = format!("/v1/payment_intents/{id}/cancel");

    let cancelled = app.post_without_key(&cancel).await;
    let again = app.post_without_key(&cancel).await;
    let page = app.get("/v1/audit?event=state_changed", ACME_APPROVER).await.json();

    assert_eq!((cancelled.status, again.status), (StatusCode::OK, StatusCode::OK));
    let entries = page["data"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "the second cancel changed nothing: {entries:?}");
    let entry = &entries[0];
    assert_eq!(entry["principal_id"], "acme-agent");
    assert_eq!(entry["route"], "/v1/payment_intents/{intent_id}/cancel");
    assert_eq!(
        (&entry["resource_type"], &entry["resource_id"], &entry["state"]),
        (&json!("payment_intent"), &json!(id), &json!("cancelled"))
    );
}

platform::both_backends!(
    a_payee_naming_a_member_twice_is_400_naming_it_and_claims_nothing,
    a_cancel_without_a_key_is_journaled_with_its_principal_route_and_new_state,
    creates_racing_a_cancel_of_the_order_s_intent_are_told_which_intent_is_live,
    an_intent_shows_its_amount_as_a_string_and_in_minor_units_and_a_retry_replays_it,
    an_amount_sent_as_a_json_number_claims_nothing_and_the_key_then_works,
    sixteen_racing_keys_for_one_order_make_one_live_intent,
    a_cancelled_intent_frees_its_order_and_cancelling_it_again_answers_it_unchanged,
    a_cancel_needs_no_key_and_one_past_requires_capture_is_refused,
    another_account_can_neither_see_nor_cancel_an_intent,
    an_amount_above_ten_to_the_fifteen_minor_units_is_refused_naming_amount_and_claims_nothing,
    an_intent_takes_at_most_ten_to_the_fifteen_minor_units,
);

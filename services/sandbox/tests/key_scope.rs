//! A key's scope is the account and the service (docs/contract.md §1): each
//! service keeps its own operations in its own database, so one key sent to
//! two services of one account is two unrelated operations, and each service
//! answers only for the keys sent to it.

use axum::http::StatusCode;
use idempotency::IdempotencyConfig;
use platform::{
    Backend,
    testing::{ACME_AGENT, TestClient, TestDb},
};
use serde_json::json;

async fn one_key_sent_to_two_services_of_one_account_is_two_unrelated_operations(backend: Backend) {
    let (tickets_db, payments_db) = (TestDb::new(backend).await, TestDb::new(backend).await);
    tickets::migrate(&tickets_db.db).await.unwrap();
    payments::migrate(&payments_db.db).await.unwrap();
    let tickets = TestClient::new(tickets::build_router(tickets::App::new(
        tickets_db.db.clone(),
        IdempotencyConfig::default(),
        true,
    )));
    let payments = TestClient::new(payments::build_router(payments::App::new(
        payments_db.db.clone(),
        IdempotencyConfig::default(),
        true,
        payments::provider::ProviderConfig::default(),
    )));
    let key = "81b59b1a-9e75-4de7-a53b-1bb50969c83c";
    let lookup = format!("/v1/operations?idempotency_key={key}");

    let not_yet_at_payments = payments.get(&lookup, ACME_AGENT).await;
    let ticket = tickets
        .post(
            "/v1/tickets",
            ACME_AGENT,
            Some(key),
            json!({"project": "ops", "title": "Rotate staging certificate"}),
        )
        .await;
    let still_not_at_payments = payments.get(&lookup, ACME_AGENT).await;
    let intent = payments
        .post(
            "/v1/payment_intents",
            ACME_AGENT,
            Some(key),
            json!({"order_id": "order-1", "amount": "12.50", "currency": "EUR",
                   "payee": {"name": "Acme Supplies GmbH", "account": "DE89370400440532013000"}}),
        )
        .await;
    let at_tickets = tickets.get(&lookup, ACME_AGENT).await.json();
    let at_payments = payments.get(&lookup, ACME_AGENT).await.json();

    assert_eq!(not_yet_at_payments.json()["data"], json!([]));
    assert_eq!(ticket.status, StatusCode::CREATED, "{:?}", ticket.body);
    assert_eq!(
        still_not_at_payments.json()["data"],
        json!([]),
        "payments never saw the key tickets claimed"
    );
    assert_eq!(
        intent.status,
        StatusCode::CREATED,
        "a new operation at payments, neither a replay of the ticket nor 422: {:?}",
        intent.body
    );
    assert_eq!(intent.replayed(), Some("false"));
    assert_eq!(at_tickets["data"][0]["route"], "/v1/tickets");
    assert_eq!(at_payments["data"][0]["route"], "/v1/payment_intents");
    assert_ne!(
        at_tickets["data"][0]["operation_id"],
        at_payments["data"][0]["operation_id"]
    );
}

platform::both_backends!(one_key_sent_to_two_services_of_one_account_is_two_unrelated_operations);

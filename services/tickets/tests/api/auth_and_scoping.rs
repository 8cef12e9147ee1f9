//! Bearer keys and accounts: every record belongs to one account
//! (docs/contract.md §1, §4).

use axum::{body::Body, http::Request};
use platform::{Authenticator, Backend, Principal, Role};

use crate::support::*;

async fn a_missing_or_unknown_bearer_key_is_401_with_a_bearer_challenge(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let anonymous = app
        .send(
            Request::post("/v1/tickets")
                .header("content-type", "application/json")
                .header("idempotency-key", "key-1")
                .body(Body::from(ROTATE_CERT))
                .unwrap(),
        )
        .await;
    let unknown = app.post("/v1/tickets", "not-a-key", Some("key-1"), ROTATE_CERT).await;

    anonymous.assert_problem(401, "unauthenticated");
    unknown.assert_problem(401, "unauthenticated");
    assert_eq!(app.ticket_count().await, 0);
    // RFC 6750 §3: the challenge asks for a key, and says when the one sent is what failed
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
    assert_eq!(
        unknown.header("www-authenticate"),
        Some(r#"Bearer error="invalid_token""#)
    );
}

async fn a_created_api_key_authenticates_and_only_its_hash_is_stored(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let principal = Principal {
        account_id: "initech".into(),
        principal_id: "bot-7".into(),
        role: Role::Agent,
    };
    let key = Authenticator::new(app.db.db.clone(), false)
        .create_key(&principal)
        .await
        .unwrap();

    let created = app.post("/v1/tickets", key.expose(), Some("key-1"), ROTATE_CERT).await;

    assert_eq!(created.status, 201);
    assert_eq!(app.count("SELECT COUNT(*) FROM api_keys").await, 1);
    let stored: String = platform::on_pool!(app.db.db.read(), |pool| sqlx::query_scalar(
        "SELECT key_hash FROM api_keys"
    )
    .fetch_one(pool)
    .await
    .unwrap());
    assert_ne!(stored, key.expose());
    assert_eq!(stored, key.hash());
}

async fn demo_keys_exist_only_in_sandbox_mode(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let outside_sandbox = Authenticator::new(app.db.db.clone(), false);
    let result = outside_sandbox
        .authenticate(&platform::auth::ApiKey::new(ACME_AGENT))
        .await;
    assert_eq!(result.unwrap_err().code(), "unauthenticated");
}

async fn the_same_key_in_two_accounts_is_two_operations(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let acme = app
        .post("/v1/tickets", ACME_AGENT, Some("shared-key"), ROTATE_CERT)
        .await;
    let globex = app
        .post(
            "/v1/tickets",
            GLOBEX_AGENT,
            Some("shared-key"),
            r#"{"project":"web","title":"Another intention"}"#,
        )
        .await;

    assert_eq!(acme.status, 201);
    assert_eq!(
        globex.status, 201,
        "not a key reuse: the key belongs to another account"
    );
    assert_eq!(globex.replayed(), Some("false"));
    assert_ne!(acme.operation_id(), globex.operation_id());
    assert_eq!(app.ticket_count().await, 2);
}

async fn another_accounts_ticket_and_operation_are_404(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let created = app.create_ticket("key-1", ROTATE_CERT).await;
    let ticket_id = created.json()["id"].as_str().unwrap().to_owned();

    app.get(&format!("/v1/tickets/{ticket_id}"), GLOBEX_AGENT)
        .await
        .assert_problem(404, "not_found");
    app.get(&format!("/v1/operations/{}", created.operation_id()), GLOBEX_AGENT)
        .await
        .assert_problem(404, "not_found");
    assert_eq!(
        app.get("/v1/operations?idempotency_key=key-1", GLOBEX_AGENT)
            .await
            .json()["data"],
        serde_json::json!([])
    );
    assert_eq!(
        app.get("/v1/tickets", GLOBEX_AGENT).await.json()["data"],
        serde_json::json!([])
    );
    app.post(
        &format!("/v1/tickets/{ticket_id}/comments"),
        GLOBEX_AGENT,
        Some("c-1"),
        r#"{"body":"mine now"}"#,
    )
    .await
    .assert_problem(404, "not_found");
    let status = app
        .send(json_request(
            axum::http::Method::PUT,
            &format!("/v1/tickets/{ticket_id}/status"),
            GLOBEX_AGENT,
            None,
            r#"{"status":"closed"}"#,
        ))
        .await;
    status.assert_problem(404, "not_found");
    assert_eq!(
        app.get(&format!("/v1/tickets/{ticket_id}"), ACME_AGENT).await.json()["status"],
        "open"
    );
}

async fn the_bearer_scheme_is_case_insensitive(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let response = app
        .send(
            Request::get("/v1/tickets")
                .header("authorization", format!("BEARER {ACME_AGENT}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(response.status, 200);
}

platform::both_backends!(
    the_bearer_scheme_is_case_insensitive,
    a_missing_or_unknown_bearer_key_is_401_with_a_bearer_challenge,
    a_created_api_key_authenticates_and_only_its_hash_is_stored,
    demo_keys_exist_only_in_sandbox_mode,
    the_same_key_in_two_accounts_is_two_operations,
    another_accounts_ticket_and_operation_are_404,
);

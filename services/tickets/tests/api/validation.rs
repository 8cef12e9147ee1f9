//! Bad input gets a clear problem+json answer and claims nothing
//! (docs/contract.md §1).

use axum::{body::Body, http::Request};
use platform::Backend;
use serde_json::json;

use crate::support::*;

async fn a_create_without_a_key_is_400_idempotency_key_missing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let response = app.post("/v1/tickets", ACME_AGENT, None, ROTATE_CERT).await;

    response.assert_problem(400, "idempotency_key_missing");
    assert_eq!(app.ticket_count().await, 0);
}

async fn keys_of_256_characters_or_with_spaces_are_400_idempotency_key_invalid(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let too_long = app.create_ticket(&"k".repeat(256), ROTATE_CERT).await;
    let spaced = app.create_ticket("\"two words\"", ROTATE_CERT).await;
    let longest = app.create_ticket(&"k".repeat(255), ROTATE_CERT).await;

    too_long.assert_problem(400, "idempotency_key_invalid");
    spaced.assert_problem(400, "idempotency_key_invalid");
    assert_eq!(longest.status, 201);
    assert_eq!(app.ticket_count().await, 1);
}

async fn a_request_that_fails_validation_claims_nothing_and_the_key_works_with_a_fixed_body(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let invalid = app.create_ticket("key-1", r#"{"project":"ops","title":""}"#).await;

    invalid.assert_problem(400, "invalid_request");
    assert_eq!(
        invalid.json()["errors"],
        json!([{"field": "title", "message": "must not be blank"}])
    );
    assert!(invalid.header("operation-id").is_none(), "no operation exists");
    let operations = app.get("/v1/operations?idempotency_key=key-1", ACME_AGENT).await.json();
    assert_eq!(operations["data"], json!([]));

    let fixed = app.create_ticket("key-1", ROTATE_CERT).await;
    assert_eq!(fixed.status, 201);
    assert_eq!(fixed.replayed(), Some("false"));
}

async fn an_unknown_field_is_400_invalid_request_naming_the_field(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let response = app
        .create_ticket("key-1", r#"{"project":"ops","title":"x","colour":"red"}"#)
        .await;

    response.assert_problem(400, "invalid_request");
    assert_eq!(response.json()["errors"][0]["field"], "colour");
    assert_eq!(app.count("SELECT COUNT(*) FROM idempotency_operations").await, 0);
}

async fn every_failed_field_is_listed_with_its_message(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let long_title = "t".repeat(201);
    let body = json!({"project": "   ", "title": long_title, "labels": ["ok", ""]}).to_string();
    let response = app.create_ticket("key-1", &body).await;

    response.assert_problem(400, "invalid_request");
    let fields: Vec<_> = response.json()["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(fields, ["labels", "project", "title"]);
}

async fn a_body_with_several_fields_wrong_lists_every_one_and_the_key_works_with_a_fixed_body(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    // a wrong type, an unknown priority, an unknown member, and `project` missing
    let response = app
        .create_ticket("key-1", r#"{"title":42,"priority":"asap","colour":"red"}"#)
        .await;

    response.assert_problem(400, "invalid_request");
    let fields: Vec<_> = response.json()["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(fields, ["colour", "priority", "project", "title"]);
    assert_eq!(app.count("SELECT COUNT(*) FROM idempotency_operations").await, 0);
    let fixed = app.create_ticket("key-1", ROTATE_CERT).await;
    assert_eq!(fixed.status, 201, "the key was left unclaimed");
}

async fn a_wrong_type_or_an_unknown_priority_is_400_naming_the_field(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let wrong_type = app.create_ticket("key-1", r#"{"project":"ops","title":42}"#).await;
    let bad_priority = app
        .create_ticket("key-2", r#"{"project":"ops","title":"x","priority":"asap"}"#)
        .await;
    let missing = app.create_ticket("key-3", r#"{"project":"ops"}"#).await;

    wrong_type.assert_problem(400, "invalid_request");
    assert_eq!(wrong_type.json()["errors"][0]["field"], "title");
    bad_priority.assert_problem(400, "invalid_request");
    assert_eq!(bad_priority.json()["errors"][0]["field"], "priority");
    missing.assert_problem(400, "invalid_request");
    assert_eq!(missing.json()["errors"][0]["field"], "title");
}

async fn a_body_that_is_not_json_is_400_and_a_non_json_content_type_is_415(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let broken = app.create_ticket("key-1", r#"{"project":"ops","#).await;
    let text = app
        .send(
            Request::post("/v1/tickets")
                .header("authorization", format!("Bearer {ACME_AGENT}"))
                .header("content-type", "text/plain")
                .header("idempotency-key", "key-2")
                .body(Body::from(ROTATE_CERT))
                .unwrap(),
        )
        .await;

    broken.assert_problem(400, "invalid_request");
    text.assert_problem(415, "unsupported_media_type");
    assert_eq!(app.count("SELECT COUNT(*) FROM idempotency_operations").await, 0);
}

async fn a_body_naming_a_member_twice_is_400_naming_it_and_claims_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let ambiguous = app
        .create_ticket("key-1", r#"{"project":"ops","title":"a","title":"b"}"#)
        .await;

    ambiguous.assert_problem(400, "invalid_request");
    assert_eq!(ambiguous.json()["errors"][0]["field"], "title");
    assert_eq!(app.count("SELECT COUNT(*) FROM idempotency_operations").await, 0);
    let fixed = app.create_ticket("key-1", ROTATE_CERT).await;
    assert_eq!(fixed.status, 201, "the key was left unclaimed");
}

async fn a_body_nested_too_deep_is_400_saying_so(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let deep = format!(
        r#"{{"project":"ops","title":"x","labels":{}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let response = app.create_ticket("key-1", &deep).await;

    response.assert_problem(400, "invalid_request");
    let detail = response.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("nested too deep"), "{detail}");
    assert_eq!(app.count("SELECT COUNT(*) FROM idempotency_operations").await, 0);
}

async fn a_json_body_declared_in_a_charset_other_than_utf8_is_415(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let send = |key: &'static str, content_type: &'static str| {
        app.send(
            Request::post("/v1/tickets")
                .header("authorization", format!("Bearer {ACME_AGENT}"))
                .header("content-type", content_type)
                .header("idempotency-key", key)
                .body(Body::from(ROTATE_CERT))
                .unwrap(),
        )
    };

    let latin1 = send("key-1", "application/json; charset=latin1").await;
    let utf8 = send("key-2", "application/json; charset=\"UTF-8\"").await;

    latin1.assert_problem(415, "unsupported_media_type");
    assert_eq!(utf8.status, 201);
    assert_eq!(app.ticket_count().await, 1);
}

async fn unknown_routes_and_methods_answer_in_problem_json(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    app.get("/v1/nothing-here", ACME_AGENT)
        .await
        .assert_problem(404, "not_found");
    let delete = app
        .send(
            Request::delete("/v1/tickets")
                .header("authorization", format!("Bearer {ACME_AGENT}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    delete.assert_problem(405, "method_not_allowed");
}

async fn a_quoted_key_that_holds_a_quote_is_one_operation_across_retries(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app.create_ticket(r#""\"abc""#, ROTATE_CERT).await;
    let again = app.create_ticket(r#""\"abc""#, ROTATE_CERT).await;
    let tricky = app.create_ticket(r#""\"x\"""#, ROTATE_CERT).await;

    assert_eq!(first.status, 201);
    assert_eq!(again.replayed(), Some("true"));
    assert_eq!(
        tricky.status, 201,
        "`\"x\"` unquotes to the key `\"x\"`, a key of its own"
    );
    // the lookup reads its key as the header is read: the same quoted form, percent-encoded
    let found = app
        .get("/v1/operations?idempotency_key=%22%5C%22abc%22", ACME_AGENT)
        .await
        .json();
    assert_eq!(found["data"][0]["operation_id"], first.operation_id());
    app.get("/v1/operations?idempotency_key=%22abc", ACME_AGENT)
        .await
        .assert_problem(400, "idempotency_key_invalid");
}

async fn a_nul_character_anywhere_is_refused_alike_on_both_backends(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let in_body = app
        .create_ticket("key-1", r#"{"project":"ops","title":"a\u0000b"}"#)
        .await;
    let in_label = app
        .create_ticket("key-2", r#"{"project":"ops","title":"x","labels":["ok","b\u0000"]}"#)
        .await;

    in_body.assert_problem(400, "invalid_request");
    assert_eq!(in_body.json()["errors"][0]["field"], "title");
    assert_eq!(in_label.json()["errors"][0]["field"], "labels[1]");
    app.get("/v1/tickets/%00", ACME_AGENT)
        .await
        .assert_problem(404, "not_found");
    app.get("/v1/operations/%00", ACME_AGENT)
        .await
        .assert_problem(404, "not_found");
    app.get("/v1/tickets?project=%00", ACME_AGENT)
        .await
        .assert_problem(400, "invalid_request");
    app.post(
        "/v1/tickets/%00/comments",
        ACME_AGENT,
        Some("key-3"),
        r#"{"body":"hi"}"#,
    )
    .await
    .assert_problem(404, "not_found");
    assert_eq!(
        app.count("SELECT COUNT(*) FROM idempotency_operations").await,
        0,
        "nothing was claimed"
    );
}

async fn a_path_that_is_not_utf8_is_404_in_problem_json(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    app.get("/v1/operations/%FF", ACME_AGENT)
        .await
        .assert_problem(404, "not_found");
    app.post("/v1/tickets/%FF/comments", ACME_AGENT, Some("k"), r#"{"body":"hi"}"#)
        .await
        .assert_problem(404, "not_found");
}

async fn a_body_that_is_not_a_json_object_is_400(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let array = app
        .create_ticket("key-1", r#"["ops","array body",null,"high",null,null]"#)
        .await;

    array.assert_problem(400, "invalid_request");
    assert_eq!(app.ticket_count().await, 0);
}

async fn a_body_over_64_kib_is_413_and_claims_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let body = json!({"project": "ops", "title": "big", "description": "x".repeat(70 * 1024)}).to_string();
    let response = app.create_ticket("key-1", &body).await;

    response.assert_problem(413, "payload_too_large");
    assert_eq!(app.count("SELECT COUNT(*) FROM idempotency_operations").await, 0);
}

async fn a_bad_query_parameter_is_named_in_the_errors(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let bad_limit = app.get("/v1/tickets?limit=abc", ACME_AGENT).await;
    let bad_status = app.get("/v1/tickets?status=bogus", ACME_AGENT).await;
    let paged = app.get("/v1/operations?idempotency_key=k&limit=5", ACME_AGENT).await;

    bad_limit.assert_problem(400, "invalid_request");
    assert_eq!(bad_limit.json()["errors"][0]["field"], "limit");
    assert_eq!(bad_status.json()["errors"][0]["field"], "status");
    assert_eq!(
        paged.status, 200,
        "the operations list takes limit and cursor like every list"
    );
}

platform::both_backends!(
    a_quoted_key_that_holds_a_quote_is_one_operation_across_retries,
    a_nul_character_anywhere_is_refused_alike_on_both_backends,
    a_path_that_is_not_utf8_is_404_in_problem_json,
    a_body_that_is_not_a_json_object_is_400,
    a_body_over_64_kib_is_413_and_claims_nothing,
    a_bad_query_parameter_is_named_in_the_errors,
    a_create_without_a_key_is_400_idempotency_key_missing,
    keys_of_256_characters_or_with_spaces_are_400_idempotency_key_invalid,
    a_request_that_fails_validation_claims_nothing_and_the_key_works_with_a_fixed_body,
    an_unknown_field_is_400_invalid_request_naming_the_field,
    every_failed_field_is_listed_with_its_message,
    a_body_with_several_fields_wrong_lists_every_one_and_the_key_works_with_a_fixed_body,
    a_wrong_type_or_an_unknown_priority_is_400_naming_the_field,
    a_body_that_is_not_json_is_400_and_a_non_json_content_type_is_415,
    unknown_routes_and_methods_answer_in_problem_json,
    a_body_naming_a_member_twice_is_400_naming_it_and_claims_nothing,
    a_body_nested_too_deep_is_400_saying_so,
    a_json_body_declared_in_a_charset_other_than_utf8_is_415,
);

//! Every row of docs/contract.md §3, through the tickets create.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use idempotency::{
    Fingerprint, IdempotencyKey, OperationState, StoredResponse,
    store::{self, Completion, NewOperation},
};
use platform::{Backend, Timestamp, on_pool};
use serde_json::json;
use tickets::domain::{CreateTicket, Priority};

use crate::support::*;

async fn first_attempt_creates_the_ticket_and_is_marked_not_replayed(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let response = app.create_ticket("key-1", ROTATE_CERT).await;

    assert_eq!(response.status, StatusCode::CREATED);
    assert_eq!(response.replayed(), Some("false"));
    assert!(response.operation_id().starts_with("op_"));
    let body = response.json();
    assert_eq!(body["outcome"], "created");
    assert_eq!(body["title"], "Rotate staging certificate");
    assert_eq!(body["priority"], "high");
    assert_eq!(body["status"], "open");
    assert!(body["id"].as_str().unwrap().starts_with("tkt_"));
    assert_eq!(
        response.header("location"),
        Some(format!("/v1/tickets/{}", body["id"].as_str().unwrap()).as_str())
    );
    assert_eq!(app.ticket_count().await, 1);
}

async fn same_key_and_body_replay_the_stored_answer_byte_for_byte(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app.create_ticket("key-1", ROTATE_CERT).await;
    let second = app.create_ticket("key-1", ROTATE_CERT).await;

    assert_eq!(second.status, first.status);
    assert_eq!(second.body, first.body, "the replay is the stored body, byte for byte");
    assert_eq!(second.header("content-type"), first.header("content-type"));
    assert_eq!(second.header("location"), first.header("location"));
    assert_eq!(second.operation_id(), first.operation_id());
    assert_eq!(second.replayed(), Some("true"));
    assert_eq!(app.ticket_count().await, 1);

    let operation = app
        .get(&format!("/v1/operations/{}", first.operation_id()), ACME_AGENT)
        .await
        .json();
    assert_eq!(operation["attempts"], 2);
    assert_eq!(operation["state"], "completed");
    assert_eq!(operation["response_status"], 201);
}

async fn an_equivalent_body_in_another_order_with_the_default_written_out_is_a_replay(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app
        .create_ticket("key-1", r#"{"project":"ops","title":"Renew the domain"}"#)
        .await;
    let reordered = app
        .create_ticket(
            "key-1",
            "{ \"title\" : \"Renew the domain\",\n \"priority\": \"normal\", \"project\":\"ops\", \"labels\": [] }",
        )
        .await;

    assert_eq!(reordered.replayed(), Some("true"));
    assert_eq!(reordered.body, first.body);
    assert_eq!(app.ticket_count().await, 1);
}

async fn same_key_with_a_changed_body_is_rejected_with_422_naming_only_the_operation_and_state(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app.create_ticket("key-1", ROTATE_CERT).await;
    let changed = app
        .create_ticket(
            "key-1",
            r#"{"project":"ops","title":"Rotate PRODUCTION certificate","priority":"high"}"#,
        )
        .await;

    changed.assert_problem(422, "idempotency_key_reused");
    let body = changed.json();
    assert_eq!(body["operation_id"], first.operation_id());
    assert_eq!(body["state"], "completed");
    let mut members: Vec<_> = body.as_object().unwrap().keys().cloned().collect();
    members.sort();
    assert_eq!(
        members,
        ["code", "detail", "operation_id", "state", "status", "title", "type"]
    );
    let text = String::from_utf8_lossy(&changed.body);
    assert!(
        !text.contains("staging") && !text.contains("tkt_"),
        "nothing of the stored request or answer leaks"
    );
    assert_eq!(changed.operation_id(), first.operation_id());
    assert_eq!(app.ticket_count().await, 1, "the changed body had no effect");
}

async fn same_key_on_another_route_is_rejected_with_422(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let ticket = app.create_ticket("key-1", ROTATE_CERT).await.json();
    let path = format!("/v1/tickets/{}/comments", ticket["id"].as_str().unwrap());
    let comment = app.post(&path, ACME_AGENT, Some("key-1"), r#"{"body":"done"}"#).await;

    comment.assert_problem(422, "idempotency_key_reused");
    assert_eq!(app.count("SELECT COUNT(*) FROM ticket_comments").await, 0);
}

/// Claims `key` as a running attempt elsewhere would: in progress, lease held.
pub(crate) async fn claim_as_another_attempt(app: &TestApp, key: &str, body: &CreateTicket, lease: Duration) -> String {
    let key = IdempotencyKey::parse(key).unwrap();
    let fingerprint = Fingerprint::of("POST", "/v1/tickets", "acme", body).unwrap();
    let now = Timestamp::now();
    let mut tx = app.db.db.begin().await.unwrap();
    let claimed = store::claim(
        &mut tx,
        &NewOperation {
            account_id: "acme",
            key: &key,
            operation_id: idempotency::operation::new_operation_id(),
            principal_id: "acme-agent",
            method: "POST",
            route: "/v1/tickets",
            fingerprint: &fingerprint,
            lease_token: "other-attempt".into(),
            locked_until: now.plus(lease),
            now,
        },
    )
    .await
    .unwrap()
    .expect("the key was free");
    tx.commit().await.unwrap();
    claimed.operation_id
}

/// Completes the operation of `key-1` as the attempt holding its lease would, with this answer.
async fn finish_as_the_other_attempt(db: &platform::Db, status: StatusCode, body: &[u8]) {
    let response = StoredResponse {
        status,
        content_type: "application/json".into(),
        location: None,
        body: body.to_vec(),
    };
    let completion = Completion {
        state: OperationState::Completed,
        response: &response,
        resource: None,
        external_ref: None,
        now: Timestamp::now(),
    };
    let key = IdempotencyKey::parse("key-1").unwrap();
    let mut tx = db.begin().await.unwrap();
    assert!(
        store::complete(&mut tx, "acme", &key, "other-attempt", &completion)
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
}

fn rotate_cert_command() -> CreateTicket {
    CreateTicket {
        project: "ops".into(),
        title: "Rotate staging certificate".into(),
        description: None,
        priority: Priority::High,
        source_event_id: None,
        labels: vec![],
    }
}

async fn a_duplicate_of_a_running_operation_gets_409_request_in_progress_with_retry_after(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let operation_id = claim_as_another_attempt(&app, "key-1", &rotate_cert_command(), Duration::from_secs(30)).await;

    let duplicate = app.create_ticket("key-1", ROTATE_CERT).await;

    duplicate.assert_problem(409, "request_in_progress");
    let retry_after: u64 = duplicate.header("retry-after").expect("Retry-After").parse().unwrap();
    assert!((1..=30).contains(&retry_after));
    let body = duplicate.json();
    assert_eq!(body["operation_id"], operation_id);
    assert_eq!(body["state"], "in_progress");
    assert_eq!(body["status_url"], format!("/v1/operations/{operation_id}"));
    assert_eq!(duplicate.operation_id(), operation_id);
    assert_eq!(app.ticket_count().await, 0, "the duplicate did not run the operation");
}

async fn prefer_wait_answers_a_duplicate_with_the_replay_once_the_running_operation_finishes(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let operation_id = claim_as_another_attempt(&app, "key-1", &rotate_cert_command(), Duration::from_secs(30)).await;
    let db = app.db.db.clone();
    let finisher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        finish_as_the_other_attempt(&db, StatusCode::CREATED, br#"{"answer":"of the first attempt"}"#).await;
    });

    let mut request = json_request(
        axum::http::Method::POST,
        "/v1/tickets",
        ACME_AGENT,
        Some("key-1"),
        ROTATE_CERT,
    );
    request.headers_mut().insert("prefer", "wait=5".parse().unwrap());
    let waited = app.send(request).await;
    finisher.await.unwrap();

    assert_eq!(waited.status, StatusCode::CREATED);
    assert_eq!(waited.replayed(), Some("true"));
    assert_eq!(&waited.body[..], br#"{"answer":"of the first attempt"}"#);
    assert_eq!(waited.operation_id(), operation_id);
}

async fn prefer_wait_gives_up_after_the_wait_and_answers_409(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    claim_as_another_attempt(&app, "key-1", &rotate_cert_command(), Duration::from_secs(30)).await;

    let mut request = json_request(
        axum::http::Method::POST,
        "/v1/tickets",
        ACME_AGENT,
        Some("key-1"),
        ROTATE_CERT,
    );
    request.headers_mut().insert("prefer", "wait=1".parse().unwrap());
    let started = Instant::now();
    let waited = app.send(request).await;

    waited.assert_problem(409, "request_in_progress");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "it waited before answering"
    );
}

async fn a_retry_after_the_lease_ran_out_takes_the_operation_over_and_runs_it_once(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let operation_id = claim_as_another_attempt(&app, "key-1", &rotate_cert_command(), Duration::ZERO).await;

    let retry = app.create_ticket("key-1", ROTATE_CERT).await;
    let replay = app.create_ticket("key-1", ROTATE_CERT).await;

    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.replayed(), Some("false"));
    assert_eq!(
        retry.operation_id(),
        operation_id,
        "the operation keeps its id across the takeover"
    );
    assert_eq!(replay.replayed(), Some("true"));
    assert_eq!(replay.body, retry.body);
    assert_eq!(app.ticket_count().await, 1);
}

async fn an_operation_whose_outcome_is_unknown_is_never_executed_again(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let operation_id = claim_as_another_attempt(&app, "key-1", &rotate_cert_command(), Duration::from_secs(30)).await;
    on_pool!(app.db.db.write(), |pool| {
        sqlx::query("UPDATE idempotency_operations SET state = 'unknown', lease_token = NULL, locked_until = NULL")
            .execute(pool)
            .await
            .unwrap()
            .rows_affected()
    });

    let retry = app.create_ticket("key-1", ROTATE_CERT).await;

    retry.assert_problem(409, "operation_outcome_unknown");
    assert_eq!(retry.json()["state"], "unknown");
    assert_eq!(retry.json()["operation_id"], operation_id);
    assert_eq!(retry.json()["status_url"], format!("/v1/operations/{operation_id}"));
    assert_eq!(app.ticket_count().await, 0);
}

async fn an_unknown_outcome_whose_first_answer_was_stored_keeps_replaying_it(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let operation_id = claim_as_another_attempt(&app, "key-1", &rotate_cert_command(), Duration::from_secs(30)).await;
    finish_as_the_other_attempt(&app.db.db, StatusCode::ACCEPTED, br#"{"state":"processing"}"#).await;
    // the delivery's answer was lost: the outcome is unknown, the 202 stays the stored answer
    on_pool!(app.db.db.write(), |pool| sqlx::query(
        "UPDATE idempotency_operations SET state = 'unknown'"
    )
    .execute(pool)
    .await
    .unwrap()
    .rows_affected());

    let retry = app.create_ticket("key-1", ROTATE_CERT).await;

    assert_eq!(retry.status, StatusCode::ACCEPTED);
    assert_eq!(retry.replayed(), Some("true"));
    assert_eq!(&retry.body[..], br#"{"state":"processing"}"#);
    assert_eq!(retry.operation_id(), operation_id);
    assert_eq!(app.ticket_count().await, 0);
}

async fn a_final_business_failure_is_stored_and_replayed(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app
        .post(
            "/v1/tickets/tkt_missing/comments",
            ACME_AGENT,
            Some("c-1"),
            r#"{"body":"hello"}"#,
        )
        .await;
    let again = app
        .post(
            "/v1/tickets/tkt_missing/comments",
            ACME_AGENT,
            Some("c-1"),
            r#"{"body":"hello"}"#,
        )
        .await;

    first.assert_problem(404, "not_found");
    assert_eq!(first.replayed(), Some("false"));
    assert_eq!(again.replayed(), Some("true"));
    assert_eq!(again.body, first.body);
    let operation = app
        .get(&format!("/v1/operations/{}", first.operation_id()), ACME_AGENT)
        .await
        .json();
    assert_eq!(operation["state"], "failed");
    assert_eq!(operation["response_status"], 404);
}

async fn a_quoted_key_and_the_same_key_bare_are_one_operation(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let bare = app
        .create_ticket("81b59b1a-9e75-4de7-a53b-1bb50969c83c", ROTATE_CERT)
        .await;
    let quoted = app
        .create_ticket("\"81b59b1a-9e75-4de7-a53b-1bb50969c83c\"", ROTATE_CERT)
        .await;

    assert_eq!(quoted.replayed(), Some("true"));
    assert_eq!(quoted.operation_id(), bare.operation_id());
}

async fn the_operation_can_be_found_by_its_key_and_by_its_id(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let created = app.create_ticket("key-1", ROTATE_CERT).await;
    let ticket_id = created.json()["id"].as_str().unwrap().to_owned();

    let by_id = app
        .get(&format!("/v1/operations/{}", created.operation_id()), ACME_AGENT)
        .await;
    let by_key = app.get("/v1/operations?idempotency_key=key-1", ACME_AGENT).await;
    let never_sent = app.get("/v1/operations?idempotency_key=never-sent", ACME_AGENT).await;

    assert_eq!(by_id.status, StatusCode::OK);
    let operation = by_id.json();
    assert_eq!(operation["operation_id"], created.operation_id());
    assert_eq!(operation["idempotency_key"], "key-1");
    assert_eq!(operation["method"], "POST");
    assert_eq!(operation["route"], "/v1/tickets");
    assert_eq!(operation["fingerprint"].as_str().unwrap().len(), 64);
    assert_eq!(
        operation["resource"],
        json!({"type": "ticket", "id": ticket_id, "url": format!("/v1/tickets/{ticket_id}")})
    );
    assert_eq!(by_key.json()["data"][0], operation);
    assert_eq!(
        never_sent.json()["data"],
        json!([]),
        "a key the server never claimed has no operation"
    );
}

async fn the_key_lookup_reads_its_key_as_the_header_does_quoted_or_bare(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let created = app.create_ticket("k", ROTATE_CERT).await;

    let quoted = app.get("/v1/operations?idempotency_key=%22k%22", ACME_AGENT).await;
    let bare = app.get("/v1/operations?idempotency_key=k", ACME_AGENT).await;
    let spaced = app.get("/v1/operations?idempotency_key=a%20b", ACME_AGENT).await;
    let badly_quoted = app.get("/v1/operations?idempotency_key=%22k", ACME_AGENT).await;

    assert_eq!(quoted.status, StatusCode::OK);
    assert_eq!(
        quoted.json()["data"][0]["operation_id"],
        created.operation_id(),
        "the quoted form names the key it claimed, never 'not claimed'"
    );
    assert_eq!(quoted.json(), bare.json());
    spaced.assert_problem(400, "idempotency_key_invalid");
    badly_quoted.assert_problem(400, "idempotency_key_invalid");
}

async fn a_retry_reaching_another_instance_is_answered_from_the_database(backend: Backend) {
    let first = TestApp::spawn(backend).await;
    let created = first.create_ticket("key-1", ROTATE_CERT).await;
    // a second instance of the service on the same database: nothing in its memory
    let other = tickets::App::new(first.db.db.clone(), Default::default(), true);
    let other = TestClient::new(tickets::build_router(other));

    let replay = other.post("/v1/tickets", ACME_AGENT, Some("key-1"), ROTATE_CERT).await;
    let changed = other
        .post(
            "/v1/tickets",
            ACME_AGENT,
            Some("key-1"),
            r#"{"project":"ops","title":"Something else"}"#,
        )
        .await;

    assert_eq!(replay.status, created.status);
    assert_eq!(replay.replayed(), Some("true"));
    assert_eq!(replay.body, created.body);
    assert_eq!(changed.status.as_u16(), 422);
    assert_eq!(
        first.ticket_count().await,
        1,
        "the other instance's attempts were rolled back"
    );
}

platform::both_backends!(
    the_key_lookup_reads_its_key_as_the_header_does_quoted_or_bare,
    a_retry_reaching_another_instance_is_answered_from_the_database,
    first_attempt_creates_the_ticket_and_is_marked_not_replayed,
    same_key_and_body_replay_the_stored_answer_byte_for_byte,
    an_equivalent_body_in_another_order_with_the_default_written_out_is_a_replay,
    same_key_with_a_changed_body_is_rejected_with_422_naming_only_the_operation_and_state,
    same_key_on_another_route_is_rejected_with_422,
    a_duplicate_of_a_running_operation_gets_409_request_in_progress_with_retry_after,
    prefer_wait_answers_a_duplicate_with_the_replay_once_the_running_operation_finishes,
    prefer_wait_gives_up_after_the_wait_and_answers_409,
    a_retry_after_the_lease_ran_out_takes_the_operation_over_and_runs_it_once,
    an_operation_whose_outcome_is_unknown_is_never_executed_again,
    an_unknown_outcome_whose_first_answer_was_stored_keeps_replaying_it,
    a_final_business_failure_is_stored_and_replayed,
    a_quoted_key_and_the_same_key_bare_are_one_operation,
    the_operation_can_be_found_by_its_key_and_by_its_id,
);

//! docs/contract.md §6 on tickets with the policy on (urgent tickets wait for a
//! human): the approval request, who may decide, the fingerprint the human
//! saw, the run on the next retry, rejection and expiry.

use std::{sync::Arc, time::Duration};

use futures::future::join_all;
use idempotency::IdempotencyConfig;
use platform::{Backend, Role};
use serde_json::{Value, json};

use crate::support::*;

const URGENT: &str = r#"{"project":"payments-api","title":"Checkout is down","priority":"urgent"}"#;

async fn approvals_app(backend: Backend) -> TestApp {
    TestApp::spawn_with_approvals(backend, IdempotencyConfig::default()).await
}

fn with_ttl(ttl: Duration) -> IdempotencyConfig {
    IdempotencyConfig {
        approval_ttl: ttl,
        ..IdempotencyConfig::default()
    }
}

impl TestApp {
    async fn decide(&self, bearer: &str, approval_id: &str, decision: &str, fingerprint: &str) -> TestResponse {
        let body = json!({"decision": decision, "fingerprint": fingerprint}).to_string();
        self.post(&format!("/v1/approvals/{approval_id}/decision"), bearer, None, &body)
            .await
    }

    /// The approver's decision on the approval request `request` (a 202 body), with its fingerprint.
    async fn decide_on(&self, request: &Value, decision: &str) -> TestResponse {
        let (approval_id, fingerprint) = (
            request["approval_id"].as_str().unwrap(),
            request["fingerprint"].as_str().unwrap(),
        );
        self.decide(ACME_APPROVER, approval_id, decision, fingerprint).await
    }

    /// The approval of the approval request `request`, as an approver sees it.
    async fn approval(&self, request: &Value) -> Value {
        let approval_id = request["approval_id"].as_str().unwrap();
        self.get(&format!("/v1/approvals/{approval_id}"), ACME_APPROVER)
            .await
            .json()
    }

    async fn operation(&self, operation_id: &str) -> Value {
        self.get(&format!("/v1/operations/{operation_id}"), ACME_AGENT)
            .await
            .json()
    }
}

async fn an_urgent_ticket_waits_for_approval_and_is_created_once_by_the_retry_after_it(backend: Backend) {
    let app = approvals_app(backend).await;

    let first = app.create_ticket("key-1", URGENT).await;
    assert_eq!(first.status.as_u16(), 202, "{:?}", first.body);
    assert_eq!(first.replayed(), Some("false"));
    let request = first.json();
    assert_eq!(request["state"], "awaiting_approval");
    assert_eq!(request["operation_id"], first.operation_id());
    assert_eq!(request["idempotency_key"], "key-1");
    assert_eq!(request["summary"]["identifiers"]["project"], "payments-api");
    assert_eq!(request["summary"]["identifiers"]["title"], "Checkout is down");
    assert!(request["expires_at"].is_string() && request["status_url"].is_string());
    let (approval_id, fingerprint) = (
        request["approval_id"].as_str().unwrap().to_owned(),
        request["fingerprint"].as_str().unwrap().to_owned(),
    );
    assert_eq!(app.ticket_count().await, 0, "nothing happens before a human decides");

    let waiting = app.create_ticket("key-1", URGENT).await;
    assert_eq!(waiting.status.as_u16(), 202);
    assert_eq!(waiting.body, first.body, "the same approval request, byte for byte");
    assert_eq!(waiting.replayed(), Some("true"));

    app.decide(ACME_AGENT, &approval_id, "approve", &fingerprint)
        .await
        .assert_problem(403, "forbidden");
    app.decide(GLOBEX_APPROVER, &approval_id, "approve", &fingerprint)
        .await
        .assert_problem(404, "not_found");
    app.get(&format!("/v1/approvals/{approval_id}"), GLOBEX_APPROVER)
        .await
        .assert_problem(404, "not_found");
    let other = "0".repeat(64);
    let mismatch = app.decide(ACME_APPROVER, &approval_id, "approve", &other).await;
    mismatch.assert_problem(409, "approval_fingerprint_mismatch");
    let approval = app
        .get(&format!("/v1/approvals/{approval_id}"), ACME_APPROVER)
        .await
        .json();
    assert_eq!(approval["state"], "pending", "a refused decision decides nothing");

    let approved = app.decide(ACME_APPROVER, &approval_id, "approve", &fingerprint).await;
    assert_eq!(approved.status.as_u16(), 200, "{:?}", approved.body);
    assert_eq!(approved.json()["state"], "approved");
    assert_eq!(approved.json()["decided_by"], "acme-approver");
    assert_eq!(
        app.ticket_count().await,
        0,
        "an approved ticket is made by the next retry"
    );
    assert_eq!(
        app.operation(first.operation_id()).await["approval"]["state"],
        "approved"
    );

    let run = app.create_ticket("key-1", URGENT).await;
    assert_eq!(run.status.as_u16(), 201, "{:?}", run.body);
    assert_eq!(run.replayed(), Some("false"));
    assert_eq!(run.operation_id(), first.operation_id());
    assert_eq!(run.json()["outcome"], "created");
    let replay = app.create_ticket("key-1", URGENT).await;
    assert_eq!(replay.status.as_u16(), 201);
    assert_eq!(replay.replayed(), Some("true"));
    assert_eq!(replay.body, run.body, "the run's answer replaces the approval request");
    assert_eq!(app.ticket_count().await, 1);

    let operation = app.operation(first.operation_id()).await;
    assert_eq!(operation["state"], "completed");
    assert_eq!(operation["approval"]["approval_id"], approval_id.as_str());
}

async fn tickets_below_the_policy_s_priority_are_created_at_once(backend: Backend) {
    let app = approvals_app(backend).await;

    let created = app.create_ticket("key-1", ROTATE_CERT).await;

    assert_eq!(created.status.as_u16(), 201);
    assert_eq!(app.ticket_count().await, 1);
}

async fn the_principal_that_requested_an_operation_can_never_approve_it(backend: Backend) {
    let app = approvals_app(backend).await;
    // an approver may send writes too; they still need someone else's decision
    let requested = app
        .post("/v1/tickets", ACME_APPROVER, Some("key-1"), URGENT)
        .await
        .json();
    let (approval_id, fingerprint) = (
        requested["approval_id"].as_str().unwrap(),
        requested["fingerprint"].as_str().unwrap(),
    );

    app.decide(ACME_APPROVER, approval_id, "approve", fingerprint)
        .await
        .assert_problem(403, "forbidden");

    let lead = app.create_key("acme", "acme-lead", Role::Approver).await;
    let approved = app.decide(&lead, approval_id, "approve", fingerprint).await;
    assert_eq!(approved.json()["state"], "approved");
}

async fn a_decision_is_made_once_and_repeating_it_answers_it_again(backend: Backend) {
    let app = approvals_app(backend).await;
    let requested = app.create_ticket("key-1", URGENT).await.json();
    let (approval_id, fingerprint) = (
        requested["approval_id"].as_str().unwrap(),
        requested["fingerprint"].as_str().unwrap(),
    );
    let first = app.decide(ACME_APPROVER, approval_id, "reject", fingerprint).await;
    assert_eq!(first.status.as_u16(), 200);

    let repeated = app.decide(ACME_APPROVER, approval_id, "reject", fingerprint).await;
    let reversed = app.decide(ACME_APPROVER, approval_id, "approve", fingerprint).await;

    assert_eq!(
        repeated.status.as_u16(),
        200,
        "a lost answer to a decision may be asked again"
    );
    assert_eq!(repeated.json()["decided_at"], first.json()["decided_at"]);
    reversed.assert_problem(409, "invalid_state");
}

/// Sends each of `decisions` on the approval request `requested` at once.
async fn decide_at_once(
    app: &Arc<TestApp>,
    requested: &Value,
    decisions: &[&'static str],
) -> Vec<(&'static str, TestResponse)> {
    let requested = Arc::new(requested.clone());
    join_all(decisions.iter().map(|&decision| {
        let (app, requested) = (app.clone(), requested.clone());
        tokio::spawn(async move { (decision, app.decide_on(&requested, decision).await) })
    }))
    .await
    .into_iter()
    .map(|answer| answer.unwrap())
    .collect()
}

async fn many_identical_decisions_at_once_by_one_approver_all_get_the_decision_and_an_opposite_one_409(
    backend: Backend,
) {
    let app = Arc::new(approvals_app(backend).await);
    let first = app.create_ticket("key-1", URGENT).await.json();
    let second = app.create_ticket("key-2", URGENT).await.json();

    let identical = decide_at_once(&app, &first, &["approve"; 100]).await;
    let mut mixed = vec!["approve"; 20];
    mixed.extend(["reject"; 20]);
    let opposed = decide_at_once(&app, &second, &mixed).await;

    let decided = identical[0].1.json();
    assert_eq!(decided["state"], "approved");
    for (_, answer) in &identical {
        assert_eq!(answer.status.as_u16(), 200, "{:?}", answer.body);
        assert_eq!(answer.json(), decided, "every repeat gets the same decided approval");
    }
    // whichever decision came first stands: its repeats get it, the other is refused
    let made = if app.approval(&second).await["state"] == "approved" {
        "approve"
    } else {
        "reject"
    };
    for (decision, answer) in &opposed {
        if *decision == made {
            assert_eq!(answer.status.as_u16(), 200, "{:?}", answer.body);
        } else {
            answer.assert_problem(409, "invalid_state");
        }
    }
}

async fn a_decision_sent_with_a_key_is_replayed_to_that_key_and_the_key_with_another_decision_is_422(backend: Backend) {
    let app = approvals_app(backend).await;
    let requested = app.create_ticket("key-1", URGENT).await.json();
    let (approval_id, fingerprint) = (
        requested["approval_id"].as_str().unwrap(),
        requested["fingerprint"].as_str().unwrap(),
    );
    let decision = |decision: &str| json!({"decision": decision, "fingerprint": fingerprint}).to_string();
    let path = format!("/v1/approvals/{approval_id}/decision");

    let first = app
        .post(&path, ACME_APPROVER, Some("decide-1"), &decision("approve"))
        .await;
    let retried = app
        .post(&path, ACME_APPROVER, Some("decide-1"), &decision("approve"))
        .await;
    let changed = app
        .post(&path, ACME_APPROVER, Some("decide-1"), &decision("reject"))
        .await;

    assert_eq!(first.status.as_u16(), 200, "{:?}", first.body);
    assert_eq!(first.replayed(), Some("false"));
    assert_eq!(first.json()["state"], "approved");
    assert_eq!(retried.status.as_u16(), 200);
    assert_eq!(retried.replayed(), Some("true"), "the stored answer, replayed");
    assert_eq!(retried.body, first.body);
    assert_eq!(retried.operation_id(), first.operation_id());
    changed.assert_problem(422, "idempotency_key_reused");
    assert_eq!(
        app.approval(&requested).await["state"],
        "approved",
        "the decision stands"
    );
}

/// A decision sent with a key is its author's request: another approver of
/// the account sending the same key and body is not answered with the first
/// approver's 200 (which would tell them they decided), but refused with 422;
/// the first approver's retry still gets their own answer.
async fn another_approver_sending_an_approvers_decision_key_and_body_is_422_not_their_answer(backend: Backend) {
    let app = approvals_app(backend).await;
    let second_approver = app.create_key("acme", "acme-approver-2", Role::Approver).await;
    let requested = app.create_ticket("key-1", URGENT).await.json();
    let body = json!({"decision": "approve", "fingerprint": requested["fingerprint"]}).to_string();
    let path = format!("/v1/approvals/{}/decision", requested["approval_id"].as_str().unwrap());

    let first = app.post(&path, ACME_APPROVER, Some("decide-1"), &body).await;
    let by_another = app.post(&path, &second_approver, Some("decide-1"), &body).await;
    let retried = app.post(&path, ACME_APPROVER, Some("decide-1"), &body).await;

    assert_eq!(first.status.as_u16(), 200, "{:?}", first.body);
    by_another.assert_problem(422, "idempotency_key_reused");
    assert_eq!(retried.status.as_u16(), 200);
    assert_eq!(retried.replayed(), Some("true"));
    assert_eq!(retried.body, first.body, "the first approver's own answer");
    assert_eq!(app.approval(&requested).await["decided_by"], "acme-approver");
}

/// An agent may never decide, and its refusal comes before the key is looked
/// at: the key it sent is not claimed, so nothing is stored under it.
async fn an_agent_s_decision_sent_with_a_key_is_403_and_claims_nothing(backend: Backend) {
    let app = approvals_app(backend).await;
    let requested = app.create_ticket("key-1", URGENT).await.json();
    let (approval_id, fingerprint) = (
        requested["approval_id"].as_str().unwrap(),
        requested["fingerprint"].as_str().unwrap(),
    );
    let body = json!({"decision": "approve", "fingerprint": fingerprint}).to_string();

    let refused = app
        .post(
            &format!("/v1/approvals/{approval_id}/decision"),
            ACME_AGENT,
            Some("agent-decides"),
            &body,
        )
        .await;
    let claimed = app
        .get("/v1/operations?idempotency_key=agent-decides", ACME_AGENT)
        .await
        .json();

    refused.assert_problem(403, "forbidden");
    assert_eq!(refused.header("operation-id"), None, "no operation answered");
    assert_eq!(claimed["data"], json!([]), "the key was never claimed");
    assert_eq!(app.approval(&requested).await["state"], "pending");
}

async fn a_rejected_operation_answers_approval_rejected_to_every_retry_and_never_runs(backend: Backend) {
    let app = approvals_app(backend).await;
    let first = app.create_ticket("key-1", URGENT).await;
    let requested = first.json();
    let rejected = app.decide_on(&requested, "reject").await;
    assert_eq!(rejected.json()["state"], "rejected");

    let retry = app.create_ticket("key-1", URGENT).await;
    let again = app.create_ticket("key-1", URGENT).await;

    retry.assert_problem(409, "approval_rejected");
    assert_eq!(retry.operation_id(), first.operation_id());
    assert_eq!(again.body, retry.body, "replayed byte for byte");
    assert_eq!(again.replayed(), Some("true"));
    assert_eq!(app.ticket_count().await, 0);
    assert_eq!(app.operation(first.operation_id()).await["state"], "rejected");
}

async fn a_changed_body_is_422_with_the_same_key_and_a_new_approval_with_a_new_key(backend: Backend) {
    let app = approvals_app(backend).await;
    let first = app.create_ticket("key-1", URGENT).await.json();
    let changed = URGENT.replace("Checkout is down", "Checkout is slow");

    let same_key = app.create_ticket("key-1", &changed).await;
    let new_key = app.create_ticket("key-2", &changed).await;

    same_key.assert_problem(422, "idempotency_key_reused");
    assert_eq!(new_key.status.as_u16(), 202);
    let second = new_key.json();
    assert_ne!(second["approval_id"], first["approval_id"]);
    assert_ne!(
        second["fingerprint"], first["fingerprint"],
        "the human decides on what changed"
    );
    let pending = app.get("/v1/approvals?state=pending", ACME_APPROVER).await.json();
    assert_eq!(pending["data"].as_array().unwrap().len(), 2);
}

async fn an_approval_nobody_decides_in_time_rejects_its_operation_with_approval_expired(backend: Backend) {
    let app = TestApp::spawn_with_approvals(backend, with_ttl(Duration::from_millis(300))).await;
    let first = app.create_ticket("key-1", URGENT).await;
    let requested = first.json();
    tokio::time::sleep(Duration::from_millis(400)).await;

    let pending = app.get("/v1/approvals?state=pending", ACME_APPROVER).await.json();
    assert_eq!(pending["data"], json!([]), "an expired approval is no longer pending");
    let late = app.decide_on(&requested, "approve").await;
    let retry = app.create_ticket("key-1", URGENT).await;

    late.assert_problem(409, "approval_expired");
    retry.assert_problem(409, "approval_expired");
    assert_eq!(app.ticket_count().await, 0);
    let operation = app.operation(first.operation_id()).await;
    assert_eq!(operation["state"], "rejected");
    assert_eq!(operation["approval"]["state"], "expired");
}

async fn an_approved_operation_not_run_before_its_approval_expires_never_runs(backend: Backend) {
    let app = TestApp::spawn_with_approvals(backend, with_ttl(Duration::from_millis(400))).await;
    let requested = app.create_ticket("key-1", URGENT).await.json();
    let approved = app.decide_on(&requested, "approve").await;
    assert_eq!(approved.status.as_u16(), 200);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let retry = app.create_ticket("key-1", URGENT).await;

    retry.assert_problem(409, "approval_expired");
    assert_eq!(app.ticket_count().await, 0, "the execution-time check refused it");
    assert_eq!(app.create_ticket("key-1", URGENT).await.body, retry.body);
}

async fn the_reaper_rejects_operations_whose_approval_ran_out_with_no_retry(backend: Backend) {
    let app = TestApp::spawn_with_approvals(backend, with_ttl(Duration::from_millis(300))).await;
    let undecided = app.create_ticket("key-1", URGENT).await;
    let approved = app.create_ticket("key-2", &URGENT.replace("down", "slow")).await;
    let request = approved.json();
    app.decide_on(&request, "approve").await;
    tokio::time::sleep(Duration::from_millis(400)).await;

    let expired = approvals::expire_due(&app.app.idempotency).await.unwrap();

    assert_eq!(expired, 2, "the undecided one and the approved one nobody ran");
    for first in [&undecided, &approved] {
        let operation = app.operation(first.operation_id()).await;
        assert_eq!(operation["state"], "rejected", "{operation}");
    }
    assert_eq!(
        app.operation(undecided.operation_id()).await["approval"]["state"],
        "expired"
    );
    app.create_ticket("key-2", &URGENT.replace("down", "slow"))
        .await
        .assert_problem(409, "approval_expired");
    assert_eq!(app.ticket_count().await, 0);
    assert_eq!(
        approvals::expire_due(&app.app.idempotency).await.unwrap(),
        0,
        "settled once"
    );
}

async fn many_retries_racing_after_an_approval_create_one_ticket(backend: Backend) {
    let app = Arc::new(approvals_app(backend).await);
    let requested = app.create_ticket("key-1", URGENT).await.json();
    app.decide_on(&requested, "approve").await;

    let retries = join_all((0..16).map(|_| {
        let app = app.clone();
        tokio::spawn(async move { app.create_ticket("key-1", URGENT).await })
    }))
    .await;

    let answers: Vec<TestResponse> = retries.into_iter().map(|r| r.unwrap()).collect();
    let created = answers.iter().filter(|r| r.status.as_u16() == 201).count();
    assert!(
        created >= 1,
        "{:?}",
        answers.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert!(
        answers
            .iter()
            .all(|r| r.status.as_u16() == 201 || (r.status.as_u16() == 409 && r.code() == "request_in_progress")),
        "each retry got the run's answer or was told it is running"
    );
    assert_eq!(
        answers
            .iter()
            .filter(|r| r.replayed() == Some("false") && r.status.as_u16() == 201)
            .count(),
        1,
        "exactly one retry ran it"
    );
    assert_eq!(app.ticket_count().await, 1);
}

async fn only_approvers_and_admins_of_the_account_see_its_approvals(backend: Backend) {
    let app = approvals_app(backend).await;
    let requested = app.create_ticket("key-1", URGENT).await.json();

    app.get("/v1/approvals?state=pending", ACME_AGENT)
        .await
        .assert_problem(403, "forbidden");
    let theirs = app.get("/v1/approvals?state=pending", GLOBEX_APPROVER).await.json();
    let ours = app.get("/v1/approvals?state=pending", ACME_APPROVER).await.json();
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let by_admin = app.get("/v1/approvals", &admin).await.json();

    assert_eq!(theirs["data"], json!([]));
    assert_eq!(ours["data"][0]["approval_id"], requested["approval_id"]);
    assert_eq!(ours["data"][0]["summary"], requested["summary"]);
    assert_eq!(ours["data"][0]["requested_by"], "acme-agent");
    assert_eq!(by_admin["data"].as_array().unwrap().len(), 1);
    app.get("/v1/approvals?state=maybe", ACME_APPROVER)
        .await
        .assert_problem(400, "invalid_request");
}

platform::both_backends!(
    an_urgent_ticket_waits_for_approval_and_is_created_once_by_the_retry_after_it,
    tickets_below_the_policy_s_priority_are_created_at_once,
    the_principal_that_requested_an_operation_can_never_approve_it,
    a_decision_is_made_once_and_repeating_it_answers_it_again,
    many_identical_decisions_at_once_by_one_approver_all_get_the_decision_and_an_opposite_one_409,
    a_decision_sent_with_a_key_is_replayed_to_that_key_and_the_key_with_another_decision_is_422,
    another_approver_sending_an_approvers_decision_key_and_body_is_422_not_their_answer,
    an_agent_s_decision_sent_with_a_key_is_403_and_claims_nothing,
    a_rejected_operation_answers_approval_rejected_to_every_retry_and_never_runs,
    a_changed_body_is_422_with_the_same_key_and_a_new_approval_with_a_new_key,
    an_approval_nobody_decides_in_time_rejects_its_operation_with_approval_expired,
    an_approved_operation_not_run_before_its_approval_expires_never_runs,
    many_retries_racing_after_an_approval_create_one_ticket,
    the_reaper_rejects_operations_whose_approval_ran_out_with_no_retry,
    only_approvers_and_admins_of_the_account_see_its_approvals,
);

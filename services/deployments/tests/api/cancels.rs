//! Cancelling a deployment: before the controller has it, at the controller,
//! while it is handed over, and never after it ends; with a key and without,
//! each on record.

use std::sync::Arc;

use axum::http::StatusCode;
use deploy_controller::Faults;
use platform::Backend;
use serde_json::json;

use crate::support::{ACME_AGENT, ACME_APPROVER, GLOBEX_AGENT, SLOW_STEP, TestApp, digest, release};

async fn a_deployment_is_cancelled_before_the_controller_has_it_or_at_the_controller_and_never_after_it_ends(
    backend: Backend,
) {
    let app = TestApp::spawn_with_step(backend, SLOW_STEP).await;

    // before the hand-over: withdrawn from the outbox, nothing reaches the controller
    let early = app.deploy("deploy-1", &release("staging", &digest('a'), None)).await;
    let early_id = early.str("id");
    let withdrawn = app
        .post(
            &format!("/v1/deployments/{early_id}/cancel"),
            ACME_AGENT,
            None,
            &json!({}),
        )
        .await;
    app.deliver().await;
    let early_operation = app.operation(early.operation_id()).await;

    // once the controller has it: the controller is asked to stop it
    let late = app.deploy("deploy-2", &release("staging", &digest('b'), None)).await;
    let late_id = late.str("id");
    app.deliver().await;
    app.until(&late_id, "running").await;
    let stopped = app
        .post(
            &format!("/v1/deployments/{late_id}/cancel"),
            ACME_AGENT,
            Some("cancel-2"),
            &json!({}),
        )
        .await;
    let again = app
        .post(
            &format!("/v1/deployments/{late_id}/cancel"),
            ACME_AGENT,
            None,
            &json!({}),
        )
        .await;

    // after it ended: nothing to cancel
    let done = app.deployed("deploy-3", &release("staging", &digest('c'), None)).await;
    let too_late = app
        .post(&format!("/v1/deployments/{done}/cancel"), ACME_AGENT, None, &json!({}))
        .await;
    let theirs = app
        .post(
            &format!("/v1/deployments/{done}/cancel"),
            GLOBEX_AGENT,
            None,
            &json!({}),
        )
        .await;

    assert_eq!(withdrawn.status, StatusCode::OK, "{:?}", withdrawn.body);
    assert_eq!(withdrawn.json()["state"], "cancelled");
    assert_eq!(
        early_operation["state"], "failed",
        "the deployment it asked for never happened"
    );
    assert_eq!(stopped.status, StatusCode::OK, "{:?}", stopped.body);
    assert_eq!(stopped.json()["state"], "cancelled");
    assert_eq!(app.operation(late.operation_id()).await["state"], "failed");
    assert_eq!(
        again.status,
        StatusCode::OK,
        "cancelling what is cancelled answers it unchanged"
    );
    assert_eq!(again.json()["updated_at"], stopped.json()["updated_at"]);
    too_late.assert_problem(409, "invalid_state");
    theirs.assert_problem(404, "not_found");
    assert_eq!(
        app.controller.stats().rollouts_started,
        2,
        "the one cancelled before the hand-over never reached the controller"
    );
}

/// A cancel with no key leaves no operation of its own, but the journal still
/// says who cancelled which deployment, through which route; cancelling it
/// again changes nothing and journals nothing.
async fn a_cancel_without_a_key_is_journaled_with_its_principal_route_and_new_state(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let id = app
        .deploy("deploy-1", &release("staging", &digest('a'), None))
        .await
        .str("id");
    let cancel = format!("/v1/deployments/{id}/cancel");

    let cancelled = app.post(&cancel, ACME_AGENT, None, &json!({})).await;
    let again = app.post(&cancel, ACME_AGENT, None, &json!({})).await;
    let page = app.get("/v1/audit?event=state_changed", ACME_APPROVER).await.json();

    assert_eq!((cancelled.status, again.status), (StatusCode::OK, StatusCode::OK));
    let entries = page["data"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "the second cancel changed nothing: {entries:?}");
    let entry = &entries[0];
    assert_eq!(entry["principal_id"], "acme-agent");
    assert_eq!(entry["route"], "/v1/deployments/{deployment_id}/cancel");
    assert_eq!(
        (&entry["resource_type"], &entry["resource_id"], &entry["state"]),
        (&json!("deployment"), &json!(id), &json!("cancelled"))
    );
}

/// The watcher's change of a deployment that ends no operation (the rollout
/// began running) is journaled too: by the watcher, with the operation it
/// belongs to and its route.
async fn a_rollout_the_controller_began_running_is_journaled_by_the_watcher(backend: Backend) {
    let app = TestApp::spawn_with_step(backend, SLOW_STEP).await;
    let accepted = app.deploy("deploy-1", &release("staging", &digest('a'), None)).await;
    let id = accepted.str("id");
    app.deliver().await;
    app.until(&id, "running").await;

    let page = app.get("/v1/audit?event=state_changed", ACME_APPROVER).await.json();

    let entries = page["data"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    assert_eq!(entry["principal_id"], "system:rollout-watcher");
    assert_eq!(entry["route"], "/v1/deployments");
    assert_eq!(entry["operation_id"], accepted.operation_id());
    assert_eq!(
        (&entry["resource_type"], &entry["resource_id"], &entry["state"]),
        (&json!("deployment"), &json!(id), &json!("running"))
    );
}

/// A cancel that finds the rollout on its way to the controller cannot know
/// whether the controller has it: it asks to be sent again shortly (so it is
/// not stored against its key), and then cancels it at the controller.
async fn a_cancel_while_the_rollout_is_being_handed_over_asks_to_be_sent_again(backend: Backend) {
    let app = Arc::new(TestApp::spawn_with_step(backend, SLOW_STEP).await);
    app.controller.set_faults(Faults {
        latency_ms: 600,
        ..Faults::default()
    });
    let accepted = app.deploy("deploy-1", &release("staging", &digest('a'), None)).await;
    let id = accepted.str("id");
    let cancel = format!("/v1/deployments/{id}/cancel");

    let handing_over = {
        let app = app.clone();
        tokio::spawn(async move { app.deliver().await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let too_soon = app.post(&cancel, ACME_AGENT, Some("cancel-1"), &json!({})).await;
    handing_over.await.unwrap();
    let later = app.post(&cancel, ACME_AGENT, Some("cancel-1"), &json!({})).await;

    too_soon.assert_problem(409, "invalid_state");
    assert!(too_soon.json()["detail"].as_str().unwrap().contains("Retry-After"));
    assert_eq!(
        later.status,
        StatusCode::OK,
        "the same key works once the controller has it: {:?}",
        later.body
    );
    assert_eq!(later.json()["state"], "cancelled");
    assert_eq!(app.controller.stats().rollouts_started, 1);
}

/// Nothing happens before the claim: a cancel whose key already names
/// another request is 422 and the controller is never asked; the rollout runs
/// on. A fresh key cancels it, and its replay does not ask the controller again.
async fn a_cancel_with_a_key_used_for_another_request_is_422_and_the_rollout_runs_on(backend: Backend) {
    let app = TestApp::spawn_with_step(backend, SLOW_STEP).await;
    let running = app
        .deploy("deploy-1", &release("staging", &digest('a'), None))
        .await
        .str("id");
    app.deliver().await;
    app.until(&running, "running").await;
    let other = app
        .deploy(
            "deploy-2",
            &json!({"service": "billing", "environment": "staging", "artifact_digest": digest('b')}),
        )
        .await
        .str("id");
    let cancel = |id: &str| format!("/v1/deployments/{id}/cancel");
    let first = app
        .post(&cancel(&other), ACME_AGENT, Some("cancel-k"), &json!({}))
        .await;

    let reused = app
        .post(&cancel(&running), ACME_AGENT, Some("cancel-k"), &json!({}))
        .await;
    app.service
        .controller
        .watch_once(&app.service.idempotency)
        .await
        .unwrap();
    let still = app.deployment(&running).await;
    let asked_after_422 = app.controller.stats().cancel_requests;
    let stopped = app
        .post(&cancel(&running), ACME_AGENT, Some("cancel-fresh"), &json!({}))
        .await;
    let replayed = app
        .post(&cancel(&running), ACME_AGENT, Some("cancel-fresh"), &json!({}))
        .await;

    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    reused.assert_problem(422, "idempotency_key_reused");
    assert_eq!(asked_after_422, 0, "a refused attempt never reaches the controller");
    assert_eq!(still["state"], "running", "{still}");
    assert_eq!(stopped.status, StatusCode::OK, "{:?}", stopped.body);
    assert_eq!(stopped.json()["state"], "cancelled");
    assert_eq!(replayed.replayed(), Some("true"));
    assert_eq!(replayed.body, stopped.body);
    assert_eq!(
        app.controller.stats().cancel_requests,
        1,
        "the replay is answered from what was stored"
    );
    assert_eq!(app.deployment(&running).await["state"], "cancelled");
}

/// A cancel without a key has no claim to stand for it: the deployment's
/// history says who asked before the controller is asked to stop it.
async fn a_cancel_without_a_key_is_on_record_before_the_controller_is_asked(backend: Backend) {
    let app = TestApp::spawn_with_step(backend, SLOW_STEP).await;
    let running = app
        .deploy("deploy-1", &release("staging", &digest('a'), None))
        .await
        .str("id");
    app.deliver().await;
    app.until(&running, "running").await;

    let cancelled = app
        .post(
            &format!("/v1/deployments/{running}/cancel"),
            ACME_AGENT,
            None,
            &json!({}),
        )
        .await;

    assert_eq!(cancelled.status, StatusCode::OK, "{:?}", cancelled.body);
    let history = cancelled.json()["history"].as_array().unwrap().clone();
    let notes: Vec<&str> = history.iter().map(|c| c["note"].as_str().unwrap()).collect();
    let asked = notes.iter().position(|n| n.contains("asked to cancel it"));
    let stopped = notes.iter().position(|n| n.starts_with("cancelled at the controller"));
    assert!(
        asked.is_some() && asked < stopped,
        "the request is recorded before the cancel: {notes:?}"
    );
    assert_eq!(history.last().unwrap()["state"], "cancelled");
}

platform::both_backends!(
    a_deployment_is_cancelled_before_the_controller_has_it_or_at_the_controller_and_never_after_it_ends,
    a_cancel_without_a_key_is_journaled_with_its_principal_route_and_new_state,
    a_rollout_the_controller_began_running_is_journaled_by_the_watcher,
    a_cancel_while_the_rollout_is_being_handed_over_asks_to_be_sent_again,
    a_cancel_with_a_key_used_for_another_request_is_422_and_the_rollout_runs_on,
    a_cancel_without_a_key_is_on_record_before_the_controller_is_asked,
);

//! Deployments: the article's failure sequence, the environment lock, a
//! changed retry, the rollout followed to its end, and the controller's own
//! count of rollouts saying "exactly once". Cancelling one is in `cancels`.

use std::sync::Arc;

use axum::http::StatusCode;
use deploy_controller::Faults;
use futures::future::join_all;
use platform::{Backend, on_pool};
use serde_json::{Value, json};

use crate::support::{
    ACME_AGENT, ACME_APPROVER, COMMIT_A1B2C3, COMMIT_D4E5F6, GLOBEX_AGENT, SLOW_STEP, STEP, TestApp, digest, release,
};

/// The article's sequence: dep-118 for commit a1b2c3 is accepted and its
/// answer is lost; the agent, thinking it failed, starts a second deployment
/// for d4e5f6 with a new key. The lock stops the second plan; the retry of the
/// first with its own key replays; one rollout happens.
async fn the_article_s_failure_sequence_locks_out_the_second_plan_and_starts_one_rollout(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    // the controller takes the first rollout and its answer never arrives either
    app.controller.set_faults(Faults {
        drop_next: 1,
        ..Faults::default()
    });

    let dep_118 = app
        .deploy("dep-118", &release("staging", &digest('a'), Some(COMMIT_A1B2C3)))
        .await;
    app.deliver().await;
    let while_unknown = app.deployment(&dep_118.str("id")).await;
    let dep_119 = app
        .deploy("dep-119", &release("staging", &digest('d'), Some(COMMIT_D4E5F6)))
        .await;
    let retry_118 = app
        .deploy("dep-118", &release("staging", &digest('a'), Some(COMMIT_A1B2C3)))
        .await;
    app.reconcile().await;
    let finished = app.until(&dep_118.str("id"), "succeeded").await;

    assert_eq!(dep_118.status, StatusCode::ACCEPTED, "{:?}", dep_118.body);
    assert_eq!(while_unknown["state"], "unknown", "{while_unknown}");
    dep_119.assert_problem(409, "environment_locked");
    assert_eq!(dep_119.json()["deployment_id"], dep_118.json()["id"]);
    assert_eq!(
        dep_119.json()["operation_id"].as_str(),
        Some(dep_118.operation_id()),
        "the 409 names the holder's operation, so the agent can poll it"
    );
    assert_eq!(retry_118.replayed(), Some("true"));
    assert_eq!(retry_118.body, dep_118.body, "the retry with its own key replays");
    assert_eq!(finished["commit_sha"], COMMIT_A1B2C3);
    assert_eq!(app.controller.stats().rollouts_started, 1, "one rollout, not two");
    let operation = app.operation(dep_118.operation_id()).await;
    assert_eq!(operation["state"], "completed");
    assert_eq!(operation["external_ref"], finished["controller_rollout_id"]);
}

/// The controller took the rollout and answers as if it were still starting
/// it: a conflict that is not a reused key, 425, 429 with a reason, 500, 503.
/// None says "not started": the deployment is unknown, its environment stays
/// locked, and the reconciler finds the one rollout.
async fn an_answer_that_may_mean_still_starting_leaves_the_deployment_unknown_and_locked_until_the_reconciler_finds_the_one_rollout(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let statuses = [409, 425, 429, 500, 503];

    for (i, status) in statuses.into_iter().enumerate() {
        // a service of its own each time, so each deployment has a lock of its own
        let service = format!("checkout-{i}");
        let release = |digest: &str, commit: &str| json!({"service": service, "environment": "staging", "artifact_digest": digest, "commit_sha": commit});
        app.controller.set_faults(Faults {
            answer_after_accepting: vec![status],
            ..Faults::default()
        });
        let first = app
            .deploy(&format!("deploy-{i}"), &release(&digest('a'), COMMIT_A1B2C3))
            .await;
        app.deliver().await;
        let after_answer = app.operation(first.operation_id()).await;
        let second = app
            .deploy(&format!("other-{i}"), &release(&digest('d'), COMMIT_D4E5F6))
            .await;
        assert_eq!(first.status, StatusCode::ACCEPTED, "{status}: {:?}", first.body);
        assert_eq!(after_answer["state"], "unknown", "{status}: {after_answer}");
        second.assert_problem(409, "environment_locked");

        app.controller.set_faults(Faults::default());
        app.reconcile().await;
        let finished = app.until(&first.str("id"), "succeeded").await;
        assert_eq!(finished["commit_sha"], COMMIT_A1B2C3, "{status}");
    }
    assert_eq!(
        app.controller.stats().rollouts_started,
        5,
        "one rollout per deployment, nothing started twice"
    );
}

/// A person who finds the rollout at the controller settles the unknown
/// deployment as the reconciler would have: handed over under that rollout,
/// its operation still in progress, and the watcher follows it to its end.
async fn an_unknown_deployment_an_admin_settles_by_hand_is_followed_to_its_end_like_one_the_reconciler_found(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", platform::Role::Admin).await;
    app.controller.set_faults(Faults {
        answer_after_accepting: vec![500],
        ..Faults::default()
    });
    let accepted = app
        .deploy("deploy-1", &release("staging", &digest('a'), Some(COMMIT_A1B2C3)))
        .await;
    let deployment_id = accepted.str("id");
    app.deliver().await;
    let rollouts: Value = reqwest::Client::new()
        .get(format!("{}/v1/rollouts", app.controller.url))
        .bearer_auth(deployments::controller::SANDBOX_CONTROLLER_KEY)
        .query(&[("reference", accepted.str("controller_idempotency_key"))])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rollout_id = rollouts["data"][0]["id"].as_str().unwrap().to_owned();

    let resolved = app
        .post(
            &format!("/v1/operations/{}/resolution", accepted.operation_id()),
            &admin,
            None,
            &json!({"outcome": "completed", "evidence": "the controller lists it", "external_ref": rollout_id}),
        )
        .await;
    let finished = app.until(&deployment_id, "succeeded").await;
    let operation = app.operation(accepted.operation_id()).await;

    assert_eq!(resolved.status, StatusCode::OK, "{:?}", resolved.body);
    assert_eq!(
        resolved.json()["state"],
        "in_progress",
        "the rollout goes on: {:?}",
        resolved.body
    );
    assert_eq!(resolved.json()["external_ref"], rollout_id.as_str());
    assert_eq!(finished["commit_sha"], COMMIT_A1B2C3);
    assert_eq!(operation["state"], "completed", "{operation}");
    assert_eq!(app.controller.stats().rollouts_started, 1, "nothing started twice");
}

/// "The claim decides before the lock is looked at": the same key with
/// another digest is 422 — not 409, and never a second rollout.
async fn the_same_key_with_another_digest_or_commit_is_422_and_starts_no_rollout(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app
        .deploy("deploy-1", &release("staging", &digest('a'), Some(COMMIT_A1B2C3)))
        .await;
    app.deliver().await;

    let other_digest = app
        .deploy("deploy-1", &release("staging", &digest('b'), Some(COMMIT_A1B2C3)))
        .await;
    let other_commit = app
        .deploy("deploy-1", &release("staging", &digest('a'), Some(COMMIT_D4E5F6)))
        .await;
    app.deliver().await;

    assert_eq!(first.status, StatusCode::ACCEPTED);
    for changed in [&other_digest, &other_commit] {
        changed.assert_problem(422, "idempotency_key_reused");
        assert_eq!(changed.json()["operation_id"].as_str(), Some(first.operation_id()));
    }
    assert_eq!(app.controller.stats().rollouts_started, 1);
    let listed = app
        .get("/v1/deployments?service=checkout&environment=staging", ACME_AGENT)
        .await
        .json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
}

async fn a_deployment_is_followed_to_succeeded_and_becomes_the_environment_s_current_release(backend: Backend) {
    let app = TestApp::spawn_with_step(backend, SLOW_STEP).await;

    let accepted = app.deploy("deploy-1", &release("staging", &digest('a'), None)).await;
    let id = accepted.str("id");
    let operation_id = accepted.operation_id().to_owned();
    let environment_while_queued = app.environment("checkout", "staging").await;
    app.deliver().await;
    app.until(&id, "running").await;
    let operation_while_running = app.operation(&operation_id).await;
    let finished = app.until(&id, "succeeded").await;
    let environment = app.environment("checkout", "staging").await;
    let operation = app.operation(&operation_id).await;
    let journal = app
        .get(&format!("/v1/audit?operation_id={operation_id}"), ACME_APPROVER)
        .await
        .json();

    assert_eq!(accepted.status, StatusCode::ACCEPTED);
    let body = accepted.json();
    assert!(id.starts_with("dep_"));
    assert_eq!(body["state"], "queued");
    assert_eq!(body["status_url"], format!("/v1/deployments/{id}"));
    let sent = idempotency::OperationIdentity {
        account_id: "acme",
        operation_id: accepted.operation_id(),
        idempotency_key: "deploy-1",
        fingerprint: operation["fingerprint"].as_str().unwrap(),
        route: operation["route"].as_str().unwrap(),
    };
    assert_eq!(
        body["controller_idempotency_key"],
        outbox::external_key(&sent),
        "the key is derived from the request the client sent"
    );
    assert_eq!(environment_while_queued["locked_by"]["deployment_id"], id);
    assert_eq!(environment_while_queued["current"], Value::Null);
    let states: Vec<&str> = finished["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|change| change["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["queued", "queued", "running", "succeeded"], "{finished}");
    assert!(finished["controller_rollout_id"].as_str().unwrap().starts_with("ro_"));
    assert_eq!(environment["current"]["id"], id);
    assert_eq!(
        environment["locked_by"],
        Value::Null,
        "a finished deployment frees the environment"
    );
    assert_eq!(
        operation_while_running["state"], "in_progress",
        "the operation ends with the rollout, not when the controller takes it"
    );
    assert_eq!(
        operation_while_running["external_ref"],
        finished["controller_rollout_id"]
    );
    assert_eq!(operation["state"], "completed");
    let events: Vec<&str> = journal["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        [
            "attempted",
            "claimed",
            "dispatched",
            "accepted",
            "state_changed",
            "completed"
        ],
        "the rollout's start is journaled by the watcher: {journal}"
    );
}

async fn a_stale_expected_current_deployment_is_409_version_mismatch(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app.deployed("deploy-1", &release("staging", &digest('a'), None)).await;
    let second = app.deployed("deploy-2", &release("staging", &digest('b'), None)).await;

    let mut stale = release("staging", &digest('c'), None);
    stale["expected_current_deployment_id"] = json!(first);
    let refused = app.deploy("deploy-3", &stale).await;
    let mut fresh = release("staging", &digest('c'), None);
    fresh["expected_current_deployment_id"] = json!(second);
    let accepted = app.deploy("deploy-4", &fresh).await;

    refused.assert_problem(409, "version_mismatch");
    assert_eq!(refused.json()["current_deployment_id"], second);
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{:?}", accepted.body);
    assert_eq!(accepted.json()["replaces"], second);
}

async fn a_failed_rollout_fails_the_deployment_and_frees_the_environment(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    app.controller.set_faults(Faults {
        fail_next_rollout: 1,
        ..Faults::default()
    });

    let failing = app.deploy("deploy-1", &release("staging", &digest('a'), None)).await;
    app.deliver().await;
    let failed = app.until(&failing.str("id"), "failed").await;
    let operation = app.operation(failing.operation_id()).await;
    let next = app.deploy("deploy-2", &release("staging", &digest('b'), None)).await;

    assert_eq!(operation["state"], "failed", "the operation fails with its rollout");

    let last = failed["history"].as_array().unwrap().last().unwrap().clone();
    assert!(last["note"].as_str().unwrap().contains("health checks"), "{last}");
    assert_eq!(next.status, StatusCode::ACCEPTED, "{:?}", next.body);
    assert_eq!(
        app.environment("checkout", "staging").await["current"],
        Value::Null,
        "a failed release is never current"
    );
}

async fn sixteen_racing_deployments_to_one_environment_hold_one_lock(backend: Backend) {
    let app = Arc::new(TestApp::spawn(backend).await);
    let digests = "0123456789abcdef";

    let racers = join_all(digests.chars().map(|fill| {
        let app = app.clone();
        tokio::spawn(async move {
            app.deploy(&format!("deploy-{fill}"), &release("staging", &digest(fill), None))
                .await
        })
    }))
    .await;

    let answers: Vec<_> = racers.into_iter().map(|r| r.unwrap()).collect();
    let accepted: Vec<_> = answers.iter().filter(|a| a.status == StatusCode::ACCEPTED).collect();
    assert_eq!(accepted.len(), 1, "one deployment holds the environment");
    for locked_out in answers.iter().filter(|a| a.status != StatusCode::ACCEPTED) {
        locked_out.assert_problem(409, "environment_locked");
        assert_eq!(locked_out.json()["deployment_id"], accepted[0].json()["id"]);
    }
}

/// Takes away what a failover to a standby that lagged behind loses of an
/// acknowledged deployment handed to the controller: its operation and event,
/// and the deployment with its history, which frees the environment's lock.
/// The rollout stays at the controller.
async fn lose_as_a_failover_would(app: &TestApp, accepted: &platform::testing::TestResponse) {
    let (deployment_id, operation_id) = (accepted.str("id"), accepted.operation_id().to_owned());
    on_pool!(app.db.db.write(), |pool| {
        for (sql, id) in [
            ("DELETE FROM idempotency_outbox WHERE operation_id = $1", &operation_id),
            (
                "DELETE FROM idempotency_operations WHERE operation_id = $1",
                &operation_id,
            ),
            (
                "DELETE FROM deployment_history WHERE deployment_id = $1",
                &deployment_id,
            ),
            ("DELETE FROM deployments WHERE id = $1", &deployment_id),
        ] {
            sqlx::query(sql).bind(id).execute(pool).await.unwrap();
        }
    });
}

/// A failover can lose a deployment the controller has taken. The agent's
/// retry (same key, same body) runs again as a new operation with a
/// deployment of its own id, and is sent to the controller as the same
/// request — the same key and the same body, reference included — so the
/// controller answers with the first rollout, and the watcher follows it to
/// the retry's end: one rollout, and an environment that is not left locked.
async fn a_deployment_lost_in_a_failover_reaches_the_controller_again_as_the_same_request_and_rolls_out_once(
    backend: Backend,
) {
    // no replay from memory: a replica that lived through the failover has forgotten
    let config = idempotency::IdempotencyConfig {
        replay_cache_entries: 0,
        ..idempotency::IdempotencyConfig::default()
    };
    let app = TestApp::spawn_configured(backend, STEP, config).await;
    let body = release("staging", &digest('a'), Some(COMMIT_A1B2C3));
    let first = app.deploy("deploy-1", &body).await;
    app.deliver().await;
    let first_rollout = app.deployment(&first.str("id")).await["controller_rollout_id"]
        .as_str()
        .unwrap()
        .to_owned();
    lose_as_a_failover_would(&app, &first).await;

    let retry = app.deploy("deploy-1", &body).await;
    app.deliver().await;
    let finished = app.until(&retry.str("id"), "succeeded").await;
    let operation = app.operation(retry.operation_id()).await;
    let environment = app.environment("checkout", "staging").await;

    assert_eq!(retry.status, StatusCode::ACCEPTED, "{:?}", retry.body);
    assert_eq!(retry.replayed(), Some("false"), "the database has no such operation");
    assert_ne!(retry.str("id"), first.str("id"), "a deployment of its own");
    assert_eq!(
        retry.str("controller_idempotency_key"),
        first.str("controller_idempotency_key"),
        "the key is the request's, not the operation's"
    );
    let stats = app.controller.stats();
    assert_eq!(stats.requests, 2, "the retry reached the controller");
    assert_eq!(stats.rollouts_started, 1, "one rollout for one release");
    assert_eq!(
        finished["controller_rollout_id"], first_rollout,
        "the retry's deployment follows the first rollout"
    );
    assert_eq!(operation["state"], "completed", "{operation}");
    assert_eq!(environment["current"]["id"], retry.str("id"));
    assert_eq!(environment["locked_by"], Value::Null, "the environment is free again");
}

async fn another_account_sees_none_of_it(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let ours = app.deploy("deploy-1", &release("staging", &digest('a'), None)).await;

    let seen = app
        .get(&format!("/v1/deployments/{}", ours.str("id")), GLOBEX_AGENT)
        .await;
    let environment = app.get("/v1/environments/checkout/staging", GLOBEX_AGENT).await.json();
    let theirs = app
        .post(
            "/v1/deployments",
            GLOBEX_AGENT,
            Some("deploy-1"),
            &release("staging", &digest('b'), None),
        )
        .await;

    seen.assert_problem(404, "not_found");
    assert_eq!(environment["locked_by"], Value::Null);
    assert_eq!(
        theirs.status,
        StatusCode::ACCEPTED,
        "keys and environments belong to their account"
    );
}

platform::both_backends!(
    the_article_s_failure_sequence_locks_out_the_second_plan_and_starts_one_rollout,
    an_answer_that_may_mean_still_starting_leaves_the_deployment_unknown_and_locked_until_the_reconciler_finds_the_one_rollout,
    an_unknown_deployment_an_admin_settles_by_hand_is_followed_to_its_end_like_one_the_reconciler_found,
    the_same_key_with_another_digest_or_commit_is_422_and_starts_no_rollout,
    a_deployment_is_followed_to_succeeded_and_becomes_the_environment_s_current_release,
    a_stale_expected_current_deployment_is_409_version_mismatch,
    a_failed_rollout_fails_the_deployment_and_frees_the_environment,
    sixteen_racing_deployments_to_one_environment_hold_one_lock,
    a_deployment_lost_in_a_failover_reaches_the_controller_again_as_the_same_request_and_rolls_out_once,
    another_account_sees_none_of_it,
);

//! A person settles a deployment whose outcome is unknown (docs/contract.md
//! §5), and what they say is checked with the controller where it can be: a
//! rollout they name must be this deployment's, `failed` needs the
//! controller's word that it holds none, and what cannot be checked is not
//! written.

use std::time::Duration;

use axum::http::StatusCode;
use deploy_controller::Faults;
use platform::{Backend, Role};
use serde_json::{Value, json};

use crate::support::{ACME_AGENT, ACME_APPROVER, GLOBEX_AGENT, SLOW_STEP, TestApp, TestResponse, digest, release};

async fn resolve(app: &TestApp, bearer: &str, operation_id: &str, body: &Value) -> TestResponse {
    app.post(&format!("/v1/operations/{operation_id}/resolution"), bearer, None, body)
        .await
}

/// A deployment of `service` to staging whose rollout request the controller
/// failed with a 503 before taking it: `unknown` to the service, and no
/// rollout at the controller. The 202's body.
async fn deployment_left_unknown_with_no_rollout(app: &TestApp, key: &str, service: &str) -> TestResponse {
    app.controller.set_faults(Faults {
        fail_next: 1,
        ..Faults::default()
    });
    let accepted = app
        .deploy(
            key,
            &json!({"service": service, "environment": "staging", "artifact_digest": digest('a')}),
        )
        .await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{:?}", accepted.body);
    app.deliver().await;
    assert_eq!(app.operation(accepted.operation_id()).await["state"], "unknown");
    accepted
}

/// The journal entries of one operation, as an approver reads them.
async fn journal(app: &TestApp, operation_id: &str) -> Vec<Value> {
    let entries = app
        .get(&format!("/v1/audit?operation_id={operation_id}"), ACME_APPROVER)
        .await
        .json();
    entries["data"].as_array().unwrap().clone()
}

/// Both accounts' services hand rollouts to the controller
/// with one key, so globex's rollout is visible to acme's lookups. acme's
/// admin names it for acme's deployment: refused and journaled, and acme's
/// cancel then has no rollout of globex's to reach — it runs to its end.
async fn an_admin_cannot_settle_a_deployment_with_another_account_s_rollout_which_acme_s_cancel_never_reaches(
    backend: Backend,
) {
    let app = TestApp::spawn_with_step(backend, SLOW_STEP).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let ours = deployment_left_unknown_with_no_rollout(&app, "deploy-1", "checkout").await;
    let theirs = app
        .post(
            "/v1/deployments",
            GLOBEX_AGENT,
            Some("globex-deploy-1"),
            &release("staging", &digest('b'), None),
        )
        .await
        .str("id");
    app.deliver().await;
    let their_rollout =
        app.get(&format!("/v1/deployments/{theirs}"), GLOBEX_AGENT).await.json()["controller_rollout_id"]
            .as_str()
            .expect("globex's rollout is handed over")
            .to_owned();
    let evidence = format!("{their_rollout} is in the controller's list");

    let refused = resolve(
        &app,
        &admin,
        ours.operation_id(),
        &json!({"outcome": "completed", "evidence": evidence, "external_ref": their_rollout}),
    )
    .await;
    let deployment = app.deployment(&ours.str("id")).await;
    let cancel = app
        .post(
            &format!("/v1/deployments/{}/cancel", ours.str("id")),
            ACME_AGENT,
            None,
            &json!({}),
        )
        .await;
    let their_end = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            app.service
                .controller
                .watch_once(&app.service.idempotency)
                .await
                .unwrap();
            let theirs = app.get(&format!("/v1/deployments/{theirs}"), GLOBEX_AGENT).await.json();
            if !["queued", "running"].contains(&theirs["state"].as_str().unwrap()) {
                return theirs;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("globex's rollout ends");
    let entries = journal(&app, ours.operation_id()).await;

    refused.assert_problem(422, "external_ref_mismatch");
    assert_eq!(deployment["state"], "unknown", "{deployment}");
    assert_eq!(deployment["controller_rollout_id"], Value::Null);
    cancel.assert_problem(409, "invalid_state");
    assert_eq!(their_end["state"], "succeeded", "{their_end}");
    assert_eq!(
        app.controller.stats().rollouts_cancelled,
        0,
        "nobody cancelled globex's rollout"
    );
    let refusal = entries
        .iter()
        .find(|e| e["event"] == "external_ref_refused")
        .unwrap_or_else(|| panic!("the refusal is journaled: {entries:?}"));
    assert_eq!(refusal["principal_id"], "acme-admin");
    assert_eq!(refusal["external_ref"], their_rollout.as_str());
    assert_eq!(refusal["evidence"], evidence.as_str());
    assert!(!entries.iter().any(|e| e["event"] == "resolved"), "{entries:?}");
}

/// `failed` needs the controller's word: refused while it holds the
/// deployment's rollout (which the problem names), 503 while it cannot be
/// asked, and accepted once it answers that it holds none — which frees the
/// environment.
async fn failed_by_hand_needs_the_controller_s_word_that_it_holds_no_rollout_for_the_deployment(backend: Backend) {
    let app = TestApp::spawn_with_step(backend, SLOW_STEP).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    app.controller.set_faults(Faults {
        answer_after_accepting: vec![500],
        ..Faults::default()
    });
    let started = app.deploy("deploy-1", &release("staging", &digest('a'), None)).await;
    app.deliver().await;
    let none = deployment_left_unknown_with_no_rollout(&app, "deploy-2", "search").await;
    let failed = json!({"outcome": "failed", "evidence": "the controller's list shows nothing for it"});

    let while_it_runs = resolve(&app, &admin, started.operation_id(), &failed).await;
    app.controller.server.go_down().await;
    let while_down = resolve(&app, &admin, none.operation_id(), &failed).await;
    let still = app.operation(none.operation_id()).await;
    app.controller.server.come_back().await;
    let once_back = resolve(&app, &admin, none.operation_id(), &failed).await;
    let deployment = app.deployment(&none.str("id")).await;
    let next = app
        .deploy(
            "deploy-3",
            &json!({"service": "search", "environment": "staging", "artifact_digest": digest('c')}),
        )
        .await;

    while_it_runs.assert_problem(409, "external_outcome_exists");
    let rollouts: Value = reqwest::Client::new()
        .get(format!("{}/v1/rollouts", app.controller.url))
        .bearer_auth(deployments::controller::SANDBOX_CONTROLLER_KEY)
        .query(&[("reference", started.str("controller_idempotency_key"))])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(while_it_runs.json()["external_ref"], rollouts["data"][0]["id"]);
    assert_eq!(app.operation(started.operation_id()).await["state"], "unknown");
    while_down.assert_problem(503, "external_system_unavailable");
    assert!(
        while_down
            .header("retry-after")
            .is_some_and(|s| s.parse::<u64>().is_ok())
    );
    assert_eq!(still["state"], "unknown", "nothing written: {still}");
    assert_eq!(once_back.status, StatusCode::OK, "{:?}", once_back.body);
    assert_eq!(once_back.json()["state"], "failed");
    assert_eq!(deployment["state"], "failed", "{deployment}");
    assert_eq!(
        next.status,
        StatusCode::ACCEPTED,
        "the environment is free: {:?}",
        next.body
    );
}

/// What a person can still settle when the controller is gone for good: the
/// deployment `completed` with no rollout. Nothing follows it at the
/// controller, so it ends here: `succeeded`, the environment's current
/// release, its operation `completed` — and no cancel reaches the controller.
async fn a_deployment_settled_completed_without_a_reference_succeeds_and_nothing_follows_it_at_the_controller(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let admin = app.create_key("acme", "acme-admin", Role::Admin).await;
    let accepted = deployment_left_unknown_with_no_rollout(&app, "deploy-1", "checkout").await;
    let id = accepted.str("id");
    app.controller.server.go_down().await;
    let evidence = "checkout/staging serves sha256:aaaa… since the controller's last backup";

    let resolved = resolve(
        &app,
        &admin,
        accepted.operation_id(),
        &json!({"outcome": "completed", "evidence": evidence}),
    )
    .await;
    let followed = app
        .service
        .controller
        .watch_once(&app.service.idempotency)
        .await
        .unwrap();
    let deployment = app.deployment(&id).await;
    let environment = app.environment("checkout", "staging").await;
    let cancel = app
        .post(&format!("/v1/deployments/{id}/cancel"), ACME_AGENT, None, &json!({}))
        .await;
    let entries = journal(&app, accepted.operation_id()).await;

    assert_eq!(resolved.status, StatusCode::OK, "{:?}", resolved.body);
    assert_eq!(resolved.json()["state"], "completed", "nothing will end it later");
    assert_eq!(resolved.json()["external_ref"], Value::Null);
    assert_eq!(followed, 0, "the watcher has nothing to follow");
    assert_eq!(deployment["state"], "succeeded", "{deployment}");
    assert_eq!(deployment["controller_rollout_id"], Value::Null);
    assert_eq!(environment["current"]["id"], id.as_str(), "{environment}");
    cancel.assert_problem(409, "invalid_state");
    let resolved_entry = entries.iter().find(|e| e["event"] == "resolved").unwrap();
    assert_eq!(resolved_entry["evidence"], evidence);
    assert_eq!(entries.last().unwrap()["event"], "completed", "{entries:?}");
    assert_eq!(app.controller.stats().rollouts_started, 0);
}

platform::both_backends!(
    an_admin_cannot_settle_a_deployment_with_another_account_s_rollout_which_acme_s_cancel_never_reaches,
    failed_by_hand_needs_the_controller_s_word_that_it_holds_no_rollout_for_the_deployment,
    a_deployment_settled_completed_without_a_reference_succeeds_and_nothing_follows_it_at_the_controller,
);

//! docs/contract.md §6 on deployments: every production deployment and every
//! rollback waits for a human, who approves that exact release — service,
//! environment, digest, commit, the release it replaces and whether a rollback
//! is possible.

use axum::http::StatusCode;
use deployments::store::{self, Replacing};
use platform::Backend;
use serde_json::json;

use crate::support::{ACME_AGENT, COMMIT_A1B2C3, TestApp, digest, release};

async fn a_production_deployment_waits_for_an_approval_of_its_exact_release_and_rolls_out_once(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let body = release("production", &digest('a'), Some(COMMIT_A1B2C3));
    let other = app
        .deploy("deploy-2", &release("production", &digest('b'), Some(COMMIT_A1B2C3)))
        .await;

    let requested = app.deploy("deploy-1", &body).await;
    app.deliver().await;
    let rollouts_before = app.controller.stats().rollouts_started;
    let request = requested.json();
    let wrong = app.decide(&request, "approve", &other.str("fingerprint")).await;
    let approved = app.decide(&request, "approve", &requested.str("fingerprint")).await;
    let run = app.deploy("deploy-1", &body).await;
    app.deliver().await;
    let replay = app.deploy("deploy-1", &body).await;
    app.deliver().await;

    assert_eq!(requested.status, StatusCode::ACCEPTED, "{:?}", requested.body);
    assert_eq!(request["state"], "awaiting_approval");
    let identifiers = &request["summary"]["identifiers"];
    assert_eq!(identifiers["service"], "checkout");
    assert_eq!(identifiers["environment"], "production");
    assert_eq!(identifiers["artifact_digest"], digest('a'));
    assert_eq!(identifiers["commit_sha"], COMMIT_A1B2C3);
    assert_eq!(identifiers["replaces"], "none");
    assert!(identifiers["rollback_possible"].as_str().unwrap().starts_with("no"));
    assert_eq!(rollouts_before, 0, "nothing rolls out before a human decides");
    wrong.assert_problem(409, "approval_fingerprint_mismatch");
    assert_eq!(approved.status, StatusCode::OK, "{:?}", approved.body);
    assert_eq!(run.status, StatusCode::ACCEPTED);
    assert_eq!(run.replayed(), Some("false"), "the approved retry runs it");
    assert_eq!(run.json()["state"], "queued");
    assert_eq!(replay.body, run.body);
    assert_eq!(app.controller.stats().rollouts_started, 1, "exactly one rollout");
}

async fn a_rollback_has_its_own_approval_takes_the_lock_and_says_what_it_replaces_and_restores(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let good = app
        .deployed("deploy-1", &release("staging", &digest('a'), Some(COMMIT_A1B2C3)))
        .await;
    let bad = app.deployed("deploy-2", &release("staging", &digest('b'), None)).await;
    let body = json!({"service": "checkout", "environment": "staging", "to_deployment_id": good,
                      "reason": "checkout errors since the new release"});

    let requested = app.rollback("rollback-1", &body).await;
    let approved = app
        .decide(&requested.json(), "approve", &requested.str("fingerprint"))
        .await;
    let run = app.rollback("rollback-1", &body).await;
    let meanwhile = app.deploy("deploy-3", &release("staging", &digest('c'), None)).await;
    app.deliver().await;
    let restored = app.until(&run.str("id"), "succeeded").await;
    let environment = app.environment("checkout", "staging").await;

    assert_eq!(requested.status, StatusCode::ACCEPTED);
    assert_eq!(
        requested.json()["state"],
        "awaiting_approval",
        "a rollback waits for a human even in staging"
    );
    assert_eq!(requested.replayed(), Some("false"), "a new operation, not a replay");
    assert_eq!(requested.json()["summary"]["identifiers"]["restores"], good);
    assert_eq!(requested.json()["summary"]["identifiers"]["replaces"], bad);
    assert_eq!(approved.status, StatusCode::OK);
    let rollback = run.json();
    assert!(rollback["id"].as_str().unwrap().starts_with("rb_"));
    assert_eq!(rollback["kind"], "rollback");
    assert_eq!(rollback["replaces"], bad);
    assert_eq!(rollback["restores"], good);
    assert_eq!(
        rollback["artifact_digest"],
        digest('a'),
        "the restored release's own digest"
    );
    assert_eq!(
        rollback["status_url"],
        format!("/v1/rollbacks/{}", rollback["id"].as_str().unwrap())
    );
    meanwhile.assert_problem(409, "environment_locked");
    assert_eq!(
        meanwhile.json()["deployment_id"],
        rollback["id"],
        "the rollback holds the lock"
    );
    assert_eq!(restored["reason"], "checkout errors since the new release");
    assert_eq!(environment["current"]["id"], rollback["id"]);
    assert_eq!(app.controller.stats().rollouts_started, 3);
}

async fn a_rollback_to_a_release_that_never_succeeded_there_is_refused_and_claims_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let current = app.deployed("deploy-1", &release("staging", &digest('a'), None)).await;
    let elsewhere = app
        .deployed("deploy-2", &release("development", &digest('b'), None))
        .await;
    let queued = app
        .deploy("deploy-3", &release("staging", &digest('c'), None))
        .await
        .str("id");
    let to = |target: &str| json!({"service": "checkout", "environment": "staging", "to_deployment_id": target, "reason": "back"});

    let not_finished = app.rollback("rollback-1", &to(&queued)).await;
    let other_environment = app.rollback("rollback-1", &to(&elsewhere)).await;
    let already_current = app.rollback("rollback-1", &to(&current)).await;
    let missing = app.rollback("rollback-1", &to("dep_missing")).await;

    for refused in [&not_finished, &other_environment, &already_current] {
        refused.assert_problem(409, "invalid_state");
    }
    missing.assert_problem(404, "not_found");
    let operations = app
        .get("/v1/operations?idempotency_key=rollback-1", ACME_AGENT)
        .await
        .json();
    assert_eq!(
        operations["data"],
        json!([]),
        "no human is asked about a rollback that cannot run"
    );
}

/// Environments are configuration: `prod` is not `production` under another
/// name, it is no environment at all. It is refused before anything is
/// claimed, naming the ones there are, and the same key then works for the
/// protected one — which waits for a human.
async fn an_unconfigured_environment_is_400_naming_the_known_ones_and_claims_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let current = app.deployed("deploy-0", &release("staging", &digest('a'), None)).await;

    let prod = app.deploy("deploy-1", &release("prod", &digest('b'), None)).await;
    let production = app.deploy("deploy-1", &release("production", &digest('b'), None)).await;
    let rollback = app
        .rollback(
            "rollback-1",
            &json!({"service": "checkout", "environment": "prod", "to_deployment_id": current, "reason": "back"}),
        )
        .await;
    let environment = app.get("/v1/environments/checkout/prod", ACME_AGENT).await;
    let claimed = app
        .get("/v1/operations?idempotency_key=rollback-1", ACME_AGENT)
        .await
        .json();

    prod.assert_problem(400, "unknown_environment");
    assert_eq!(
        prod.json()["known_environments"],
        json!(["development", "staging", "production"])
    );
    assert_eq!(prod.header("operation-id"), None, "nothing was claimed");
    assert_eq!(production.status, StatusCode::ACCEPTED, "{:?}", production.body);
    assert_eq!(
        production.json()["state"],
        "awaiting_approval",
        "the same key works once the environment is right, and production waits"
    );
    rollback.assert_problem(400, "unknown_environment");
    assert_eq!(claimed["data"], json!([]), "a refused rollback claims nothing");
    environment.assert_problem(400, "unknown_environment");
    assert_eq!(app.controller.stats().rollouts_started, 1);
}

/// A client (or a fuzzer) reading the document knows which environments there
/// are: every `environment` a request can name is one of the configured ones.
async fn the_document_names_the_configured_environments_wherever_a_request_takes_one(backend: Backend) {
    let app = TestApp::spawn(backend).await;

    let document = app.get("/openapi.json", ACME_AGENT).await.json();

    let known = json!(["development", "staging", "production"]);
    let schemas = &document["components"]["schemas"];
    assert_eq!(
        schemas["CreateDeploymentBody"]["properties"]["environment"]["enum"],
        known
    );
    assert_eq!(schemas["RollbackBody"]["properties"]["environment"]["enum"], known);
    let parameters = document["paths"]["/v1/environments/{service}/{environment}"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let environment = parameters.iter().find(|p| p["name"] == "environment").unwrap();
    assert_eq!(environment["schema"]["enum"], known);
}

/// What the approver was told a production deployment replaces must still be
/// so when the approved retry runs it. D1 is asked for while nothing runs in
/// production ("replaces nothing"); D2 is asked for, approved and rolls out;
/// then D1 is approved on its unchanged summary. D1's retry is refused as
/// stale — it never reaches the controller, its operation is `rejected`, and
/// every later retry gets the same 409 — and the same deployment under a new
/// key asks a human again, saying it replaces D2.
async fn an_approved_deployment_whose_replaced_release_changed_is_refused_as_stale_and_needs_a_new_approval(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let first = release("production", &digest('a'), Some(COMMIT_A1B2C3));
    let second = release("production", &digest('b'), Some(COMMIT_A1B2C3));
    let d1 = app.deploy("deploy-1", &first).await.json();
    let d2 = app.deploy("deploy-2", &second).await.json();
    app.decide(&d2, "approve", d2["fingerprint"].as_str().unwrap()).await;
    let d2_id = app.deploy("deploy-2", &second).await.str("id");
    app.deliver().await;
    app.until(&d2_id, "succeeded").await;

    let approved = app.decide(&d1, "approve", d1["fingerprint"].as_str().unwrap()).await;
    let stale = app.deploy("deploy-1", &first).await;
    app.deliver().await;
    let again = app.deploy("deploy-1", &first).await;
    let operation = app.operation(d1["operation_id"].as_str().unwrap()).await;
    let journal = app.journal_events(d1["operation_id"].as_str().unwrap()).await;
    let asked_anew = app.deploy("deploy-1b", &first).await.json();
    app.decide(&asked_anew, "approve", asked_anew["fingerprint"].as_str().unwrap())
        .await;
    let run = app.deploy("deploy-1b", &first).await;

    assert_eq!(d1["summary"]["identifiers"]["replaces"], "none");
    assert_eq!(approved.status, StatusCode::OK, "{:?}", approved.body);
    stale.assert_problem(409, "approval_stale");
    assert_eq!(stale.json()["state"], "rejected");
    assert_eq!(stale.json()["operation_id"], d1["operation_id"]);
    assert_eq!(stale.json()["approval_id"], d1["approval_id"]);
    assert!(stale.str("detail").contains(&d2_id), "{:?}", stale.body);
    assert_eq!(
        app.controller.stats().rollouts_started,
        1,
        "only D2 rolled out: D1 never reached the controller"
    );
    assert_eq!(app.environment("checkout", "production").await["current"]["id"], d2_id);
    assert_eq!(again.status, stale.status);
    assert_eq!(again.body, stale.body, "every later retry gets the same refusal");
    assert_eq!(again.replayed(), Some("true"));
    assert_eq!(operation["state"], "rejected");
    assert_eq!(journal.iter().filter(|e| *e == "stale").count(), 1, "{journal:?}");
    assert!(!journal.contains(&"completed".to_owned()), "{journal:?}");
    assert_eq!(asked_anew["state"], "awaiting_approval");
    assert_eq!(asked_anew["summary"]["identifiers"]["replaces"], d2_id);
    assert_eq!(run.status, StatusCode::ACCEPTED, "{:?}", run.body);
    assert_eq!(run.json()["replaces"], d2_id);
}

/// A rollback's approval names the release it replaces too: when another
/// release has gone out meanwhile, the approved rollback is refused as stale
/// and rolls nothing back.
async fn an_approved_rollback_whose_replaced_release_changed_is_refused_as_stale_and_rolls_nothing_back(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let good = app.deployed("deploy-1", &release("staging", &digest('a'), None)).await;
    let bad = app.deployed("deploy-2", &release("staging", &digest('b'), None)).await;
    let body = json!({"service": "checkout", "environment": "staging", "to_deployment_id": good,
                      "reason": "checkout errors since the new release"});
    let requested = app.rollback("rollback-1", &body).await.json();
    let newer = app.deployed("deploy-3", &release("staging", &digest('c'), None)).await;

    app.decide(&requested, "approve", requested["fingerprint"].as_str().unwrap())
        .await;
    let stale = app.rollback("rollback-1", &body).await;
    app.deliver().await;
    let again = app.rollback("rollback-1", &body).await;

    assert_eq!(requested["summary"]["identifiers"]["replaces"], bad);
    stale.assert_problem(409, "approval_stale");
    assert_eq!(again.body, stale.body);
    assert_eq!(
        app.operation(requested["operation_id"].as_str().unwrap()).await["state"],
        "rejected"
    );
    assert_eq!(app.controller.stats().rollouts_started, 3, "no rollback rolled out");
    assert_eq!(app.environment("checkout", "staging").await["current"]["id"], newer);
}

/// What the summary promised is held in the effect's own transaction, not
/// only compared before it: a deployment made as approved ("replaces
/// nothing") is refused as stale when, by the time it takes the
/// environment's lock, another release is current — however recently the
/// request read the environment.
async fn a_deployment_made_as_approved_is_refused_as_stale_in_its_transaction_once_another_release_is_current(
    backend: Backend,
) {
    let app = TestApp::spawn(backend).await;
    let current = app.deployed("deploy-1", &release("staging", &digest('a'), None)).await;
    let digest_b = deployments::domain::ArtifactDigest::parse(&digest('b')).unwrap();
    let new = |replacing| store::NewDeployment {
        kind: deployments::domain::DeploymentKind::Deployment,
        service: "checkout",
        environment: "staging",
        artifact_digest: &digest_b,
        commit_sha: None,
        restores: None,
        reason: None,
        expected_current: None,
        replacing,
    };

    let operation = |operation_id| idempotency::OperationIdentity {
        account_id: "acme",
        operation_id,
        idempotency_key: operation_id,
        fingerprint: "0",
        route: "/v1/deployments",
    };
    let mut tx = app.db.db.begin().await.unwrap();
    let refused = store::create(
        &mut tx,
        &operation("op_promised_nothing"),
        &new(Replacing::AsApproved(None)),
    )
    .await;
    tx.rollback().await.unwrap();
    let mut tx = app.db.db.begin().await.unwrap();
    let made = store::create(
        &mut tx,
        &operation("op_promised_current"),
        &new(Replacing::AsApproved(Some(&current))),
    )
    .await;
    tx.rollback().await.unwrap();

    let refused = refused.expect_err("the promise no longer holds");
    assert_eq!(refused.code(), "approval_stale");
    assert!(refused.detail().contains(&current), "{}", refused.detail());
    assert_eq!(
        made.expect("the promise holds").replaces.as_deref(),
        Some(current.as_str())
    );
}

platform::both_backends!(
    a_production_deployment_waits_for_an_approval_of_its_exact_release_and_rolls_out_once,
    a_rollback_has_its_own_approval_takes_the_lock_and_says_what_it_replaces_and_restores,
    a_rollback_to_a_release_that_never_succeeded_there_is_refused_and_claims_nothing,
    an_unconfigured_environment_is_400_naming_the_known_ones_and_claims_nothing,
    the_document_names_the_configured_environments_wherever_a_request_takes_one,
    an_approved_deployment_whose_replaced_release_changed_is_refused_as_stale_and_needs_a_new_approval,
    an_approved_rollback_whose_replaced_release_changed_is_refused_as_stale_and_rolls_nothing_back,
    a_deployment_made_as_approved_is_refused_as_stale_in_its_transaction_once_another_release_is_current,
);

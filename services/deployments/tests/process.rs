//! A real process, really killed (docs/contract.md §5): a `deployments` process
//! dies with SIGKILL after a deployment's outbox event was written and taken,
//! and before it was handed to the controller. A new process on the same
//! database finishes the work: the controller's own count says one rollout.
//!
//! The controller runs in the test process (it is the external system; it is
//! not the one that dies). `FAILPOINTS=outbox::before_delivery=return` holds
//! the outbox worker there until the test kills the process.

use std::time::Duration;

use axum::http::StatusCode;
use platform::{
    Backend,
    testing::{ACME_AGENT, ServiceProcess, TestDb},
};
use serde_json::json;

async fn start(database_url: &str, controller_url: &str, fail_point: Option<&str>) -> ServiceProcess {
    let fail_point = fail_point.map(|point| format!("{point}=return"));
    let mut env = vec![
        ("DEPLOYMENTS_DATABASE_URL", database_url),
        ("DEPLOYMENTS_CONTROLLER_URL", controller_url),
        // a held event is free again after 2 s
        ("RETRYSAFE_OUTBOX_LEASE_SECONDS", "2"),
        ("RETRYSAFE_OUTBOX_TIMEOUT_SECONDS", "1"),
        ("RETRYSAFE_RECONCILE_AFTER_SECONDS", "0.2"),
    ];
    env.extend(fail_point.as_deref().map(|point| ("FAILPOINTS", point)));
    ServiceProcess::start(env!("CARGO_BIN_EXE_deployments"), "deployments", &env).await
}

async fn a_deployment_killed_between_its_outbox_write_and_the_hand_over_rolls_out_once_after_restart(backend: Backend) {
    let db = TestDb::new(backend).await;
    let controller = deploy_controller::Controller::open(deploy_controller::ControllerConfig {
        step: Duration::from_millis(100),
        ..Default::default()
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let controller_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(deploy_controller::serve(
        listener,
        controller.clone(),
        std::future::pending(),
    ));
    let body = json!({"service": "checkout", "environment": "staging",
                      "artifact_digest": format!("sha256:{}", "a".repeat(64))});

    let mut doomed = start(&db.url, &controller_url, Some("outbox::before_delivery")).await;
    let accepted = doomed
        .client()
        .post("/v1/deployments", ACME_AGENT, Some("deploy-1"), &body)
        .await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "the agent has its answer");
    let deployment_id = accepted.str("id");
    doomed.wait_for("fail point reached").await;
    doomed.kill().await;
    let started_at_kill = controller.stats().rollouts_started;

    let restarted = start(&db.url, &controller_url, None).await;
    let succeeded = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let deployment = restarted
                .client()
                .get(&format!("/v1/deployments/{deployment_id}"), ACME_AGENT)
                .await
                .json();
            if deployment["state"] == "succeeded" {
                return deployment;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the restarted process hands the rollout over and follows it to its end");
    let retry = restarted
        .client()
        .post("/v1/deployments", ACME_AGENT, Some("deploy-1"), &body)
        .await;

    assert_eq!(started_at_kill, 0, "nothing reached the controller before the kill");
    assert_eq!(controller.stats().rollouts_started, 1, "exactly one rollout");
    assert!(succeeded["controller_rollout_id"].as_str().unwrap().starts_with("ro_"));
    assert_eq!(retry.replayed(), Some("true"));
    assert_eq!(retry.body, accepted.body, "the first answer survived the process");
    restarted.kill().await;
}

platform::both_backends!(a_deployment_killed_between_its_outbox_write_and_the_hand_over_rolls_out_once_after_restart);

//! A real process, really killed (docs/contract.md §5): a `deployments` process
//! dies with SIGKILL after a deployment's outbox event was written and taken,
//! and before it was handed to the controller. A new process on the same
//! database finishes the work: the controller's own count says one rollout.
//!
//! The controller runs in the test process (it is the external system; it is
//! not the one that dies). `FAILPOINTS=outbox::before_delivery=return` holds
//! the outbox worker there until the test kills the process.

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use platform::{
    Backend,
    testing::{ACME_AGENT, TestDb},
};
use serde_json::json;

async fn a_deployment_killed_between_its_outbox_write_and_the_hand_over_rolls_out_once_after_restart(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (controller, controller_url) = common::controller(Duration::from_millis(100)).await;
    let body = json!({"service": "checkout", "environment": "staging",
                      "artifact_digest": format!("sha256:{}", "a".repeat(64))});

    let mut doomed = common::start(&db.url, &controller_url, Some("outbox::before_delivery")).await;
    let accepted = doomed
        .client()
        .post("/v1/deployments", ACME_AGENT, Some("deploy-1"), &body)
        .await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "the agent has its answer");
    let deployment_id = accepted.str("id");
    doomed.wait_for("fail point reached").await;
    doomed.kill().await;
    let started_at_kill = controller.stats().rollouts_started;

    let restarted = common::start(&db.url, &controller_url, None).await;
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

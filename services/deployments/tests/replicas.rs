//! Replicas (docs/design.md §11): three `deployments` processes on one
//! PostgreSQL database, started at the same instant against an empty one.
//! A storm of one key and racing deployments to one environment, spread over
//! them, start one rollout each; the controller's own count says so.
//! PostgreSQL only: it is the backend replicas share.

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use futures::future::join_all;
use platform::{
    Backend,
    testing::{ACME_AGENT, ServiceProcess, TestDb, TestResponse},
};
use serde_json::{Value, json};

fn release(service: &str, fill: char) -> Value {
    json!({"service": service, "environment": "staging", "artifact_digest": format!("sha256:{}", fill.to_string().repeat(64))})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_one_database_start_one_rollout_per_deployment_and_hold_one_lock_per_environment() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = TestDb::new(Backend::Postgres).await;
    let (controller, controller_url) = common::controller(Duration::from_millis(50)).await;
    let replicas: Vec<ServiceProcess> = join_all((0..3).map(|_| common::start(&db.url, &controller_url, None))).await;
    let post = |i: usize, key: String, body: Value| {
        let client = replicas[i % 3].client();
        async move { client.post("/v1/deployments", ACME_AGENT, Some(&key), &body).await }
    };

    // 200 copies of one deployment request under one key, round-robin: one deployment
    let storm: Vec<TestResponse> =
        join_all((0..200).map(|i| post(i, "storm-1".to_owned(), release("checkout", 'a')))).await;
    // 16 deployments of another service under 16 keys, racing for its environment: one holds it
    let racers: Vec<TestResponse> =
        join_all((0..16).map(|i| post(i, format!("race-{i}"), release("billing", 'b')))).await;
    let succeeded = |deployment_id: String| {
        let client = replicas[2].client();
        async move {
            tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    let deployment = client
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
            .unwrap_or_else(|_| panic!("{deployment_id} never rolled out"))
        }
    };
    let holder = racers
        .iter()
        .find(|r| r.status == StatusCode::ACCEPTED)
        .expect("one racer holds the lock");
    let finished = succeeded(storm[0].str("id")).await;
    succeeded(holder.str("id")).await;

    assert!(
        storm.iter().all(|r| r.status == StatusCode::ACCEPTED),
        "{:?}",
        storm.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(storm.iter().filter(|r| r.replayed() == Some("false")).count(), 1);
    assert!(
        storm.iter().all(|r| r.body == storm[0].body),
        "the same bytes from every replica"
    );
    assert_eq!(finished["state"], "succeeded");
    let holders = racers.iter().filter(|r| r.status == StatusCode::ACCEPTED).count();
    assert_eq!(holders, 1, "{:?}", racers.iter().map(|r| r.status).collect::<Vec<_>>());
    for refused in racers.iter().filter(|r| r.status != StatusCode::ACCEPTED) {
        refused.assert_problem(409, "environment_locked");
    }
    assert_eq!(
        controller.stats().rollouts_started,
        2,
        "one rollout per deployment, over three replicas"
    );
    let entries = journal::all_entries(&db.db).await.unwrap();
    journal::verify(&entries, None).expect("the journal verifies");
    for replica in replicas {
        replica.kill().await;
    }
}

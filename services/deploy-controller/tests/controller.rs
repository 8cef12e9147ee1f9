//! The simulated controller over real HTTP: rollouts that take time, its own
//! idempotency, status by key and reference, cancellation, each fault, the
//! count of rollouts it really started — and a real crash mid-rollout, after
//! which the restarted process reports the rollout failed.

use std::time::Duration;

use deploy_controller::{Controller, ControllerConfig, Faults};
use platform::testing::ServiceProcess;
use serde_json::{Value, json};

const STEP: Duration = Duration::from_millis(300);

struct Running {
    url: String,
    controller: Controller,
    http: reqwest::Client,
}

async fn start() -> Running {
    let controller = Controller::open(ControllerConfig {
        step: STEP,
        ..ControllerConfig::default()
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(deploy_controller::serve(
        listener,
        controller.clone(),
        Default::default(),
        std::future::pending(),
    ));
    Running {
        url,
        controller,
        http: client(),
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_millis(800))
        .build()
        .unwrap()
}

fn rollout(reference: &str, digest_char: char) -> Value {
    json!({
        "service": "checkout",
        "environment": "staging",
        "artifact_digest": format!("sha256:{}", digest_char.to_string().repeat(64)),
        "commit_sha": "a1b2c3".repeat(6) + "a1b2",
        "kind": "deployment",
        "reference": reference,
    })
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    tenant: &str,
    key: &str,
    body: &Value,
) -> reqwest::Result<(u16, Option<String>, Value)> {
    let answer = http
        .post(format!("{url}/v1/rollouts"))
        .bearer_auth(tenant)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await?;
    let status = answer.status().as_u16();
    let replayed = answer
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    Ok((status, replayed, answer.json().await?))
}

async fn get(http: &reqwest::Client, url: &str, tenant: &str, path: &str) -> Value {
    http.get(format!("{url}{path}"))
        .bearer_auth(tenant)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

impl Running {
    async fn start_rollout(&self, key: &str, body: &Value) -> reqwest::Result<(u16, Option<String>, Value)> {
        post(&self.http, &self.url, "tenant-1", key, body).await
    }

    async fn get(&self, path: &str) -> Value {
        get(&self.http, &self.url, "tenant-1", path).await
    }
}

#[tokio::test]
async fn the_same_key_and_body_is_one_rollout_and_a_changed_body_starts_nothing() {
    let controller = start().await;

    let (first, replayed_first, body) = controller.start_rollout("k1", &rollout("dep_1", 'a')).await.unwrap();
    let (again, replayed, again_body) = controller.start_rollout("k1", &rollout("dep_1", 'a')).await.unwrap();
    let (changed, _, problem) = controller.start_rollout("k1", &rollout("dep_1", 'b')).await.unwrap();

    assert_eq!((first, replayed_first.as_deref()), (202, Some("false")));
    assert_eq!(body["state"], "queued");
    assert_eq!((again, replayed.as_deref()), (202, Some("true")));
    assert_eq!(again_body["id"], body["id"]);
    assert_eq!(
        (changed, problem["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );
    assert_eq!(controller.controller.stats().rollouts_started, 1);
    let events: Vec<String> = controller.controller.events().into_iter().map(|e| e.what).collect();
    assert!(events[0].starts_with("started ro_"), "{events:?}");
    assert!(events[1].starts_with("replayed ro_"), "{events:?}");
    assert!(events[2].starts_with("422"), "{events:?}");
}

impl Running {
    /// Polls a rollout until it is in `state` (within five seconds).
    async fn until(&self, rollout_id: &str, state: &str) -> Value {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let rollout = self.get(&format!("/v1/rollouts/{rollout_id}")).await;
                if rollout["state"] == state {
                    return rollout;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("rollout {rollout_id} never became {state}"))
    }
}

#[tokio::test]
async fn a_rollout_runs_then_succeeds_or_fails_as_told_and_is_found_by_key_and_reference() {
    let controller = start().await;
    controller.controller.set_faults(Faults {
        fail_next_rollout: 1,
        ..Faults::default()
    });

    let (_, _, failing) = controller.start_rollout("k1", &rollout("dep_1", 'a')).await.unwrap();
    let failing_id = failing["id"].as_str().unwrap();
    controller.until(failing_id, "running").await;
    controller.until(failing_id, "failed").await;
    let failed = controller.get("/v1/rollouts?idempotency_key=k1").await;
    let (_, _, next) = controller.start_rollout("k2", &rollout("dep_2", 'b')).await.unwrap();
    controller.until(next["id"].as_str().unwrap(), "succeeded").await;
    let by_reference = controller.get("/v1/rollouts?reference=dep_2").await;
    let other_tenant = get(
        &controller.http,
        &controller.url,
        "tenant-2",
        "/v1/rollouts?reference=dep_2",
    )
    .await;

    assert_eq!(failed["data"][0]["state"], "failed");
    assert!(failed["data"][0]["failure"].is_string());
    assert_eq!(by_reference["data"][0]["id"], next["id"]);
    assert_eq!(other_tenant["data"], json!([]), "each tenant sees its own rollouts");
}

#[tokio::test]
async fn a_rollout_is_cancelled_until_it_finishes_and_never_after() {
    let controller = start().await;
    let (_, _, first) = controller.start_rollout("k1", &rollout("dep_1", 'a')).await.unwrap();
    let (_, _, second) = controller.start_rollout("k2", &rollout("dep_2", 'b')).await.unwrap();
    let cancel = |id: &Value| {
        controller
            .http
            .post(format!(
                "{}/v1/rollouts/{}/cancel",
                controller.url,
                id.as_str().unwrap()
            ))
            .bearer_auth("tenant-1")
            .send()
    };

    let cancelled = cancel(&first["id"]).await.unwrap();
    let again = cancel(&first["id"]).await.unwrap();
    tokio::time::sleep(STEP * 3).await;
    let after = controller
        .get(&format!("/v1/rollouts/{}", first["id"].as_str().unwrap()))
        .await;
    let too_late = cancel(&second["id"]).await.unwrap();
    let stats = controller.get("/admin/stats").await;

    assert_eq!(cancelled.status(), 200);
    assert_eq!(again.status(), 200, "cancelling what is cancelled answers it unchanged");
    assert_eq!(after["state"], "cancelled", "a cancelled rollout never runs on");
    assert_eq!(too_late.status(), 409);
    assert_eq!(stats["cancel_requests"], 3);
    assert_eq!(
        stats["rollouts_cancelled"], 1,
        "only the first cancel stopped a rollout"
    );
}

#[tokio::test]
async fn a_failure_before_accepting_starts_nothing_and_a_dropped_answer_started_the_rollout() {
    let controller = start().await;
    controller.controller.set_faults(Faults {
        fail_next: 1,
        drop_next: 1,
        ..Faults::default()
    });

    let (refused, _, problem) = controller.start_rollout("k1", &rollout("dep_1", 'a')).await.unwrap();
    let started_after_refusal = controller.controller.stats().rollouts_started;
    let lost = controller.start_rollout("k1", &rollout("dep_1", 'a')).await;
    let found = controller.get("/v1/rollouts?idempotency_key=k1").await;
    let (retried, replayed, _) = controller.start_rollout("k1", &rollout("dep_1", 'a')).await.unwrap();

    assert_eq!(
        (refused, problem["code"].as_str()),
        (503, Some("controller_unavailable"))
    );
    assert_eq!(started_after_refusal, 0);
    assert!(lost.unwrap_err().is_timeout(), "the caller never gets an answer");
    assert_eq!(found["data"].as_array().unwrap().len(), 1, "yet the rollout started");
    assert_eq!((retried, replayed.as_deref()), (202, Some("true")));
    assert_eq!(controller.controller.stats().rollouts_started, 1);
}

#[tokio::test]
async fn a_crash_is_refused_where_the_controller_shares_its_process() {
    let controller = start().await;

    let answer = controller
        .http
        .put(format!("{}/admin/faults", controller.url))
        .json(&json!({"crash_next_rollout": 1}))
        .send()
        .await
        .unwrap();

    assert_eq!(answer.status(), 400);
}

/// The controller as its own process, really crashing mid-rollout: after the
/// restart, the rollout it was running is reported failed, never resumed, and
/// its key still names it.
#[tokio::test]
async fn a_controller_that_crashes_mid_rollout_reports_it_failed_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("controller.json");
    let env = [
        ("DEPLOY_CONTROLLER_STATE", state.to_str().unwrap()),
        ("DEPLOY_CONTROLLER_STEP_MS", "200"),
    ];
    let start = || {
        ServiceProcess::start_with(
            env!("CARGO_BIN_EXE_deploy-controller"),
            "DEPLOY_CONTROLLER_ADDR",
            "simulated deployment controller listening",
            &env,
        )
    };
    let http = client();

    let doomed = start().await;
    let faults = http
        .put(format!("{}/admin/faults", doomed.base))
        .json(&json!({"crash_next_rollout": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(faults.status(), 200);
    let (accepted, _, started) = post(&http, &doomed.base, "tenant-1", "k1", &rollout("dep_1", 'a'))
        .await
        .unwrap();
    assert_eq!(accepted, 202);
    assert_eq!(
        doomed.exited().await,
        Some(deploy_controller::CRASH_EXIT_CODE),
        "the process went down with the rollout"
    );

    let restarted = start().await;
    let after = get(&http, &restarted.base, "tenant-1", "/v1/rollouts?idempotency_key=k1").await;
    let stats: Value = http
        .get(format!("{}/admin/stats", restarted.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (again, replayed, _) = post(&http, &restarted.base, "tenant-1", "k1", &rollout("dep_1", 'a'))
        .await
        .unwrap();

    assert_eq!(after["data"][0]["id"], started["id"]);
    assert_eq!(after["data"][0]["state"], "failed");
    assert!(after["data"][0]["failure"].as_str().unwrap().starts_with("interrupted"));
    assert_eq!(stats["rollouts_started"], 1, "the count survived the crash");
    assert_eq!(
        (again, replayed.as_deref()),
        (202, Some("true")),
        "the key still names the same rollout: it is not started twice"
    );
    restarted.kill().await;
}

#[test]
fn help_prints_the_usage_and_exits() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_deploy-controller"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(output.stdout).unwrap();

    assert!(output.status.success());
    assert!(help.contains("Usage: deploy-controller"), "{help}");
    assert!(help.contains("--state-file"), "{help}");
}

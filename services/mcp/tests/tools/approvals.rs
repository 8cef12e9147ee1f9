//! Writes that await approval: the same call, made again once approved,
//! answers the run.

use platform::Backend;
use serde_json::json;

use crate::{eventually, support::*};

async fn a_protected_deployment_awaits_approval_and_the_same_call_then_answers_the_run(backend: Backend) {
    let world = World::start(backend).await;
    let mcp = world.connect().await;
    let service = unique("web");
    let deploy = json!({"intent": "release 1.2 to production", "service": service, "environment": "production",
                        "artifact_digest": digest("release-1.2")});
    let waiting = mcp.call("create_deployment", deploy.clone()).await;
    assert_eq!(waiting.outcome(), "awaiting_approval");
    assert_eq!(waiting.next_step(), "wait for approval");
    let approval_id = waiting.json["approval"]["approval_id"].as_str().unwrap().to_owned();
    assert!(
        waiting.json["approval"]["status_url"]
            .as_str()
            .unwrap()
            .contains("/v1/operations/")
    );
    assert!(waiting.json["approval"]["summary"].is_object());

    let read = mcp.call("get_approval", json!({"approval_id": approval_id})).await;
    assert_eq!(read.outcome(), "found");
    assert_eq!(read.json["resource"]["state"], "pending");
    assert_eq!(read.next_step(), "wait for approval");
    approve(&world, &approval_id).await;
    let decided = mcp.call("get_approval", json!({"approval_id": approval_id})).await;
    assert_eq!(decided.json["resource"]["state"], "approved");
    assert_eq!(decided.next_step(), "call again with the same intent");
    let approved = mcp
        .call("get_operation", json!({"intent": "release 1.2 to production"}))
        .await;
    assert_eq!(approved.json["resource"]["state"], "awaiting_approval");
    assert_eq!(
        approved.next_step(),
        "call again with the same intent",
        "approved: the same call runs it"
    );

    let ran = mcp.call("create_deployment", deploy).await;
    assert_eq!(ran.json["http_status"], 202, "{}", ran.json);
    assert_eq!(ran.outcome(), "created", "the approved run is this call's");
    assert_eq!(ran.next_step(), "poll get_operation");
    let deployment_id = ran.json["resource"]["id"].as_str().unwrap().to_owned();

    let operation = mcp
        .call("get_operation", json!({"intent": "release 1.2 to production"}))
        .await;
    assert_eq!(operation.outcome(), "found");
    assert_eq!(operation.json["operation_id"], ran.json["operation_id"]);
    assert_ne!(operation.json["resource"]["state"], "awaiting_approval");
    let by_key = mcp
        .call("get_operation", json!({"idempotency_key": ran.str("idempotency_key")}))
        .await;
    assert_eq!(by_key.json["operation_id"], ran.json["operation_id"]);
    let by_id = mcp
        .call("get_operation", json!({"operation_id": ran.str("operation_id")}))
        .await;
    assert_eq!(by_id.json["resource"]["idempotency_key"], ran.json["idempotency_key"]);
    let never = mcp
        .call("get_operation", json!({"intent": "an intent never used"}))
        .await;
    assert_eq!(never.outcome(), "not_found");
    assert_eq!(
        never.next_step(),
        "call again with the same intent",
        "nothing was claimed: sending is safe"
    );
    let unknown_key = mcp
        .call("get_operation", json!({"idempotency_key": "never-sent"}))
        .await;
    assert_eq!(unknown_key.outcome(), "not_found");
    let unknown_id = mcp.call("get_operation", json!({"operation_id": "op_none"})).await;
    assert_eq!(unknown_id.outcome(), "not_found");
    assert_eq!(unknown_id.next_step(), "stop: new intent or human review");

    let deployment = eventually(&mcp, "get_deployment", json!({"deployment_id": deployment_id}), |d| {
        d["state"] == "succeeded"
    })
    .await;
    assert_eq!(deployment["service"], service.as_str());
    let environment = mcp
        .call(
            "get_environment",
            json!({"service": service, "environment": "production"}),
        )
        .await;
    assert_eq!(environment.json["resource"]["current"]["id"], deployment_id.as_str());
}

async fn a_rollback_always_awaits_approval(backend: Backend) {
    let world = World::start(backend).await;
    let mcp = world.connect().await;
    let service = unique("web");
    let mut releases = Vec::new();
    for version in ["1.0", "1.1"] {
        let deploy = json!({"intent": format!("staging {version}"), "service": service, "environment": "staging",
                            "artifact_digest": digest(version)});
        let created = mcp.call("create_deployment", deploy).await;
        assert_eq!(created.outcome(), "created");
        let id = created.json["resource"]["id"].as_str().unwrap().to_owned();
        eventually(&mcp, "get_deployment", json!({"deployment_id": id}), |d| {
            d["state"] == "succeeded"
        })
        .await;
        releases.push(id);
    }
    let rollback = mcp
        .call(
            "create_rollback",
            json!({"intent": "back to 1.0", "service": service, "environment": "staging",
                   "to_deployment_id": releases[0], "reason": "errors after 1.1"}),
        )
        .await;
    assert_eq!(rollback.outcome(), "awaiting_approval", "{}", rollback.json);
    assert_eq!(rollback.next_step(), "wait for approval");
}

/// Approves an approval as the approver does, over HTTP, echoing its fingerprint.
async fn approve(world: &World, approval_id: &str) {
    let approval = world
        .get(
            &world.deployments,
            &format!("/v1/approvals/{approval_id}"),
            ACME_APPROVER,
        )
        .await;
    let (status, body) = world
        .post(
            &world.deployments,
            &format!("/v1/approvals/{approval_id}/decision"),
            ACME_APPROVER,
            json!({"decision": "approve", "fingerprint": approval["fingerprint"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
}

platform::both_backends!(
    a_protected_deployment_awaits_approval_and_the_same_call_then_answers_the_run,
    a_rollback_always_awaits_approval,
);

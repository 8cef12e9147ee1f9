//! The `tickets` binary's command line: `--help`, and `create-api-key`,
//! which makes a key outside sandbox mode that then authenticates with the
//! role it was given.

use platform::{
    Backend,
    testing::{ServiceProcess, TestDb, create_api_key, help_of},
};

const BINARY: &str = env!("CARGO_BIN_EXE_tickets");

#[test]
fn help_prints_the_usage_and_exits() {
    let help = help_of(BINARY);

    assert!(help.contains("Usage: tickets"), "{help}");
    assert!(help.contains("create-api-key"), "{help}");
}

async fn a_key_made_by_create_api_key_acts_with_the_role_it_was_given(backend: Backend) {
    let db = TestDb::new(backend).await;
    let approver = create_api_key(BINARY, "tickets", &db.url, ["acme", "alice", "approver"]);
    let agent = create_api_key(BINARY, "tickets", &db.url, ["acme", "bot", "agent"]);
    let service = ServiceProcess::start(
        BINARY,
        "tickets",
        &[("TICKETS_DATABASE_URL", &db.url), ("RETRYSAFE_SANDBOX", "false")],
    )
    .await;

    let status_for = async |key: &str| {
        reqwest::Client::new()
            .get(format!("{}/v1/approvals", service.base))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(status_for(&approver).await, 200, "an approver reads approvals");
    assert_eq!(status_for(&agent).await, 403, "an agent may not");
    assert_eq!(
        status_for("demo-acme-approver").await,
        401,
        "no demo keys outside the sandbox"
    );
    service.kill().await;
}

platform::both_backends!(a_key_made_by_create_api_key_acts_with_the_role_it_was_given);

//! The `tickets` binary's command line: `--help`, and `create-api-key`,
//! which makes a key outside sandbox mode that then authenticates with the
//! role it was given.

use platform::{
    Backend,
    testing::{ACME_AGENT, ServiceProcess, TestDb, help_of, keys_made_by_create_api_key_act_with_their_roles},
};

const BINARY: &str = env!("CARGO_BIN_EXE_tickets");

#[test]
fn help_prints_the_usage_and_exits() {
    let help = help_of(BINARY);

    assert!(help.contains("Usage: tickets"), "{help}");
    assert!(help.contains("create-api-key"), "{help}");
}

async fn a_key_made_by_create_api_key_acts_with_the_role_it_was_given(backend: Backend) {
    keys_made_by_create_api_key_act_with_their_roles(BINARY, "tickets", backend).await;
}

/// `RETRYSAFE_REPLAY_CACHE=0` keeps no answer in memory (docs/configuration.md):
/// the service starts, and every replay is read from the database.
async fn with_no_replay_cache_the_service_starts_and_replays_from_the_database(backend: Backend) {
    let db = TestDb::new(backend).await;
    let service = ServiceProcess::start(
        BINARY,
        "tickets",
        &[("TICKETS_DATABASE_URL", &db.url), ("RETRYSAFE_REPLAY_CACHE", "0")],
    )
    .await;
    let body = r#"{"project":"ops","title":"Rotate staging certificate"}"#;
    let first = service
        .client()
        .post("/v1/tickets", ACME_AGENT, Some("no-cache"), body)
        .await;
    let again = service
        .client()
        .post("/v1/tickets", ACME_AGENT, Some("no-cache"), body)
        .await;
    assert_eq!(first.status, 201);
    assert_eq!(again.replayed(), Some("true"));
    assert_eq!(again.body, first.body);
}

#[tokio::test]
async fn a_replay_cache_size_that_is_not_a_number_stops_the_service_naming_the_variable() {
    let output = tokio::process::Command::new(BINARY)
        .env("RETRYSAFE_REPLAY_CACHE", "lots")
        .env("TICKETS_ADDR", "127.0.0.1:0")
        .env("RETRYSAFE_DATA_DIR", tempfile::tempdir().unwrap().path())
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("RETRYSAFE_REPLAY_CACHE `lots`"), "{said}");
}

platform::both_backends!(
    a_key_made_by_create_api_key_acts_with_the_role_it_was_given,
    with_no_replay_cache_the_service_starts_and_replays_from_the_database,
);

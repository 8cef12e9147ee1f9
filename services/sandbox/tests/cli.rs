//! The sandbox's command line: `--help` says what the sandbox runs and how it
//! is configured, and exits instead of starting it; `create-api-key` makes a
//! key for one of its services, in the database the sandbox gives it.

use platform::{Authenticator, Backend, Role, auth::ApiKey, testing::TestDb};

const BINARY: &str = env!("CARGO_BIN_EXE_sandbox");

#[test]
fn help_prints_the_usage_and_exits_without_starting_the_sandbox() {
    let help = platform::testing::help_of(BINARY);

    assert!(help.contains("Usage: sandbox"), "{help}");
    assert!(help.contains("RETRYSAFE_DATA_DIR"), "{help}");
    assert!(help.contains("create-api-key"), "{help}");
}

#[test]
fn a_port_already_in_use_names_the_server_its_address_and_the_variable_that_moves_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    // every other server on a free port: the MCP endpoint, bound last, meets the taken one
    let elsewhere = [
        "TICKETS_ADDR",
        "PAYMENTS_ADDR",
        "DEPLOYMENTS_ADDR",
        "PAYMENT_PROVIDER_ADDR",
        "DEPLOY_CONTROLLER_ADDR",
        "CONSOLE_ADDR",
    ]
    .map(|variable| (variable, "127.0.0.1:0"));

    let said = stopped_sandbox(&[elsewhere.as_slice(), &[("MCP_ADDR", addr.as_str())]].concat());

    assert!(said.contains("the MCP endpoint"), "names the server: {said}");
    assert!(said.contains(&addr), "names the address: {said}");
    assert!(said.contains("MCP_ADDR="), "names the variable that moves it: {said}");
    assert!(said.contains("already in use"), "says why: {said}");
}

#[test]
fn a_time_setting_too_long_for_any_clock_stops_the_sandbox_naming_the_setting_without_a_panic() {
    for (variable, value) in [
        ("RETRYSAFE_LEASE_SECONDS", "1e300"),
        ("RETRYSAFE_REAP_EVERY_SECONDS", "1e19"),
        ("RETRYSAFE_RETENTION_HOURS", "1e7"),
        ("RETRYSAFE_OUTBOX_LEASE_SECONDS", "1e300"),
    ] {
        let said = stopped_sandbox(&[(variable, value)]);
        assert!(said.contains(variable), "names the setting: {said}");
        assert!(!said.contains("panicked"), "no panic: {said}");
    }
}

/// The sandbox's complaint when it stops at start-up with `settings`, on a data directory of its own.
/// A sandbox that starts instead is killed, and the test fails rather than waits for it.
fn stopped_sandbox(settings: &[(&str, &str)]) -> String {
    let data = tempfile::tempdir().unwrap();
    let mut sandbox = std::process::Command::new(BINARY)
        .envs(settings.iter().copied())
        .env("RETRYSAFE_DATA_DIR", data.path())
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the sandbox binary starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = sandbox.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            sandbox.kill().unwrap();
            panic!("the sandbox started with {settings:?} instead of stopping");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut said = String::new();
    std::io::Read::read_to_string(&mut sandbox.stderr.take().unwrap(), &mut said).unwrap();
    assert!(!status.success(), "the sandbox stops: {said}");
    said
}

async fn create_api_key_makes_a_key_for_the_service_named_that_acts_with_its_role(backend: Backend) {
    let payments = TestDb::new(backend).await;

    let output = std::process::Command::new(BINARY)
        .args(["create-api-key", "--service", "payments", "acme", "alice", "approver"])
        .env_remove("DATABASE_URL")
        .env("PAYMENTS_DATABASE_URL", &payments.url)
        .output()
        .expect("the sandbox binary starts");

    assert!(output.status.success(), "create-api-key exits 0: {output:?}");
    let key = String::from_utf8(output.stdout).expect("the key is UTF-8");
    let principal = Authenticator::new(payments.db.clone(), false)
        .authenticate(&ApiKey::new(key.trim()))
        .await
        .expect("the printed key authenticates on the payments database");
    assert_eq!(
        (
            principal.account_id.as_str(),
            principal.principal_id.as_str(),
            principal.role
        ),
        ("acme", "alice", Role::Approver)
    );
}

platform::both_backends!(create_api_key_makes_a_key_for_the_service_named_that_acts_with_its_role);

//! The runner's command line: prebuilt binaries instead of `cargo build`.

use std::process::Command;

const RUNNER: &str = env!("CARGO_BIN_EXE_scenarios");

#[test]
fn help_says_the_runner_builds_with_cargo_unless_given_prebuilt_binaries() {
    let output = Command::new(RUNNER).arg("--help").output().unwrap();
    let help = String::from_utf8(output.stdout).unwrap();

    assert!(output.status.success());
    assert!(help.contains("--bin-dir"), "{help}");
    assert!(help.contains("cargo build"), "{help}");
}

#[test]
fn a_bin_dir_without_the_sandbox_is_refused_before_anything_is_built_or_played() {
    let empty = tempfile::tempdir().unwrap();
    let output = Command::new(RUNNER)
        .args(["all", "--bin-dir"])
        .arg(empty.path())
        // a runner that called cargo anyway would fail differently
        .env("CARGO", "/nonexistent/cargo")
        .output()
        .unwrap();
    let error = String::from_utf8(output.stderr).unwrap();

    assert!(!output.status.success());
    assert!(error.contains("no `sandbox` binary there"), "{error}");
}

#[test]
fn a_story_is_played_with_the_binaries_from_bin_dir_and_nothing_is_built() {
    let dir = tempfile::tempdir().unwrap();
    for binary in ["sandbox", "agent", "payment-provider", "deploy-controller", "mcp"] {
        // not a program: the story fails on it, which shows it was the one started
        std::fs::write(dir.path().join(binary), "").unwrap();
    }
    let output = Command::new(RUNNER)
        .args(["1-dropped-answer", "--bin-dir"])
        .arg(dir.path())
        .arg("--out")
        .arg(dir.path().join("report"))
        .env("CARGO", "/nonexistent/cargo")
        .output()
        .unwrap();
    let table = String::from_utf8(output.stdout).unwrap();

    assert!(!output.status.success());
    assert!(table.contains("1-dropped-answer on sqlite"), "{table}");
    assert!(
        table.contains(&format!("{}", dir.path().join("payment-provider").display())),
        "{table}"
    );
}

#[test]
fn list_names_every_matrix_cell_and_the_delivery_kills_only_for_routes_the_outbox_delivers() {
    let output = Command::new(RUNNER).arg("list").output().unwrap();
    let list = String::from_utf8(output.stdout).unwrap();

    assert!(output.status.success());
    let routes = [
        "ticket-create",
        "ticket-comment",
        "intent-create",
        "capture",
        "refund",
        "intent-cancel",
        "deployment-create",
        "deployment-cancel",
        "rollback",
    ];
    for route in routes {
        for test in [
            "1a-dropped-answer",
            "2-parallel-copies",
            "3-agent-restarted",
            "4-changed-payload",
            "5a-killed-before-the-commit",
        ] {
            assert!(list.contains(&format!("{route}/{test}\n")), "{route}/{test}: {list}");
        }
    }
    for route in ["capture", "refund", "deployment-create", "rollback"] {
        assert!(list.contains(&format!("{route}/5c-killed-after-delivery\n")), "{list}");
    }
    assert!(!list.contains("ticket-create/5b-killed-before-delivery"), "{list}");
}

#[test]
fn a_name_that_is_no_story_route_or_cell_is_refused_before_anything_is_built() {
    let output = Command::new(RUNNER)
        .args(["refund/6-no-such-test"])
        .env("CARGO", "/nonexistent/cargo")
        .output()
        .unwrap();
    let error = String::from_utf8(output.stderr).unwrap();

    assert!(!output.status.success());
    assert!(
        error.contains("no story, route or cell `refund/6-no-such-test`"),
        "{error}"
    );
}

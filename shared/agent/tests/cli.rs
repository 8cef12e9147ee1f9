//! The agent's command line refuses what it cannot hold before it sends anything.

const BINARY: &str = env!("CARGO_BIN_EXE_agent");

#[test]
fn a_number_of_seconds_no_clock_holds_is_a_usage_error_that_names_its_flag_without_a_panic() {
    let journal = tempfile::tempdir().unwrap();
    for (flag, seconds) in [
        ("--timeout", "inf"),
        ("--timeout", "1e300"),
        ("--follow", "-1"),
        ("--follow", "NaN"),
        ("--follow", "1e19"),
    ] {
        let output = std::process::Command::new(BINARY)
            .args(["--journal"])
            .arg(journal.path().join("journal.db"))
            .args([
                "run",
                "a-ticket",
                "--url",
                "http://127.0.0.1:9",
                "--path",
                "/v1/tickets",
            ])
            .args(["--data", "{}", &format!("{flag}={seconds}")])
            .output()
            .expect("the agent binary starts");

        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{flag} {seconds} is a usage error: {said}"
        );
        assert!(said.contains(flag), "names the flag: {said}");
        assert!(!said.contains("panicked"), "no panic: {said}");
    }
}

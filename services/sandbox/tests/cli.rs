//! `sandbox --help` says what the sandbox runs and how it is configured, and
//! exits instead of starting it.

#[test]
fn help_prints_the_usage_and_exits_without_starting_the_sandbox() {
    let help = platform::testing::help_of(env!("CARGO_BIN_EXE_sandbox"));

    assert!(help.contains("Usage: sandbox"), "{help}");
    assert!(help.contains("RETRYSAFE_DATA_DIR"), "{help}");
}

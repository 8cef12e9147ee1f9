//! The `tickets` binary's command line: `--help`, and `create-api-key`,
//! which makes a key outside sandbox mode that then authenticates with the
//! role it was given.

use platform::{
    Backend,
    testing::{help_of, keys_made_by_create_api_key_act_with_their_roles},
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

platform::both_backends!(a_key_made_by_create_api_key_acts_with_the_role_it_was_given);

//! Which captures wait for a human: a threshold per currency, in its major
//! units, as `PAYMENTS_CAPTURE_THRESHOLDS` names them.

use payments::{domain::PaymentsPolicy, money::Money};

fn waits(policy: &PaymentsPolicy, amount: &str, currency: &str) -> bool {
    policy.capture_needs_approval(&Money::parse(amount, currency).unwrap())
}

#[test]
fn thresholds_are_read_per_currency_in_its_major_units() {
    let policy = PaymentsPolicy::parse(" EUR=1000, JPY = 150000 ,KWD=300,").unwrap();

    assert!(waits(&policy, "1000.00", "EUR"));
    assert!(!waits(&policy, "999.99", "EUR"));
    assert!(waits(&policy, "150000", "JPY"));
    assert!(!waits(&policy, "149999", "JPY"));
    assert!(waits(&policy, "300.000", "KWD"));
    assert!(!waits(&policy, "299.999", "KWD"));
    assert!(waits(&policy, "0.01", "USD"), "USD is not named: every capture waits");
}

#[test]
fn the_sandbox_default_names_eur_usd_gbp_chf_jpy_and_kwd() {
    let expected = PaymentsPolicy::parse("EUR=1000,USD=1000,GBP=1000,CHF=1000,JPY=150000,KWD=300").unwrap();

    assert_eq!(PaymentsPolicy::default(), expected);
}

#[test]
fn a_threshold_that_is_not_a_currency_and_a_whole_number_or_is_given_twice_is_refused() {
    for bad in [
        "EUR",
        "EUR=1000.50",
        "EUR=-1",
        "eur=1000",
        "XAU=10",
        "ABC=10",
        "EUR=ten",
        "EUR=1000,EUR=10",
    ] {
        assert!(PaymentsPolicy::parse(bad).is_err(), "{bad}");
    }
}

//! Amount strings into minor units, by each currency's ISO 4217 exponent,
//! before the fingerprint: what is accepted, what is refused and why, and
//! what becomes one command.

use idempotency::Fingerprint;
use payments::money::{AmountText, Money, MoneyError};

#[test]
fn amounts_become_minor_units_by_the_currency_s_exponent() {
    let table = [
        ("12.50", "EUR", 1250),
        ("12.5", "EUR", 1250),
        ("12", "EUR", 1200),
        ("0.01", "USD", 1),
        ("1250", "JPY", 1250),
        ("1000", "KRW", 1000),
        ("1.250", "KWD", 1250),
        ("0.005", "BHD", 5),
        ("12.3", "TND", 12300),
        ("10000000000000.00", "EUR", 1_000_000_000_000_000),
        ("1000000000000000", "JPY", 1_000_000_000_000_000),
        ("1000000000000.000", "KWD", 1_000_000_000_000_000),
    ];
    for (amount, currency, minor) in table {
        let money = Money::parse(amount, currency).unwrap_or_else(|e| panic!("{amount} {currency}: {e}"));
        assert_eq!(money.amount_minor, minor, "{amount} {currency}");
        assert_eq!(money.currency_code(), currency);
    }
}

#[test]
fn answers_show_the_amount_with_exactly_the_currency_s_decimals() {
    assert_eq!(Money::parse("12.5", "EUR").unwrap().amount(), "12.50");
    assert_eq!(Money::parse("1250", "JPY").unwrap().amount(), "1250");
    assert_eq!(Money::parse("1.25", "KWD").unwrap().amount(), "1.250");
}

#[test]
fn amounts_a_person_did_not_mean_are_refused_with_the_reason() {
    let table = [
        (
            "12.505",
            "EUR",
            MoneyError::TooPrecise {
                currency: "EUR",
                exponent: 2,
            },
        ),
        (
            "12.500",
            "EUR",
            MoneyError::TooPrecise {
                currency: "EUR",
                exponent: 2,
            },
        ),
        (
            "12.5",
            "JPY",
            MoneyError::TooPrecise {
                currency: "JPY",
                exponent: 0,
            },
        ),
        (
            "1.2345",
            "KWD",
            MoneyError::TooPrecise {
                currency: "KWD",
                exponent: 3,
            },
        ),
        ("0", "EUR", MoneyError::Zero),
        ("0.00", "EUR", MoneyError::Zero),
        ("-5.00", "EUR", MoneyError::Negative),
        ("1e3", "EUR", MoneyError::NotDecimal),
        ("+5", "EUR", MoneyError::NotDecimal),
        (" 5", "EUR", MoneyError::NotDecimal),
        ("5.", "EUR", MoneyError::NotDecimal),
        (".5", "EUR", MoneyError::NotDecimal),
        ("1,50", "EUR", MoneyError::NotDecimal),
        ("", "EUR", MoneyError::NotDecimal),
        ("NaN", "EUR", MoneyError::NotDecimal),
        ("10000000000000.01", "EUR", MoneyError::TooLarge),
        ("1000000000000001", "JPY", MoneyError::TooLarge),
        ("92233720368547758.07", "EUR", MoneyError::TooLarge),
        ("92233720368547758.08", "EUR", MoneyError::TooLarge),
        ("99999999999999999999999999999999", "JPY", MoneyError::TooLarge),
        ("10", "eur", MoneyError::UnknownCurrency),
        ("10", "EURO", MoneyError::UnknownCurrency),
        ("10", "ABC", MoneyError::UnknownCurrency),
        ("10", "XAU", MoneyError::NotACurrency),
    ];
    for (amount, currency, refused) in table {
        assert_eq!(
            Money::parse(amount, currency),
            Err(refused.clone()),
            "{amount:?} {currency}"
        );
        assert!(!refused.to_string().is_empty());
    }
    assert_eq!(MoneyError::UnknownCurrency.field(), "currency");
    assert_eq!(MoneyError::Zero.field(), "amount");
}

#[test]
fn a_json_number_is_refused_as_an_amount_and_a_string_is_taken() {
    let number = serde_json::from_str::<AmountText>("12.5").unwrap_err().to_string();
    let integer = serde_json::from_str::<AmountText>("12").unwrap_err().to_string();
    let text: AmountText = serde_json::from_str("\"12.50\"").unwrap();

    assert!(number.contains("not a JSON number"), "{number}");
    assert!(integer.contains("not a JSON number"), "{integer}");
    assert_eq!(text, AmountText("12.50".into()));
}

#[test]
fn twelve_point_five_and_twelve_point_fifty_euros_are_one_command_with_one_fingerprint() {
    #[derive(serde::Serialize)]
    struct Capture {
        amount: Money,
    }
    let fingerprint = |amount: &str, currency: &str| {
        let command = Capture {
            amount: Money::parse(amount, currency).unwrap(),
        };
        Fingerprint::of("POST", "/v1/payment_intents/{id}/capture", "acme", &command).unwrap()
    };

    assert_eq!(fingerprint("12.5", "EUR"), fingerprint("12.50", "EUR"));
    assert_ne!(fingerprint("12.5", "EUR"), fingerprint("12.51", "EUR"));
    assert_ne!(
        fingerprint("1250", "JPY"),
        fingerprint("12.50", "EUR"),
        "the same minor units in another currency are another command"
    );
}

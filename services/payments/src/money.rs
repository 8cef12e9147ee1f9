//! Money as the payments API takes it and as it is stored: a decimal
//! **string** (`"12.50"`) with an ISO 4217 currency on the way in, integer
//! minor units (`1250`) from then on (docs/contract.md §7 Payments).
//!
//! The conversion happens before the fingerprint, so `"12.5"` and `"12.50"`
//! EUR are one command, and a float never touches an amount. The exponent of
//! each currency comes from the ISO 4217 table (`iso_currency`): JPY and KRW
//! have none, EUR and USD two, BHD, JOD, KWD, OMR and TND three.

use std::{fmt, str::FromStr};

use iso_currency::Currency;
use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, Serialize, de};

/// An amount as sent: a JSON string of decimal digits. A JSON number is
/// refused while the body is read, with a message that says why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(value_type = String, example = "12.50", pattern = r"^[0-9]+(\.[0-9]+)?$")]
pub struct AmountText(pub String);

impl<'de> Deserialize<'de> for AmountText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl de::Visitor<'_> for Text {
            type Value = AmountText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a decimal string such as \"12.50\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<AmountText, E> {
                Ok(AmountText(v.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<AmountText, E> {
                Err(E::custom(NUMBER_REFUSED))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<AmountText, E> {
                Err(E::custom(NUMBER_REFUSED))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<AmountText, E> {
                Err(E::custom(NUMBER_REFUSED))
            }
        }
        deserializer.deserialize_any(Text)
    }
}

const NUMBER_REFUSED: &str = "must be a decimal string such as \"12.50\", not a JSON number: numbers lose cents";

/// The largest amount taken, in minor units of any currency: 10^15
/// (EUR 10,000,000,000,000.00). Far below 2^53, so every amount stays exact
/// through canonical JSON, which writes numbers as doubles.
pub const MAX_AMOUNT_MINOR: i64 = 1_000_000_000_000_000;

/// A positive amount of one currency, in its minor units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Money {
    pub amount_minor: i64,
    #[serde(serialize_with = "currency_code")]
    pub currency: Currency,
}

fn currency_code<S: serde::Serializer>(currency: &Currency, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(currency.code())
}

/// Why an amount or a currency was refused; each names what to send instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoneyError {
    /// Not decimal digits with at most one point (signs, exponents, spaces, commas).
    NotDecimal,
    Negative,
    Zero,
    /// More decimals than the currency has.
    TooPrecise {
        currency: &'static str,
        exponent: u16,
    },
    /// More than [`MAX_AMOUNT_MINOR`].
    TooLarge,
    UnknownCurrency,
    /// A code without minor units (gold, special drawing rights…).
    NotACurrency,
}

impl MoneyError {
    /// Which field of the request is wrong.
    pub fn field(&self) -> &'static str {
        match self {
            MoneyError::UnknownCurrency | MoneyError::NotACurrency => "currency",
            _ => "amount",
        }
    }
}

impl fmt::Display for MoneyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MoneyError::NotDecimal => f.write_str("must be decimal digits with at most one point, such as \"12.50\""),
            MoneyError::Negative => f.write_str("must be positive"),
            MoneyError::Zero => f.write_str("must be more than zero"),
            MoneyError::TooPrecise { currency, exponent: 0 } => {
                write!(f, "{currency} has no minor unit: send whole units, such as \"1250\"")
            }
            MoneyError::TooPrecise { currency, exponent } => {
                write!(
                    f,
                    "{currency} has {exponent} decimals: send at most {exponent} digits after the point"
                )
            }
            MoneyError::TooLarge => write!(f, "must be at most {MAX_AMOUNT_MINOR} minor units (10^15)"),
            MoneyError::UnknownCurrency => f.write_str("must be an ISO 4217 code in capitals, such as \"EUR\""),
            MoneyError::NotACurrency => f.write_str("is not a currency with minor units"),
        }
    }
}

impl Money {
    /// Parses an amount string in `currency` into minor units.
    pub fn parse(amount: &str, currency: &str) -> Result<Money, MoneyError> {
        let currency = parse_currency(currency)?;
        let minor = parse_minor(amount, currency)?;
        Ok(Money {
            amount_minor: minor,
            currency,
        })
    }

    /// An amount already in minor units (read back from the database).
    pub fn from_minor(amount_minor: i64, currency: &str) -> Result<Money, MoneyError> {
        Ok(Money {
            amount_minor,
            currency: parse_currency(currency)?,
        })
    }

    pub fn exponent(&self) -> u16 {
        self.currency.exponent().unwrap_or(0)
    }

    /// The amount as a decimal string with exactly the currency's decimals: `"12.50"`, `"1250"`, `"1.250"`.
    pub fn amount(&self) -> String {
        Decimal::new(self.amount_minor, u32::from(self.exponent())).to_string()
    }

    pub fn currency_code(&self) -> &'static str {
        self.currency.code()
    }
}

/// An ISO 4217 code in capitals, of a currency with minor units.
pub fn parse_currency(code: &str) -> Result<Currency, MoneyError> {
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(MoneyError::UnknownCurrency);
    }
    let currency = Currency::from_code(code).ok_or(MoneyError::UnknownCurrency)?;
    currency.exponent().ok_or(MoneyError::NotACurrency)?;
    Ok(currency)
}

fn parse_minor(amount: &str, currency: Currency) -> Result<i64, MoneyError> {
    if let Some(rest) = amount.strip_prefix('-') {
        return Err(if decimal_digits(rest) {
            MoneyError::Negative
        } else {
            MoneyError::NotDecimal
        });
    }
    if !decimal_digits(amount) {
        return Err(MoneyError::NotDecimal);
    }
    let exponent = currency.exponent().unwrap_or(0);
    let decimals = amount.split_once('.').map_or(0, |(_, fraction)| fraction.len());
    if decimals > usize::from(exponent) {
        return Err(MoneyError::TooPrecise {
            currency: currency.code(),
            exponent,
        });
    }
    let value = Decimal::from_str(amount).map_err(|_| MoneyError::TooLarge)?;
    let minor = value
        .checked_mul(Decimal::from(10_i64.pow(u32::from(exponent))))
        .ok_or(MoneyError::TooLarge)?;
    let minor = i64::try_from(minor).map_err(|_| MoneyError::TooLarge)?;
    if minor == 0 {
        return Err(MoneyError::Zero);
    }
    if minor > MAX_AMOUNT_MINOR {
        return Err(MoneyError::TooLarge);
    }
    Ok(minor)
}

/// `123` or `123.45`: digits, at most one point, a digit on each side of it.
fn decimal_digits(text: &str) -> bool {
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(whole) && fraction.is_none_or(digits)
}

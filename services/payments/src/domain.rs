//! Payments in the domain's own words: the bodies as sent, the validated
//! commands they become (what the fingerprint hashes — amounts already in
//! minor units), and the resources the API answers with.

use std::collections::BTreeMap;

use approvals::ApprovalSummary;
use platform::{ApiError, Timestamp};
use serde::{Deserialize, Serialize};
use validator::Validate;

use crate::money::{AmountText, Money};

/// `POST /v1/payment_intents`, as sent.
#[derive(Debug, Deserialize, Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateIntentBody {
    /// The merchant's order: at most one live intent per order.
    #[validate(length(min = 1, max = 255, message = "must be 1 to 255 characters"))]
    #[schema(example = "order-1042", min_length = 1, max_length = 255)]
    pub order_id: String,
    /// A decimal string, never a JSON number.
    pub amount: AmountText,
    /// An ISO 4217 code in capitals, of a currency with minor units.
    #[schema(example = "EUR", pattern = "^[A-Z]{3}$")]
    pub currency: String,
    #[validate(nested)]
    pub payee: PayeeBody,
    #[validate(length(max = 1000, message = "must be at most 1000 characters"))]
    #[schema(max_length = 1000)]
    pub description: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PayeeBody {
    #[validate(length(min = 1, max = 255, message = "must be 1 to 255 characters"))]
    #[schema(example = "Acme Supplies GmbH", min_length = 1, max_length = 255)]
    pub name: String,
    /// The payee's account at the provider (an IBAN, say).
    #[validate(length(min = 1, max = 64, message = "must be 1 to 64 characters"))]
    #[schema(example = "DE89370400440532013000", min_length = 1, max_length = 64)]
    pub account: String,
}

/// The validated create: the amount in minor units, so `"12.5"` and
/// `"12.50"` EUR are one command with one fingerprint.
#[derive(Debug, Clone, Serialize)]
pub struct CreateIntent {
    pub order_id: String,
    pub amount: Money,
    pub payee: PayeeBody,
    pub description: Option<String>,
}

impl TryFrom<CreateIntentBody> for CreateIntent {
    type Error = ApiError;

    /// Money is checked here, before anything is claimed: a 400 names the field.
    fn try_from(body: CreateIntentBody) -> Result<Self, ApiError> {
        let amount = Money::parse(&body.amount.0, &body.currency)
            .map_err(|e| ApiError::invalid_field(e.field(), e.to_string()))?;
        Ok(CreateIntent {
            order_id: body.order_id,
            amount,
            payee: body.payee,
            description: body.description,
        })
    }
}

/// `POST /v1/payment_intents/{id}/cancel`: the intent is named by the path.
#[derive(Debug, Clone, Serialize)]
pub struct CancelIntent {
    pub intent_id: String,
}

/// An intent's lifecycle (docs/contract.md §7): `requires_capture → processing
/// → succeeded | failed | unknown`, or `cancelled` before any capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IntentState {
    RequiresCapture,
    Processing,
    Succeeded,
    Failed,
    Unknown,
    Cancelled,
}

impl IntentState {
    pub fn as_str(self) -> &'static str {
        match self {
            IntentState::RequiresCapture => "requires_capture",
            IntentState::Processing => "processing",
            IntentState::Succeeded => "succeeded",
            IntentState::Failed => "failed",
            IntentState::Unknown => "unknown",
            IntentState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }
}

/// A payment intent as the API shows it: the amount both as a decimal
/// string and in minor units.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PaymentIntent {
    #[schema(example = "pi_0193a1b2c3d4e5f60718293a4b5c6d7e")]
    pub id: String,
    pub order_id: String,
    #[schema(example = "12.50")]
    pub amount: String,
    #[schema(example = 1250)]
    pub amount_minor: i64,
    #[schema(example = "EUR")]
    pub currency: String,
    pub payee: PayeeBody,
    pub description: Option<String>,
    pub state: IntentState,
    /// Its capture, once one is made.
    pub capture_id: Option<String>,
    /// The provider's id for the capture's charge, once the provider answered.
    pub provider_charge_id: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl PaymentIntent {
    pub fn url(&self) -> String {
        format!("/v1/payment_intents/{}", self.id)
    }
}

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// `POST /v1/payment_intents/{id}/capture`, as sent (`{}` captures it all).
#[derive(Debug, Default, Deserialize, Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CaptureBody {
    /// At most the intent's amount, in its currency; omitted, the whole
    /// amount. A partial capture releases the rest.
    #[schema(value_type = Option<AmountText>)]
    pub amount: Option<AmountText>,
}

/// The validated capture: which intent, and how much in minor units. An
/// omitted amount is the intent's whole amount — a default applied before the
/// fingerprint, so `{}` and the full amount sent explicitly are one request.
#[derive(Debug, Clone, Serialize)]
pub struct CaptureIntent {
    pub intent_id: String,
    pub amount: Money,
}

impl CaptureIntent {
    /// Checks the body against the intent it captures: the amount is read in
    /// the intent's currency and may not exceed the intent's amount. Nothing is
    /// claimed when it fails.
    pub fn parse(intent: &PaymentIntent, body: CaptureBody) -> Result<Self, ApiError> {
        let whole = Money::from_minor(intent.amount_minor, &intent.currency).map_err(ApiError::internal)?;
        let amount = match body.amount {
            None => whole,
            Some(text) => {
                Money::parse(&text.0, &intent.currency).map_err(|e| ApiError::invalid_field("amount", e.to_string()))?
            }
        };
        if amount.amount_minor > whole.amount_minor {
            return Err(ApiError::invalid_field(
                "amount",
                format!(
                    "must be at most the intent's amount, {} {}",
                    whole.amount(),
                    whole.currency_code()
                ),
            ));
        }
        Ok(CaptureIntent {
            intent_id: intent.id.clone(),
            amount,
        })
    }
}

/// `POST /v1/payment_intents/{id}/refunds`, as sent.
#[derive(Debug, Deserialize, Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RefundBody {
    /// A decimal string in the intent's currency.
    pub amount: AmountText,
    #[validate(length(max = 1000, message = "must be at most 1000 characters"))]
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
}

/// The validated refund instruction: which intent, how much in minor units, why.
#[derive(Debug, Clone, Serialize)]
pub struct RefundPayment {
    pub intent_id: String,
    pub amount: Money,
    pub reason: Option<String>,
}

impl RefundPayment {
    /// The amount is read in the intent's currency. Whether the capture has
    /// that much left to refund is decided by the database, not here.
    pub fn parse(intent: &PaymentIntent, body: RefundBody) -> Result<Self, ApiError> {
        let amount = Money::parse(&body.amount.0, &intent.currency)
            .map_err(|e| ApiError::invalid_field("amount", e.to_string()))?;
        Ok(RefundPayment {
            intent_id: intent.id.clone(),
            amount,
            reason: body.reason,
        })
    }
}

/// A capture's or a refund's state: `processing` until the provider's answer
/// is known; `unknown` while nobody knows it (the reconciler asks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransferState {
    Processing,
    Succeeded,
    Failed,
    Unknown,
}

impl TransferState {
    pub fn as_str(self) -> &'static str {
        match self {
            TransferState::Processing => "processing",
            TransferState::Succeeded => "succeeded",
            TransferState::Failed => "failed",
            TransferState::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }
}

/// A capture: money taken from the customer by the provider.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Capture {
    #[schema(example = "cap_0193a1b2c3d4e5f60718293a4b5c6d7e")]
    pub id: String,
    pub payment_intent_id: String,
    #[schema(example = "12.50")]
    pub amount: String,
    #[schema(example = 1250)]
    pub amount_minor: i64,
    pub currency: String,
    /// Taken by refunds, or held by refunds whose outcome is not known yet.
    pub amount_refunded: String,
    pub amount_refunded_minor: i64,
    pub state: TransferState,
    /// The key the charge is sent to the provider with, on every delivery:
    /// derived from the capture's request (its account, route, key and fingerprint),
    /// and the charge's merchant reference: either finds it at the provider.
    #[schema(example = "retrysafe-4f0c1e9a7b2d8c3e5a6f1b0d9e8c7a2b")]
    pub provider_idempotency_key: String,
    /// The provider's id for the charge, once the provider answered.
    pub provider_charge_id: Option<String>,
    /// Where to see how it ends.
    pub status_url: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Capture {
    pub fn url(&self) -> String {
        capture_url(&self.id)
    }
}

pub fn capture_url(id: &str) -> String {
    format!("/v1/captures/{id}")
}

/// A refund: money given back from a capture.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Refund {
    #[schema(example = "rf_0193a1b2c3d4e5f60718293a4b5c6d7e")]
    pub id: String,
    pub payment_intent_id: String,
    pub capture_id: String,
    #[schema(example = "2.50")]
    pub amount: String,
    #[schema(example = 250)]
    pub amount_minor: i64,
    pub currency: String,
    pub reason: Option<String>,
    pub state: TransferState,
    /// The key the refund is sent to the provider with: derived from the
    /// refund's request (its account, route, key and fingerprint), and the
    /// refund's merchant reference: either finds it at the provider.
    pub provider_idempotency_key: String,
    /// The provider's id for the refund, once the provider answered.
    pub provider_refund_id: Option<String>,
    pub status_url: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Refund {
    pub fn url(&self) -> String {
        refund_url(&self.id)
    }
}

pub fn refund_url(id: &str) -> String {
    format!("/v1/refunds/{id}")
}

/// Which payments wait for a human (docs/contract.md §6): a capture at or above
/// its currency's threshold, in that currency's major units. A currency with no
/// threshold of its own waits for every capture: one number for all would let
/// 999.999 KWD (some 3,000 EUR) through where 1,000 EUR waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentsPolicy {
    /// Currency code → the major units from which a capture waits.
    pub capture_thresholds: BTreeMap<&'static str, u64>,
}

/// The sandbox's thresholds, in major units.
const SANDBOX_THRESHOLDS: &str = "EUR=1000,USD=1000,GBP=1000,CHF=1000,JPY=150000,KWD=300";

impl Default for PaymentsPolicy {
    fn default() -> Self {
        PaymentsPolicy::parse(SANDBOX_THRESHOLDS).expect("the sandbox thresholds parse")
    }
}

impl PaymentsPolicy {
    /// `PAYMENTS_CAPTURE_THRESHOLDS`, such as `EUR=1000,JPY=150000`; unset,
    /// the sandbox's.
    pub fn from_env() -> Result<Self, String> {
        // a setting that no longer means anything must not be ignored in silence
        if std::env::var_os("PAYMENTS_CAPTURE_APPROVAL_FROM").is_some() {
            return Err(
                "PAYMENTS_CAPTURE_APPROVAL_FROM is gone: set PAYMENTS_CAPTURE_THRESHOLDS, \
                a threshold per currency (EUR=1000,JPY=150000)"
                    .into(),
            );
        }
        match std::env::var("PAYMENTS_CAPTURE_THRESHOLDS") {
            Ok(v) if !v.trim().is_empty() => {
                PaymentsPolicy::parse(&v).map_err(|e| format!("PAYMENTS_CAPTURE_THRESHOLDS `{v}`: {e}"))
            }
            _ => Ok(PaymentsPolicy::default()),
        }
    }

    /// `CODE=major units` pairs separated by commas.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut capture_thresholds = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (code, major) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not CODE=major units"))?;
            let currency = crate::money::parse_currency(code.trim()).map_err(|e| format!("`{code}` {e}"))?;
            let major = major
                .trim()
                .parse()
                .map_err(|_| format!("`{major}` for {code} is not a whole number of major units"))?;
            if capture_thresholds.insert(currency.code(), major).is_some() {
                return Err(format!("{code} is given a threshold twice"));
            }
        }
        Ok(PaymentsPolicy { capture_thresholds })
    }

    /// Whether a capture of `amount` waits for a human: at or above its
    /// currency's threshold, or always when its currency has none.
    pub fn capture_needs_approval(&self, amount: &Money) -> bool {
        let Some(&major) = self.capture_thresholds.get(amount.currency_code()) else {
            return true;
        };
        let from_minor = i64::try_from(major)
            .ok()
            .and_then(|major| major.checked_mul(10_i64.pow(u32::from(amount.exponent()))));
        // a threshold too large for any amount is never reached
        from_minor.is_some_and(|from| amount.amount_minor >= from)
    }

    /// `Some(what the approver judges)` when this capture needs a human:
    /// the payee, the amount with its currency, and the account. None of it
    /// can change before the approved run (docs/contract.md §6): the amount
    /// and the intent are the command's and the account is the fingerprint's,
    /// and an intent's order, currency and payee are written once, when it is
    /// made, and never updated.
    pub fn approval_for(
        &self,
        account_id: &str,
        intent: &PaymentIntent,
        command: &CaptureIntent,
    ) -> Option<ApprovalSummary> {
        if !self.capture_needs_approval(&command.amount) {
            return None;
        }
        let amount = format!("{} {}", command.amount.amount(), command.amount.currency_code());
        Some(ApprovalSummary {
            action: format!("capture {amount}"),
            target: format!("payee {} ({})", intent.payee.name, intent.payee.account),
            consequences: format!(
                "the payment provider charges {amount} for order {} and pays it to the payee; \
                 only a refund gives it back",
                intent.order_id
            ),
            identifiers: [
                ("account", account_id.to_owned()),
                ("payment_intent_id", intent.id.clone()),
                ("order_id", intent.order_id.clone()),
                ("amount", command.amount.amount()),
                ("currency", command.amount.currency_code().to_owned()),
                ("payee_name", intent.payee.name.clone()),
                ("payee_account", intent.payee.account.clone()),
            ]
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
        })
    }
}

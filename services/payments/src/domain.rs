//! Payments in the domain's own words: the bodies as sent, the validated
//! commands they become (what the fingerprint hashes — amounts already in
//! minor units), and the resources the API answers with.

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
    #[schema(example = "order-1042")]
    pub order_id: String,
    /// A decimal string, never a JSON number.
    pub amount: AmountText,
    #[schema(example = "EUR")]
    pub currency: String,
    #[validate(nested)]
    pub payee: PayeeBody,
    #[validate(length(max = 1000, message = "must be at most 1000 characters"))]
    pub description: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PayeeBody {
    #[validate(length(min = 1, max = 255, message = "must be 1 to 255 characters"))]
    #[schema(example = "Acme Supplies GmbH")]
    pub name: String,
    /// The payee's account at the provider (an IBAN, say).
    #[validate(length(min = 1, max = 64, message = "must be 1 to 64 characters"))]
    #[schema(example = "DE89370400440532013000")]
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

/// An intent's lifecycle (CONTRACT §7): `requires_capture → processing →
/// succeeded | failed | unknown`, or `cancelled` before any capture.
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

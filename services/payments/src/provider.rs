//! The payment provider, as the outbox sees it: where capture and refund
//! events go ([`Destination`]), how their answers are read, and how a lost
//! answer is looked up. The provider is a separate HTTP service (the simulated
//! one in `services/payment-provider` in the sandbox) with idempotency keys of
//! its own; every request carries the event's key, derived from the request
//! the client sent, so sending it again is the same request.

use std::time::Duration;

use outbox::{Delivery, Destination, Ledger, Lookup, OutboxEvent, Settlement};
use platform::Tx;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};

use crate::store;

/// The event kind of a capture: one charge at the provider.
pub const CAPTURE: &str = "capture";
/// The event kind of a refund instruction: one refund at the provider.
pub const REFUND: &str = "refund";

/// What a capture's event carries: the charge to ask for. Its merchant
/// reference is the event's, not the capture's id ([`reference`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChargeOrder {
    pub capture_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub payee_account: String,
}

/// What a refund's event carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RefundOrder {
    pub refund_id: String,
    pub charge_id: String,
    pub amount_minor: i64,
}

/// Where the provider is and the merchant key to use.
#[derive(Clone)]
pub struct ProviderConfig {
    /// `PAYMENTS_PROVIDER_URL`, default the sandbox's simulated provider.
    pub url: String,
    /// `PAYMENTS_PROVIDER_KEY`: a secret, never printed.
    pub merchant_key: String,
}

impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("url", &self.url)
            .field("merchant_key", &"[redacted]")
            .finish()
    }
}

/// The sandbox's merchant key at the simulated provider.
pub const SANDBOX_MERCHANT_KEY: &str = "sk_sandbox_retrysafe";

impl Default for ProviderConfig {
    /// The sandbox's simulated provider, with the sandbox's merchant key.
    fn default() -> Self {
        ProviderConfig {
            url: format!("http://127.0.0.1:{}", crate::PROVIDER_DEFAULT_PORT),
            merchant_key: SANDBOX_MERCHANT_KEY.to_owned(),
        }
    }
}

impl ProviderConfig {
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let sandbox = ProviderConfig::default();
        ProviderConfig {
            // an invalid RETRYSAFE_BASE_PORT has stopped the service already, at its own address
            url: var("PAYMENTS_PROVIDER_URL").unwrap_or_else(|| {
                match platform::config::sandbox_port(crate::PROVIDER_DEFAULT_PORT) {
                    Ok(port) => format!("http://127.0.0.1:{port}"),
                    Err(_) => sandbox.url,
                }
            }),
            merchant_key: var("PAYMENTS_PROVIDER_KEY").unwrap_or(sandbox.merchant_key),
        }
    }
}

/// The provider over HTTP.
#[derive(Debug, Clone)]
pub struct Provider {
    config: ProviderConfig,
    http: reqwest::Client,
}

/// What the provider answers for a charge or a refund: its id.
#[derive(Debug, Deserialize)]
struct Made {
    id: String,
}

/// A charge or refund as a lookup shows it: enough to tell whether it is the
/// one the event asked for.
#[derive(Debug, Deserialize)]
struct Listed {
    id: String,
    status: String,
    amount_minor: i64,
    /// A charge's; a refund is in its charge's currency.
    #[serde(default)]
    currency: Option<String>,
    merchant_reference: String,
}

/// What an event asked the provider for, as a lookup must find it.
struct Asked<'a> {
    /// The event's [`reference`], sent as the merchant reference.
    reference: &'a str,
    amount_minor: i64,
    /// A charge's currency; a refund names none.
    currency: Option<&'a str>,
}

#[derive(Debug, Deserialize)]
struct Found {
    data: Vec<Listed>,
}

/// The provider's 409s that refuse for good: a refund past what is left of
/// its charge. Any other 409 may mean the request is still being processed.
const FINAL_CONFLICTS: &[&str] = &["refund_exceeds_charge"];

impl Provider {
    pub fn new(config: ProviderConfig) -> Self {
        let http = reqwest::Client::builder()
            // a connection that cannot open was never sent; the outbox bounds the whole request
            .connect_timeout(Duration::from_secs(2))
            .build()
            .unwrap_or_default();
        Provider { config, http }
    }

    async fn post(&self, path: &str, key: &str, body: &impl Serialize) -> Delivery {
        let sent = self
            .http
            .post(format!("{}{path}", self.config.url))
            .bearer_auth(&self.config.merchant_key)
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            // the connection never opened: nothing reached the provider
            Err(e) if e.is_connect() => {
                return Delivery::NotAccepted {
                    reason: e.without_url().to_string(),
                };
            }
            // it may have been sent: only the provider knows now
            Err(e) => {
                return Delivery::AnswerLost {
                    reason: e.without_url().to_string(),
                };
            }
        };
        let status = response.status();
        if status.is_success() {
            return match response.json::<Made>().await {
                Ok(made) => Delivery::Accepted { external_ref: made.id },
                Err(e) => Delivery::AnswerLost {
                    reason: format!("accepted, and the answer could not be read: {}", e.without_url()),
                },
            };
        }
        let problem = response.text().await.unwrap_or_default();
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            tracing::error!(%status, "the provider does not accept the merchant key: check PAYMENTS_PROVIDER_KEY");
        }
        Delivery::from_refusal(status.as_u16(), &problem, FINAL_CONFLICTS)
    }

    /// The first charge or refund the provider has under `query`.
    async fn find(&self, path: &str, query: &[(&str, &str)]) -> Result<Option<Listed>, String> {
        let response = self
            .http
            .get(format!("{}{path}", self.config.url))
            .bearer_auth(&self.config.merchant_key)
            .query(query)
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        if !response.status().is_success() {
            return Err(format!("lookup answered {}", response.status()));
        }
        let found: Found = response.json().await.map_err(|e| e.without_url().to_string())?;
        Ok(found.data.into_iter().next())
    }

    /// By the idempotency key first, then by the merchant reference. What is
    /// found must be what was asked for — a succeeded charge or refund of
    /// this amount (and currency) with this reference: anything else under the
    /// key is a collision a person must look at, never taken for our money.
    /// Several merchants' accounts may share one merchant key, so a charge
    /// that merely exists proves nothing. Why two identities: docs/design.md §6.
    async fn look_up_at(&self, path: &str, key: &str, asked: Asked<'_>) -> Result<Lookup, String> {
        let found = match self.find(path, &[("idempotency_key", key)]).await? {
            Some(listed) => Some(listed),
            None => self.find(path, &[("merchant_reference", asked.reference)]).await?,
        };
        let Some(listed) = found else {
            return Ok(Lookup::Absent);
        };
        let currency_matches = asked.currency.is_none_or(|currency| {
            listed
                .currency
                .as_deref()
                .is_some_and(|c| c.eq_ignore_ascii_case(currency))
        });
        if listed.status == "succeeded"
            && listed.amount_minor == asked.amount_minor
            && currency_matches
            && listed.merchant_reference == asked.reference
        {
            return Ok(Lookup::Found {
                external_ref: listed.id,
            });
        }
        // what it is goes to the log only: it may be another account's, and
        // the reason is shown on this operation to everyone who reads it
        tracing::warn!(external_key = %key, held = %listed.id, status = %listed.status,
            amount_minor = listed.amount_minor, currency = listed.currency.as_deref().unwrap_or("-"),
            reference = %listed.merchant_reference, "the provider holds, under the key or the reference, something \
            that is not what was asked for");
        Ok(Lookup::Mismatch {
            reason: "the provider holds something under this operation's key or reference that is not its work: \
                     a person must look (the service's log names it)"
                .to_owned(),
            external_ref: listed.id,
        })
    }
}

/// The merchant reference an event's charge or refund carries, and what a
/// lookup and a person's resolution check a found one against: the event's
/// derived key, sent in the body as well as the header. Derived from the
/// request, not the capture's or the refund's id, so that a retry run again
/// after a failover lost its claim sends the same body under the same key and
/// the provider answers with the first charge (docs/design.md §6, §12).
fn reference(event: &OutboxEvent) -> &str {
    &event.external_key
}

/// An event's payload, read back as what its kind carries.
enum Order {
    Charge(ChargeOrder),
    Refund(RefundOrder),
}

impl Order {
    fn of(event: &OutboxEvent) -> Result<Order, String> {
        let payload = event.payload.clone();
        match event.kind.as_str() {
            CAPTURE => serde_json::from_value(payload).map(Order::Charge),
            REFUND => serde_json::from_value(payload).map(Order::Refund),
            other => return Err(format!("no such payments event kind `{other}`")),
        }
        .map_err(|e| format!("event {}: {e}", event.event_id))
    }
}

#[derive(Serialize)]
struct ChargeRequest<'a> {
    amount_minor: i64,
    currency: &'a str,
    merchant_reference: &'a str,
    payee_account: &'a str,
}

#[derive(Serialize)]
struct RefundRequest<'a> {
    charge_id: &'a str,
    amount_minor: i64,
    merchant_reference: &'a str,
}

impl Destination for Provider {
    async fn deliver(&self, event: &OutboxEvent) -> Delivery {
        match Order::of(event) {
            Ok(Order::Charge(charge)) => {
                let request = ChargeRequest {
                    amount_minor: charge.amount_minor,
                    currency: &charge.currency,
                    merchant_reference: reference(event),
                    payee_account: &charge.payee_account,
                };
                self.post("/v1/charges", &event.external_key, &request).await
            }
            Ok(Order::Refund(refund)) => {
                let request = RefundRequest {
                    charge_id: &refund.charge_id,
                    amount_minor: refund.amount_minor,
                    merchant_reference: reference(event),
                };
                self.post("/v1/refunds", &event.external_key, &request).await
            }
            Err(reason) => Delivery::Refused { reason },
        }
    }

    async fn look_up(&self, event: &OutboxEvent) -> Result<Lookup, String> {
        match Order::of(event)? {
            Order::Charge(charge) => {
                let asked = Asked {
                    reference: reference(event),
                    amount_minor: charge.amount_minor,
                    currency: Some(&charge.currency),
                };
                self.look_up_at("/v1/charges", &event.external_key, asked).await
            }
            Order::Refund(refund) => {
                let asked = Asked {
                    reference: reference(event),
                    amount_minor: refund.amount_minor,
                    currency: None,
                };
                self.look_up_at("/v1/refunds", &event.external_key, asked).await
            }
        }
    }
}

/// The payments' rows for their captures and refunds: how an event's ending
/// is written in them, by the reconciler or by a person settling it by hand.
#[derive(Debug, Clone, Copy)]
pub struct Transfers;

impl Ledger for Transfers {
    fn settle<'a>(
        &'a self,
        tx: &'a mut Tx,
        event: &'a OutboxEvent,
        settlement: Settlement<'a>,
    ) -> idempotency::BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            match Order::of(event).map_err(sqlx::Error::Protocol)? {
                Order::Charge(charge) => {
                    store::settle_capture(tx, &event.account_id, &charge.capture_id, settlement).await
                }
                Order::Refund(refund) => {
                    store::settle_refund(tx, &event.account_id, &refund.refund_id, settlement).await
                }
            }
        })
    }
}

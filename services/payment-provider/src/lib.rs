//! A simulated payment provider (docs/contract.md §7 Payments): the external
//! system the payments service charges through. It is a real HTTP server with
//! real state, so the failures the payments service must survive are real too:
//!
//! - **its own idempotency keys**: a charge or refund sent again with the same
//!   `Idempotency-Key` and the same body is the same charge (answered again,
//!   `Idempotent-Replayed: true`); the same key with another body is refused
//!   with 422 and charges nothing;
//! - **lookups** by idempotency key and by merchant reference, which is how a
//!   reconciler learns what happened to a request whose answer was lost;
//! - **faults switchable at run time** (`PUT /admin/faults`): latency before
//!   every charge or refund, 5xx before accepting (nothing is charged), accept and then
//!   never answer (charged; the caller times out), accept and then answer as
//!   if still processing (409, 425, 429, 5xx), and slow acceptance;
//! - **a count of the charges it really made** (`GET /admin/stats`), so a
//!   test or a scenario can assert "charged exactly once".
//!
//! Merchants are told apart by their bearer key; each has its own key space.
//! It stands in for a system that never forgets: with a state file (the
//! sandbox keeps one under its data directory) its charges, refunds, keys and
//! counts survive a restart, written before it answers the request that made
//! them. Without one, it forgets everything when it stops. Faults are
//! configuration, not state: a restarted provider has none.

mod admin;
mod lookup;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Json, Router,
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use platform::{
    ApiError, ApiJson, Timestamp,
    simulated::{
        AnswerFault, EventLog, SimulatedEvent, Tenant, idempotency_key, load_state, request_hash, save_state,
        still_processing,
    },
};
use serde::{Deserialize, Serialize};
use validator::Validate;

/// The sandbox port (docs/contract.md §12).
pub const DEFAULT_PORT: u16 = 7101;

/// How long a request that the `drop_next` fault accepted is held before the
/// server lets it go: far past any caller's timeout.
const DROPPED_ANSWER_HOLD: Duration = Duration::from_secs(60);

/// The faults in force. Counters (`fail_next`, `drop_next`) count down with
/// each charge or refund request they hit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, Validate)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Added before every charge or refund request.
    pub latency_ms: u64,
    /// The next N charge/refund requests answer 503 before accepting: nothing is stored.
    pub fail_next: u32,
    /// The next N charge/refund requests are accepted (stored), and then never answered.
    pub drop_next: u32,
    /// Each charge/refund request waits this long before it is accepted (a lookup meanwhile finds nothing).
    pub accept_delay_ms: u64,
    /// The next N charges are declined (402 `charge_declined`): a final
    /// business refusal, nothing charged.
    pub decline_next: u32,
    /// The next charge/refund requests are accepted (stored), and each
    /// answered with the next of these statuses instead, as a provider busy
    /// with them would: 409 `request_in_progress`, 425, 429 with a body, 500, 503.
    pub answer_after_accepting: Vec<u16>,
}

/// What the provider really did, for "exactly once" assertions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Charges made (a replay of a charge makes none).
    pub charges_made: u64,
    pub refunds_made: u64,
    /// Charge or refund requests received, replays and refusals included.
    pub requests: u64,
}

/// `POST /v1/charges`, as a merchant sends it.
#[derive(Debug, Clone, Deserialize, Serialize, Validate)]
#[serde(deny_unknown_fields)]
pub struct ChargeRequest {
    #[validate(range(min = 1, message = "must be a positive number of minor units"))]
    pub amount_minor: i64,
    #[validate(length(equal = 3, message = "must be an ISO 4217 code"))]
    pub currency: String,
    /// The merchant's own reference (the payments service sends the request's derived key).
    #[validate(length(min = 1, max = 255, message = "must be 1 to 255 characters"))]
    pub merchant_reference: String,
    #[validate(length(max = 255, message = "must be at most 255 characters"))]
    pub payee_account: Option<String>,
}

/// `POST /v1/refunds`.
#[derive(Debug, Clone, Deserialize, Serialize, Validate)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    pub charge_id: String,
    #[validate(range(min = 1, message = "must be a positive number of minor units"))]
    pub amount_minor: i64,
    #[validate(length(min = 1, max = 255, message = "must be 1 to 255 characters"))]
    pub merchant_reference: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    pub id: String,
    pub status: String,
    pub amount_minor: i64,
    pub currency: String,
    pub merchant_reference: String,
    pub payee_account: Option<String>,
    pub idempotency_key: String,
    pub refunded_minor: i64,
    pub created_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    pub id: String,
    pub status: String,
    pub charge_id: String,
    pub amount_minor: i64,
    pub merchant_reference: String,
    pub idempotency_key: String,
    pub created_at: Timestamp,
}

/// One merchant's request under one idempotency key: which request it was
/// (its body's hash) and what it made.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Keyed {
    request_hash: String,
    made: Made,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Made {
    Charge(usize),
    Refund(usize),
}

/// Everything the provider knows, as the state file holds it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Ledger {
    charges: Vec<(String, Charge)>,
    refunds: Vec<(String, Refund)>,
    /// merchant → idempotency key → what that request made.
    keys: HashMap<String, HashMap<String, Keyed>>,
    stats: Stats,
    #[serde(skip)]
    faults: Faults,
}

impl Ledger {
    fn keyed(&self, merchant: &str, key: &str) -> Option<&Keyed> {
        self.keys.get(merchant)?.get(key)
    }
}

/// The provider's state: one ledger behind one lock, so that a key is
/// claimed and its charge made (and written down) in one step.
#[derive(Debug, Clone, Default)]
pub struct Provider {
    ledger: Arc<Mutex<Ledger>>,
    /// Where its state survives restarts; `None`: in memory only.
    state_file: Option<Arc<PathBuf>>,
    events: EventLog,
}

impl Provider {
    /// A provider with what its state file holds (a new file if there is
    /// none yet); `None` keeps everything in memory only.
    pub fn open(state_file: Option<PathBuf>) -> std::io::Result<Provider> {
        let ledger = match &state_file {
            Some(path) => load_state(path)?,
            None => Ledger::default(),
        };
        let provider = Provider {
            ledger: Arc::new(Mutex::new(ledger)),
            state_file: state_file.map(Arc::new),
            events: EventLog::default(),
        };
        provider.save(&provider.lock())?;
        Ok(provider)
    }

    /// Writes the ledger to the state file, if it has one.
    fn save(&self, ledger: &Ledger) -> std::io::Result<()> {
        match &self.state_file {
            Some(path) => save_state(path, ledger),
            None => Ok(()),
        }
    }

    /// Writes down what a request just made, before it is answered. If that
    /// fails the request is taken but not known to be kept: it answers 500,
    /// which tells the caller nothing was decided.
    fn saved(&self, ledger: &Ledger) -> Result<(), ApiError> {
        self.save(ledger).map_err(|e| {
            tracing::error!(error = %e, "could not write the provider's state file");
            still_processing(500)
        })
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats
    }

    /// What it did, in order (`GET /admin/events`).
    pub fn events(&self) -> Vec<SimulatedEvent> {
        self.events.all()
    }

    pub fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub fn router(provider: Provider) -> Router {
    platform::service::finish(routes(provider))
}

fn routes(provider: Provider) -> Router {
    Router::new()
        .route("/v1/charges", post(create_charge).get(lookup::find_charges))
        .route("/v1/charges/{charge_id}", get(lookup::get_charge))
        .route("/v1/refunds", post(create_refund).get(lookup::find_refunds))
        .route("/admin/faults", get(admin::get_faults).put(admin::put_faults))
        .route("/admin/stats", get(admin::get_stats))
        .route("/admin/events", get(admin::get_events))
        .route("/healthz", get(|| async { Json(serde_json::json!({"status": "ok"})) }))
        .with_state(provider)
}

/// Serves the provider, its connections held to `limits`, until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    provider: Provider,
    limits: platform::config::ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing::info!(addr = %listener.local_addr()?, "simulated payment provider listening");
    Ok(platform::serve(listener, router(provider), limits, shutdown).await?)
}

/// What the faults do to a charge or refund request before it is accepted:
/// latency, a failure before accepting, slow acceptance.
async fn before_accepting(provider: &Provider, key: &str) -> Result<(), ApiError> {
    let faults = {
        let mut ledger = provider.lock();
        ledger.stats.requests += 1;
        let faults = ledger.faults.clone();
        if ledger.faults.fail_next > 0 {
            ledger.faults.fail_next -= 1;
        }
        faults
    };
    tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
    if faults.fail_next > 0 {
        provider
            .events
            .record("503 before accepting (fault fail_next): nothing charged", Some(key));
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "provider_unavailable",
            "Provider unavailable",
            "the provider failed before accepting the request; nothing was charged",
        ));
    }
    tokio::time::sleep(Duration::from_millis(faults.accept_delay_ms)).await;
    Ok(())
}

impl Provider {
    /// The `decline_next` fault: this charge is declined, and nothing stored.
    fn decline_if_asked(&self, key: &str) -> Result<(), ApiError> {
        let mut ledger = self.lock();
        if ledger.faults.decline_next == 0 {
            return Ok(());
        }
        ledger.faults.decline_next -= 1;
        self.events
            .record("402 declined (fault decline_next): nothing charged", Some(key));
        Err(ApiError::new(
            StatusCode::PAYMENT_REQUIRED,
            "charge_declined",
            "Charge declined",
            "the payment method was declined; nothing was charged",
        ))
    }
}

impl Ledger {
    /// What happens to the answer of what was just stored: only requests
    /// that store something use a fault up.
    fn answer_fault(&mut self) -> AnswerFault {
        AnswerFault::take(&mut self.faults.drop_next, &mut self.faults.answer_after_accepting)
    }
}

/// The answer, or what a fault makes of it: none at all (the caller waits
/// until it gives up), or a status that may mean "still processing".
async fn answer(provider: &Provider, key: &str, fault: AnswerFault, response: Response) -> Response {
    match fault {
        AnswerFault::None => response,
        AnswerFault::Drop => {
            tracing::warn!("fault: accepted, and the answer is dropped");
            provider
                .events
                .record("the answer is dropped (fault drop_next)", Some(key));
            tokio::time::sleep(DROPPED_ANSWER_HOLD).await;
            response
        }
        AnswerFault::Status(status) => {
            provider.events.record(
                format!("accepted, and answered {status} (fault answer_after_accepting)"),
                Some(key),
            );
            still_processing(status).into_response()
        }
    }
}

fn made(status: StatusCode, replayed: bool, body: &impl Serialize) -> Response {
    let mut response = (status, Json(body)).into_response();
    response.headers_mut().insert(
        "idempotent-replayed",
        HeaderValue::from_static(if replayed { "true" } else { "false" }),
    );
    response
}

fn key_reused() -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
        "Idempotency key reused",
        "this key was used with a different request; nothing was charged",
    )
}

async fn create_charge(
    State(provider): State<Provider>,
    Tenant(merchant): Tenant,
    headers: HeaderMap,
    ApiJson(request): ApiJson<ChargeRequest>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    before_accepting(&provider, &key).await?;
    provider.decline_if_asked(&key)?;
    let (charge, replayed, fault) = provider.charge(merchant, key.clone(), request)?;
    Ok(answer(&provider, &key, fault, made(StatusCode::CREATED, replayed, &charge)).await)
}

async fn create_refund(
    State(provider): State<Provider>,
    Tenant(merchant): Tenant,
    headers: HeaderMap,
    ApiJson(request): ApiJson<RefundRequest>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    before_accepting(&provider, &key).await?;
    let (refund, replayed, fault) = provider.refund(merchant, key.clone(), request)?;
    Ok(answer(&provider, &key, fault, made(StatusCode::CREATED, replayed, &refund)).await)
}

impl Provider {
    /// Makes the charge a merchant's key names, once: the same key and body
    /// again is the same charge (`true`: a replay); another body is refused.
    /// The last: what a fault does to its answer.
    fn charge(
        &self,
        merchant: String,
        key: String,
        mut request: ChargeRequest,
    ) -> Result<(Charge, bool, AnswerFault), ApiError> {
        // "eur" and "EUR" are one request
        request.currency = request.currency.to_ascii_uppercase();
        let hash = request_hash(&request);
        let mut ledger = self.lock();
        if let Some(keyed) = ledger.keyed(&merchant, &key) {
            let answer = match keyed.made {
                Made::Charge(i) if keyed.request_hash == hash => {
                    Ok((ledger.charges[i].1.clone(), true, AnswerFault::None))
                }
                _ => Err(key_reused()),
            };
            self.events.record(
                match &answer {
                    Ok((charge, ..)) => format!("replayed {}: the same key, nothing charged again", charge.id),
                    Err(_) => "422: the key names another request, nothing charged".to_owned(),
                },
                Some(&key),
            );
            return answer;
        }
        let charge = Charge {
            id: format!("ch_{}", uuid::Uuid::now_v7().simple()),
            status: "succeeded".into(),
            amount_minor: request.amount_minor,
            currency: request.currency,
            merchant_reference: request.merchant_reference,
            payee_account: request.payee_account,
            idempotency_key: key.clone(),
            refunded_minor: 0,
            created_at: Timestamp::now(),
        };
        let made = Made::Charge(ledger.charges.len());
        ledger.charges.push((merchant.clone(), charge.clone()));
        ledger.keys.entry(merchant).or_default().insert(
            key,
            Keyed {
                request_hash: hash,
                made,
            },
        );
        ledger.stats.charges_made += 1;
        self.saved(&ledger)?;
        self.events.record(
            format!(
                "charged {} ({} minor units {}, reference {})",
                charge.id, charge.amount_minor, charge.currency, charge.merchant_reference
            ),
            Some(&charge.idempotency_key),
        );
        Ok((charge, false, ledger.answer_fault()))
    }

    /// Makes the refund a merchant's key names, once, never past its charge.
    fn refund(
        &self,
        merchant: String,
        key: String,
        request: RefundRequest,
    ) -> Result<(Refund, bool, AnswerFault), ApiError> {
        let hash = request_hash(&request);
        let mut ledger = self.lock();
        if let Some(keyed) = ledger.keyed(&merchant, &key) {
            return match keyed.made {
                Made::Refund(i) if keyed.request_hash == hash => {
                    Ok((ledger.refunds[i].1.clone(), true, AnswerFault::None))
                }
                _ => Err(key_reused()),
            };
        }
        let charge = ledger
            .charges
            .iter_mut()
            .find(|(m, c)| *m == merchant && c.id == request.charge_id)
            .map(|(_, c)| c)
            .ok_or_else(|| ApiError::not_found(format!("charge `{}`", request.charge_id)))?;
        // compared with what is left, so no amount can overflow the sum
        if request.amount_minor > charge.amount_minor - charge.refunded_minor {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "refund_exceeds_charge",
                "Refund exceeds the charge",
                format!(
                    "{} of {} minor units are refunded already",
                    charge.refunded_minor, charge.amount_minor
                ),
            ));
        }
        charge.refunded_minor += request.amount_minor;
        let refund = Refund {
            id: format!("re_{}", uuid::Uuid::now_v7().simple()),
            status: "succeeded".into(),
            charge_id: request.charge_id,
            amount_minor: request.amount_minor,
            merchant_reference: request.merchant_reference,
            idempotency_key: key.clone(),
            created_at: Timestamp::now(),
        };
        let made = Made::Refund(ledger.refunds.len());
        ledger.refunds.push((merchant.clone(), refund.clone()));
        ledger.keys.entry(merchant).or_default().insert(
            key,
            Keyed {
                request_hash: hash,
                made,
            },
        );
        ledger.stats.refunds_made += 1;
        self.saved(&ledger)?;
        self.events.record(
            format!(
                "refunded {} ({} minor units of {})",
                refund.id, refund.amount_minor, refund.charge_id
            ),
            Some(&refund.idempotency_key),
        );
        Ok((refund, false, ledger.answer_fault()))
    }
}

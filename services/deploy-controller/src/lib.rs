//! A simulated deployment controller (docs/contract.md §7 Deployments): the
//! external system the deployments service hands rollouts to. It is a real HTTP
//! server with real state, so what the deployments service must survive is real
//! too:
//!
//! - **rollouts take time**: `queued → running → succeeded | failed`, one
//!   `step` per phase, and can be cancelled while they have not finished;
//! - **its own idempotency keys**: a rollout requested again with the same
//!   `Idempotency-Key` and body is the same rollout (`Idempotent-Replayed:
//!   true`); another body under that key is 422 and starts nothing;
//! - **status** by its own id, by the caller's key, and by the caller's reference;
//! - **faults switchable at run time** (`PUT /admin/faults`): latency, a 503
//!   before accepting, accept-then-drop-the-answer, accept and then answer as
//!   if still starting (409, 425, 429, 5xx), fail the next rollout, and crash
//!   mid-rollout — the process exits while a rollout runs;
//! - **a count of the rollouts it really started** (`GET /admin/stats`).
//!
//! With a state file (`DEPLOY_CONTROLLER_STATE`), what it knows survives a
//! restart. A rollout that was queued or running when the process stopped is
//! reported **failed** after the restart ("interrupted"), never resumed: half of
//! a rollout is not something a controller should guess about, and the caller
//! decides what comes next (deploy again, or roll back).

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
    ApiError, ApiJson, ApiPath, Timestamp,
    simulated::{AnswerFault, EventLog, SimulatedEvent, Tenant, idempotency_key, request_hash, still_processing},
};
use serde::{Deserialize, Serialize};
use validator::Validate;

/// The sandbox port (docs/contract.md §12).
pub const DEFAULT_PORT: u16 = 7102;

/// How long a request that the `drop_next` fault accepted is held before the
/// server lets it go: far past any caller's timeout.
const DROPPED_ANSWER_HOLD: Duration = Duration::from_secs(60);

/// The exit status of a process that the `crash_next_rollout` fault stopped.
pub const CRASH_EXIT_CODE: i32 = 70;

/// The faults in force. Counters count down with each request or rollout they hit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, Validate)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Added before every rollout request.
    pub latency_ms: u64,
    /// The next N rollout requests answer 503 before accepting: nothing starts.
    pub fail_next: u32,
    /// The next N rollout requests are accepted (the rollout starts), and then never answered.
    pub drop_next: u32,
    /// The next rollout requests are accepted (the rollout starts), and each
    /// answered with the next of these statuses instead: 409
    /// `request_in_progress`, 425, 429 with a body, 500, 503.
    pub answer_after_accepting: Vec<u16>,
    /// The next N rollouts run, and end `failed`.
    pub fail_next_rollout: u32,
    /// The next rollout to start running takes the whole process down with it
    /// (exit status 70). Only when the controller runs as its own process.
    pub crash_next_rollout: u32,
}

/// What the controller really did, for "exactly once" assertions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Rollouts started (a replay starts none).
    pub rollouts_started: u64,
    /// Rollout requests received, replays and refusals included.
    pub requests: u64,
    /// Requests to cancel a rollout, whatever they found.
    #[serde(default)]
    pub cancel_requests: u64,
    /// Rollouts those requests stopped (a cancel of a cancelled rollout stops none).
    #[serde(default)]
    pub rollouts_cancelled: u64,
}

/// `POST /v1/rollouts`, as a caller sends it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, Validate)]
#[serde(deny_unknown_fields)]
pub struct RolloutRequest {
    #[validate(length(min = 1, max = 255, message = "must be 1 to 255 characters"))]
    pub service: String,
    #[validate(length(min = 1, max = 255, message = "must be 1 to 255 characters"))]
    pub environment: String,
    #[validate(length(min = 1, max = 255, message = "must be 1 to 255 characters"))]
    pub artifact_digest: String,
    pub commit_sha: Option<String>,
    /// `deployment` or `rollback`: the controller rolls either out the same way.
    #[validate(length(min = 1, max = 32, message = "must be 1 to 32 characters"))]
    pub kind: String,
    /// The caller's own id for it (the deployments service sends the request's derived key).
    #[validate(length(min = 1, max = 255, message = "must be 1 to 255 characters"))]
    pub reference: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl RolloutState {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Queued => "queued",
            RolloutState::Running => "running",
            RolloutState::Succeeded => "succeeded",
            RolloutState::Failed => "failed",
            RolloutState::Cancelled => "cancelled",
        }
    }

    fn is_finished(self) -> bool {
        matches!(
            self,
            RolloutState::Succeeded | RolloutState::Failed | RolloutState::Cancelled
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    pub id: String,
    pub state: RolloutState,
    pub service: String,
    pub environment: String,
    pub artifact_digest: String,
    pub commit_sha: Option<String>,
    pub kind: String,
    pub reference: String,
    pub idempotency_key: String,
    /// Why it failed, when it did.
    pub failure: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Everything the controller knows, as the state file holds it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Ledger {
    /// Each rollout with the tenant it belongs to.
    rollouts: Vec<(Tenant, Rollout)>,
    /// `(tenant, idempotency key)` → which request it was and the rollout it made.
    keys: Vec<(Tenant, String, Keyed)>,
    stats: Stats,
    #[serde(skip)]
    index: HashMap<(Tenant, String), usize>,
    #[serde(skip)]
    faults: Faults,
}

impl Ledger {
    /// What happens to the answer of the rollout just started.
    fn answer_fault(&mut self) -> AnswerFault {
        AnswerFault::take(&mut self.faults.drop_next, &mut self.faults.answer_after_accepting)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Keyed {
    request_hash: String,
    rollout: usize,
}

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// How long each phase of a rollout takes (queued, then running).
    pub step: Duration,
    /// Where its state survives restarts; `None`: in memory only.
    pub state_file: Option<PathBuf>,
    /// Whether `crash_next_rollout` may exit the process: only when the
    /// controller is a process of its own, never inside the sandbox.
    pub may_exit: bool,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            step: Duration::from_secs(2),
            state_file: None,
            may_exit: false,
        }
    }
}

/// The controller's state: one ledger behind one lock, so that a key is
/// claimed and its rollout started in one step.
#[derive(Debug, Clone)]
pub struct Controller {
    ledger: Arc<Mutex<Ledger>>,
    config: Arc<ControllerConfig>,
    events: EventLog,
}

impl Controller {
    /// A controller with what its state file holds, if it has one. Rollouts
    /// that were under way when it last stopped are reported failed.
    pub fn open(config: ControllerConfig) -> std::io::Result<Controller> {
        let mut ledger: Ledger = match &config.state_file {
            Some(path) => platform::simulated::load_state(path)?,
            None => Ledger::default(),
        };
        let now = Timestamp::now();
        for (_, rollout) in &mut ledger.rollouts {
            if !rollout.state.is_finished() {
                rollout.state = RolloutState::Failed;
                rollout.failure = Some("interrupted: the controller stopped while the rollout ran".into());
                rollout.updated_at = now;
            }
        }
        ledger.index = ledger
            .keys
            .iter()
            .enumerate()
            .map(|(i, (tenant, key, _))| ((tenant.clone(), key.clone()), i))
            .collect();
        let controller = Controller {
            ledger: Arc::new(Mutex::new(ledger)),
            config: Arc::new(config),
            events: EventLog::default(),
        };
        controller.save(&controller.lock())?;
        Ok(controller)
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats
    }

    /// What it did since it started, in order (`GET /admin/events`).
    pub fn events(&self) -> Vec<SimulatedEvent> {
        self.events.all()
    }

    pub fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the ledger to the state file, if it has one.
    fn save(&self, ledger: &Ledger) -> std::io::Result<()> {
        match &self.config.state_file {
            Some(path) => platform::simulated::save_state(path, ledger),
            None => Ok(()),
        }
    }

    fn saved(&self, ledger: &Ledger) {
        if let Err(e) = self.save(ledger) {
            tracing::error!(error = %e, "could not write the controller's state file");
        }
    }

    /// Starts the rollout a tenant's key names, once: the same key and body
    /// again is the same rollout (`true`: a replay); another body is refused.
    /// The last: what a fault does to its answer.
    fn start(
        &self,
        tenant: Tenant,
        key: String,
        request: RolloutRequest,
    ) -> Result<(Rollout, bool, AnswerFault), ApiError> {
        let hash = request_hash(&request);
        let mut ledger = self.lock();
        if let Some(&at) = ledger.index.get(&(tenant.clone(), key.clone())) {
            let keyed = &ledger.keys[at].2;
            return if keyed.request_hash == hash {
                let rollout = ledger.rollouts[keyed.rollout].1.clone();
                self.events.record(
                    format!("replayed {}: the same key, nothing started again", rollout.id),
                    Some(&key),
                );
                Ok((rollout, true, AnswerFault::None))
            } else {
                self.events
                    .record("422: the key names another rollout, nothing started", Some(&key));
                Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency_key_reused",
                    "Idempotency key reused",
                    "this key was used with a different rollout; nothing was started",
                ))
            };
        }
        let now = Timestamp::now();
        let rollout = Rollout {
            id: format!("ro_{}", uuid::Uuid::now_v7().simple()),
            state: RolloutState::Queued,
            service: request.service,
            environment: request.environment,
            artifact_digest: request.artifact_digest,
            commit_sha: request.commit_sha,
            kind: request.kind,
            reference: request.reference,
            idempotency_key: key.clone(),
            failure: None,
            created_at: now,
            updated_at: now,
        };
        let at = ledger.rollouts.len();
        ledger.rollouts.push((tenant.clone(), rollout.clone()));
        let keyed_at = ledger.keys.len();
        ledger.index.insert((tenant.clone(), key.clone()), keyed_at);
        ledger.keys.push((
            tenant,
            key,
            Keyed {
                request_hash: hash,
                rollout: at,
            },
        ));
        ledger.stats.rollouts_started += 1;
        self.events.record(
            format!(
                "started {} ({} of {} to {} in {}, reference {})",
                rollout.id,
                rollout.kind,
                rollout.artifact_digest,
                rollout.service,
                rollout.environment,
                rollout.reference
            ),
            Some(&rollout.idempotency_key),
        );
        let fault = ledger.answer_fault();
        self.saved(&ledger);
        drop(ledger);
        tokio::spawn(self.clone().run(at));
        Ok((rollout, false, fault))
    }

    /// A rollout's life: a step queued, a step running, then its end — unless
    /// it is cancelled meanwhile, or a fault fails it or crashes the process.
    async fn run(self, at: usize) {
        tokio::time::sleep(self.config.step).await;
        let crash = {
            let mut ledger = self.lock();
            let Some(crash) = self.advance(&mut ledger, at, RolloutState::Running) else {
                return;
            };
            crash
        };
        if crash {
            tracing::error!("fault: the controller crashes in the middle of a rollout");
            std::process::exit(CRASH_EXIT_CODE);
        }
        tokio::time::sleep(self.config.step).await;
        let mut ledger = self.lock();
        let fail = ledger.faults.fail_next_rollout > 0;
        if fail {
            ledger.faults.fail_next_rollout -= 1;
        }
        let end = if fail {
            RolloutState::Failed
        } else {
            RolloutState::Succeeded
        };
        if self.advance(&mut ledger, at, end).is_some() && fail {
            ledger.rollouts[at].1.failure = Some("fault: the rollout failed its health checks".into());
            self.saved(&ledger);
        }
    }

    /// Moves a rollout that has not finished to `state` and saves. `None`: it
    /// had finished (cancelled, say). `Some(crash)`: whether the crash fault
    /// takes this moment (only when it starts running, and only if allowed).
    fn advance(&self, ledger: &mut Ledger, at: usize, state: RolloutState) -> Option<bool> {
        let rollout = &mut ledger.rollouts[at].1;
        if rollout.state.is_finished() {
            return None;
        }
        rollout.state = state;
        rollout.updated_at = Timestamp::now();
        self.events.record(
            format!("{} is {}", rollout.id, state.as_str()),
            Some(&rollout.idempotency_key),
        );
        let crash = state == RolloutState::Running && self.config.may_exit && ledger.faults.crash_next_rollout > 0;
        if crash {
            ledger.faults.crash_next_rollout -= 1;
        }
        self.saved(ledger);
        Some(crash)
    }
}

pub fn router(controller: Controller) -> Router {
    platform::service::finish(
        Router::new()
            .route("/v1/rollouts", post(create_rollout).get(lookup::find_rollouts))
            .route("/v1/rollouts/{rollout_id}", get(get_rollout))
            .route("/v1/rollouts/{rollout_id}/cancel", post(cancel_rollout))
            .route("/admin/faults", get(admin::get_faults).put(admin::put_faults))
            .route("/admin/stats", get(admin::get_stats))
            .route("/admin/events", get(admin::get_events))
            .route("/healthz", get(|| async { Json(serde_json::json!({"status": "ok"})) }))
            .with_state(controller),
    )
}

/// Serves the controller, its connections held to `limits`, until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    controller: Controller,
    limits: platform::config::ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing::info!(addr = %listener.local_addr()?, step = ?controller.config.step,
        state_file = ?controller.config.state_file, "simulated deployment controller listening");
    Ok(platform::serve(listener, router(controller), limits, shutdown).await?)
}

async fn create_rollout(
    State(controller): State<Controller>,
    tenant: Tenant,
    headers: HeaderMap,
    ApiJson(request): ApiJson<RolloutRequest>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let faults = {
        let mut ledger = controller.lock();
        ledger.stats.requests += 1;
        let faults = ledger.faults.clone();
        if ledger.faults.fail_next > 0 {
            ledger.faults.fail_next -= 1;
        }
        faults
    };
    tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
    if faults.fail_next > 0 {
        controller
            .events
            .record("503 before accepting (fault fail_next): nothing started", Some(&key));
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "controller_unavailable",
            "Controller unavailable",
            "the controller failed before accepting the rollout; nothing was started",
        ));
    }
    let (rollout, replayed, fault) = controller.start(tenant, key.clone(), request)?;
    match fault {
        AnswerFault::None => {}
        AnswerFault::Drop => {
            tracing::warn!("fault: accepted, and the answer is dropped");
            controller
                .events
                .record("the answer is dropped (fault drop_next)", Some(&key));
            tokio::time::sleep(DROPPED_ANSWER_HOLD).await;
        }
        AnswerFault::Status(status) => {
            controller.events.record(
                format!("accepted, and answered {status} (fault answer_after_accepting)"),
                Some(&key),
            );
            return Err(still_processing(status));
        }
    }
    let mut response = (StatusCode::ACCEPTED, Json(rollout)).into_response();
    response.headers_mut().insert(
        "idempotent-replayed",
        HeaderValue::from_static(if replayed { "true" } else { "false" }),
    );
    Ok(response)
}

async fn get_rollout(
    State(controller): State<Controller>,
    tenant: Tenant,
    ApiPath(rollout_id): ApiPath<String>,
) -> Result<Json<Rollout>, ApiError> {
    controller
        .lock()
        .rollouts
        .iter()
        .find(|(t, r)| *t == tenant && r.id == rollout_id)
        .map(|(_, r)| Json(r.clone()))
        .ok_or_else(|| ApiError::not_found(format!("rollout `{rollout_id}`")))
}

/// Cancels a rollout that has not finished; a cancelled one is answered as it
/// is; a finished one cannot be (409 `invalid_state`).
async fn cancel_rollout(
    State(controller): State<Controller>,
    tenant: Tenant,
    ApiPath(rollout_id): ApiPath<String>,
) -> Result<Json<Rollout>, ApiError> {
    let mut ledger = controller.lock();
    ledger.stats.cancel_requests += 1;
    let at = ledger
        .rollouts
        .iter()
        .position(|(t, r)| *t == tenant && r.id == rollout_id)
        .ok_or_else(|| ApiError::not_found(format!("rollout `{rollout_id}`")))?;
    match ledger.rollouts[at].1.state {
        RolloutState::Queued | RolloutState::Running => {
            ledger.stats.rollouts_cancelled += 1;
            let rollout = &mut ledger.rollouts[at].1;
            rollout.state = RolloutState::Cancelled;
            rollout.updated_at = Timestamp::now();
            controller
                .events
                .record(format!("cancelled {}", rollout.id), Some(&rollout.idempotency_key));
            controller.saved(&ledger);
        }
        RolloutState::Cancelled => {}
        finished => {
            return Err(ApiError::invalid_state(format!(
                "the rollout has {}",
                if finished == RolloutState::Succeeded {
                    "succeeded"
                } else {
                    "failed"
                }
            ))
            .with("state", finished));
        }
    }
    Ok(Json(ledger.rollouts[at].1.clone()))
}

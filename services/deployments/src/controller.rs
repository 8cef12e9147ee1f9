//! The deployment controller, as this service sees it: where rollout events
//! go ([`Destination`]), how a lost answer is looked up, and how a rollout is
//! followed ([`Controller::watch_once`]) and cancelled. The controller is a
//! separate HTTP service (the simulated one in `services/deploy-controller`
//! in the sandbox) with idempotency keys of its own; every rollout request
//! carries the event's key, derived from the request the client sent.

use std::time::Duration;

use idempotency::{Idempotency, OperationState};
use outbox::{Delivery, Destination, Ledger, Lookup, OutboxEvent, Settlement};
use platform::{ApiError, Tx};
use serde::{Deserialize, Serialize};

use crate::{domain::DeploymentState, store};

/// The event kind of a deployment or rollback: one rollout at the controller.
pub const ROLLOUT: &str = "rollout";

/// The principal the journal names for what the watcher sees end.
pub const WATCHER: &str = "system:rollout-watcher";

/// What a rollout's event carries. Its controller `reference` is the
/// event's, not the deployment's id ([`reference`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RolloutOrder {
    pub deployment_id: String,
    pub kind: String,
    pub service: String,
    pub environment: String,
    pub artifact_digest: String,
    pub commit_sha: Option<String>,
}

/// Where the controller is and the key this service calls it with.
#[derive(Clone)]
pub struct ControllerConfig {
    /// `DEPLOYMENTS_CONTROLLER_URL`, default the sandbox's simulated controller.
    pub url: String,
    /// `DEPLOYMENTS_CONTROLLER_KEY`: a secret, never printed.
    pub api_key: String,
}

/// The sandbox's key at the simulated controller.
pub const SANDBOX_CONTROLLER_KEY: &str = "sk_sandbox_retrysafe_deployments";

impl std::fmt::Debug for ControllerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerConfig")
            .field("url", &self.url)
            .field("api_key", &"[redacted]")
            .finish()
    }
}

impl Default for ControllerConfig {
    /// The sandbox's simulated controller, with the sandbox's key.
    fn default() -> Self {
        ControllerConfig {
            url: format!("http://127.0.0.1:{}", crate::CONTROLLER_DEFAULT_PORT),
            api_key: SANDBOX_CONTROLLER_KEY.to_owned(),
        }
    }
}

impl ControllerConfig {
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let sandbox = ControllerConfig::default();
        ControllerConfig {
            // an invalid RETRYSAFE_BASE_PORT has stopped the service already, at its own address
            url: var("DEPLOYMENTS_CONTROLLER_URL").unwrap_or_else(|| {
                match platform::config::sandbox_port(crate::CONTROLLER_DEFAULT_PORT) {
                    Ok(port) => format!("http://127.0.0.1:{port}"),
                    Err(_) => sandbox.url,
                }
            }),
            api_key: var("DEPLOYMENTS_CONTROLLER_KEY").unwrap_or(sandbox.api_key),
        }
    }
}

/// A rollout as the controller shows it.
#[derive(Debug, Clone, Deserialize)]
pub struct Rollout {
    pub id: String,
    pub state: String,
    pub reference: String,
    pub artifact_digest: String,
    /// Where it rolls out: what a lookup checks beside the reference and the digest.
    pub service: String,
    pub environment: String,
    pub failure: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Found {
    data: Vec<Rollout>,
}

/// The controller over HTTP.
#[derive(Debug, Clone)]
pub struct Controller {
    config: ControllerConfig,
    http: reqwest::Client,
}

impl Controller {
    pub fn new(config: ControllerConfig) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        Controller { config, http }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.config.url)
    }

    /// `/v1/rollouts/{rollout_id}` and what follows it: the id one path
    /// segment, encoded, so that no id reaches another of the controller's
    /// routes with this service's key.
    fn rollout_url(&self, rollout_id: &str, rest: &str) -> Result<String, platform::path::NotASegment> {
        Ok(self.url(&format!("/v1/rollouts/{}{rest}", platform::path::segment(rollout_id)?)))
    }

    /// A rollout the controller has; `None` when it does not know it (it
    /// lost its state, say).
    async fn rollout(&self, rollout_id: &str) -> Result<Option<Rollout>, String> {
        let url = self.rollout_url(rollout_id, "").map_err(|e| e.to_string())?;
        let response = self
            .http
            .get(url)
            .bearer_auth(&self.config.api_key)
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(format!("the controller answered {}", response.status()));
        }
        response.json().await.map(Some).map_err(|e| e.without_url().to_string())
    }

    async fn find(&self, query: &[(&str, &str)]) -> Result<Option<Rollout>, String> {
        let response = self
            .http
            .get(self.url("/v1/rollouts"))
            .bearer_auth(&self.config.api_key)
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

    /// Asks the controller to stop a rollout. `Ok(true)`: it is cancelled (now
    /// or before), or the controller does not know it — nothing runs;
    /// `Ok(false)`: it had finished already.
    pub async fn cancel(&self, rollout_id: &str) -> Result<bool, ApiError> {
        let url = self
            .rollout_url(rollout_id, "/cancel")
            .map_err(|e| ApiError::internal(format!("controller: {e}")))?;
        let response = self
            .http
            .post(url)
            .bearer_auth(&self.config.api_key)
            .send()
            .await
            .map_err(|e| unreachable_controller(e.to_string()))?;
        match response.status().as_u16() {
            200..=299 | 404 => Ok(true),
            409 => Ok(false),
            status => Err(unreachable_controller(format!("the controller answered {status}"))),
        }
    }

    /// Follows every rollout the controller has and that has not finished,
    /// and moves its deployment along: `running`, then `succeeded` (the
    /// environment's new current release), `failed` or `cancelled` — and ends
    /// the operation that asked for it with it. A rollout the controller no
    /// longer knows has failed. Returns how many deployments changed; each
    /// operation's end is reported to the sink of `idempotency`, the service's layer.
    pub async fn watch_once(&self, idempotency: &Idempotency) -> Result<usize, sqlx::Error> {
        let db = idempotency.db();
        let mut changed = 0;
        for watched in store::watched(db).await? {
            let rollout = match self.rollout(&watched.rollout_id).await {
                Ok(Some(rollout)) => rollout,
                // nothing the controller said: only the state and the failure are read of it
                Ok(None) => Rollout {
                    id: watched.rollout_id.clone(),
                    state: "failed".into(),
                    reference: String::new(),
                    artifact_digest: String::new(),
                    service: String::new(),
                    environment: String::new(),
                    failure: Some("the controller no longer knows the rollout".into()),
                },
                Err(reason) => {
                    tracing::warn!(deployment_id = %watched.deployment_id, %reason, "could not read the rollout; asking again later");
                    continue;
                }
            };
            let (from, to, note): (&[DeploymentState], _, _) = match rollout.state.as_str() {
                "running" => (
                    &[DeploymentState::Queued],
                    DeploymentState::Running,
                    "the controller is rolling it out".to_owned(),
                ),
                "succeeded" => (
                    &[DeploymentState::Queued, DeploymentState::Running],
                    DeploymentState::Succeeded,
                    "the controller finished the rollout: the environment's current release".to_owned(),
                ),
                "failed" => (
                    &[DeploymentState::Queued, DeploymentState::Running],
                    DeploymentState::Failed,
                    format!(
                        "the rollout failed: {}",
                        rollout.failure.as_deref().unwrap_or("the controller gave no reason")
                    ),
                ),
                "cancelled" => (
                    &[DeploymentState::Queued, DeploymentState::Running],
                    DeploymentState::Cancelled,
                    "the controller cancelled the rollout".to_owned(),
                ),
                _ => continue,
            };
            if from.contains(&watched.state) {
                let mut tx = db.begin().await?;
                if store::change_state(&mut tx, &watched.account_id, &watched.deployment_id, from, to, &note).await? {
                    changed += 1;
                    if let Some(ended) = operation_ends_with(to) {
                        let (account, operation) = (&watched.account_id, &watched.operation_id);
                        outbox::finish(idempotency, &mut tx, account, operation, ended, WATCHER).await?;
                    } else {
                        // running: no transition of the operation, a change of the deployment all the same
                        let (account, operation) = (&watched.account_id, &watched.operation_id);
                        journal::record_resource_change(&mut tx, WATCHER, account, operation, to.as_str()).await?;
                    }
                }
                tx.commit().await?;
            }
        }
        Ok(changed)
    }

    /// Follows rollouts every `poll` until the returned task is aborted.
    pub fn spawn_watcher(self, idempotency: Idempotency, poll: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                if let Err(e) = self.watch_once(&idempotency).await {
                    tracing::warn!(error = %e, "the rollout watcher failed; trying again");
                }
                tokio::time::sleep(poll).await;
            }
        })
    }
}

/// How the operation that asked for a deployment ends with it: a rollout
/// that succeeded completes it; one that failed or was cancelled fails it.
pub fn operation_ends_with(state: DeploymentState) -> Option<OperationState> {
    match state {
        DeploymentState::Succeeded => Some(OperationState::Completed),
        DeploymentState::Failed | DeploymentState::Cancelled => Some(OperationState::Failed),
        DeploymentState::Queued | DeploymentState::Running | DeploymentState::Unknown => None,
    }
}

fn unreachable_controller(reason: String) -> ApiError {
    ApiError::internal(format!("controller: {reason}"))
        .with_detail("the deployment controller could not be asked to cancel; nothing changed. Try again")
}

/// The `reference` an event's rollout carries, and what a lookup and a
/// person's resolution check a found one against: the event's derived key,
/// sent in the body as well as the header. Derived from the request, not the
/// deployment's id, so that a retry run again after a failover lost its claim
/// sends the same body under the same key and the controller answers with the
/// first rollout (docs/design.md §6, §12).
fn reference(event: &OutboxEvent) -> &str {
    &event.external_key
}

fn order(event: &OutboxEvent) -> Result<RolloutOrder, String> {
    if event.kind != ROLLOUT {
        return Err(format!("no such deployments event kind `{}`", event.kind));
    }
    serde_json::from_value(event.payload.clone()).map_err(|e| format!("event {}: {e}", event.event_id))
}

#[derive(Serialize)]
struct RolloutRequest<'a> {
    service: &'a str,
    environment: &'a str,
    artifact_digest: &'a str,
    commit_sha: Option<&'a str>,
    kind: &'a str,
    reference: &'a str,
}

#[derive(Deserialize)]
struct Accepted {
    id: String,
}

impl Destination for Controller {
    async fn deliver(&self, event: &OutboxEvent) -> Delivery {
        let order = match order(event) {
            Ok(order) => order,
            Err(reason) => return Delivery::Refused { reason },
        };
        let request = RolloutRequest {
            service: &order.service,
            environment: &order.environment,
            artifact_digest: &order.artifact_digest,
            commit_sha: order.commit_sha.as_deref(),
            kind: &order.kind,
            reference: reference(event),
        };
        let sent = self
            .http
            .post(self.url("/v1/rollouts"))
            .bearer_auth(&self.config.api_key)
            .header("idempotency-key", &event.external_key)
            .json(&request)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) if e.is_connect() => {
                return Delivery::NotAccepted {
                    reason: e.without_url().to_string(),
                };
            }
            Err(e) => {
                return Delivery::AnswerLost {
                    reason: e.without_url().to_string(),
                };
            }
        };
        let status = response.status();
        if status.is_success() {
            return match response.json::<Accepted>().await {
                Ok(accepted) => Delivery::Accepted {
                    external_ref: accepted.id,
                },
                Err(e) => Delivery::AnswerLost {
                    reason: format!("accepted, and the answer could not be read: {}", e.without_url()),
                },
            };
        }
        let problem = response.text().await.unwrap_or_default();
        // the controller refuses no rollout with a 409 for good: any 409 may be one still being started
        Delivery::from_refusal(status.as_u16(), &problem, &[])
    }

    /// By the key, then by the reference; what is found must be this
    /// request's rollout of this digest, to this service and environment
    /// (docs/design.md §6). Several accounts may share one controller key,
    /// so a rollout that merely exists proves nothing.
    async fn look_up(&self, event: &OutboxEvent) -> Result<Lookup, String> {
        let order = order(event)?;
        let found = match self.find(&[("idempotency_key", &event.external_key)]).await? {
            Some(rollout) => Some(rollout),
            None => self.find(&[("reference", reference(event))]).await?,
        };
        let Some(rollout) = found else {
            return Ok(Lookup::Absent);
        };
        if rollout.reference == reference(event)
            && rollout.artifact_digest == order.artifact_digest
            && rollout.service == order.service
            && rollout.environment == order.environment
        {
            return Ok(Lookup::Found {
                external_ref: rollout.id,
            });
        }
        // what it is goes to the log only: it may be another account's, and
        // the reason is shown on this operation to everyone who reads it
        tracing::warn!(operation_id = %event.operation_id, held = %rollout.id, reference = %rollout.reference,
            artifact_digest = %rollout.artifact_digest, service = %rollout.service, environment = %rollout.environment,
            "the controller holds, under the key or the reference, a rollout that is not the one asked for");
        Ok(Lookup::Mismatch {
            reason: "the controller holds a rollout under this operation's key or reference that is not its \
                     work: a person must look (the service's log names it)"
                .to_owned(),
            external_ref: rollout.id,
        })
    }
}

/// The deployments' rows for their rollouts: how an event's ending is
/// written in them, by the reconciler or by a person settling it by hand.
#[derive(Debug, Clone, Copy)]
pub struct Rollouts;

impl Ledger for Rollouts {
    /// A rollout goes on at the controller after it is accepted: its
    /// operation ends when the watcher sees the rollout end.
    fn completes_on_acceptance(&self, _event: &OutboxEvent) -> bool {
        false
    }

    fn settle<'a>(
        &'a self,
        tx: &'a mut Tx,
        event: &'a OutboxEvent,
        settlement: Settlement<'a>,
    ) -> idempotency::BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let order = order(event).map_err(sqlx::Error::Protocol)?;
            store::settle_rollout(tx, &event.account_id, &order.deployment_id, settlement).await
        })
    }
}

//! The deployments service (docs/contract.md §7 Deployments): the deployment
//! chapter of the article (docs/article.md) made real.
//!
//! - Only immutable references: an artifact digest and a full commit SHA are
//!   types that can only be built valid ([`domain::ArtifactDigest`],
//!   [`domain::CommitSha`]); a tag, a branch, `latest` or a short SHA is 400
//!   `mutable_reference_rejected`. Both are in the fingerprint and in what an
//!   approver sees.
//! - The environment lock: at most one deployment or rollback that may be
//!   changing an environment, decided by a partial unique index; the other is
//!   409 `environment_locked`, naming the holder and its operation. A stale
//!   `expected_current_deployment_id` is 409 `version_mismatch`.
//! - A deployment answers 202 `queued`; its rollout goes to the controller
//!   through the outbox ([`outbox`]) with a key derived from the
//!   client's request, and [`controller::Controller::watch_once`] follows it to
//!   `running`, `succeeded`, `failed` or `cancelled`. A lost answer leaves it
//!   `unknown` until the reconciler asks the controller.
//! - A rollback is its own operation with its own approval, always; production
//!   deployments wait for a human too ([`domain::DeploymentsPolicy`]). The
//!   approver is told which release it replaces, and so whether a rollback
//!   stays possible; the approved run replaces that release or none at all
//!   (409 `approval_stale`, held under the environment's lock by
//!   [`store::create`]).
//!
//! A library with a thin `main.rs`: [`build_router`] makes the whole HTTP API
//! for tests and for the sandbox, [`serve`] runs it.

pub mod controller;
pub mod domain;
pub mod routes;
pub mod store;

use std::time::Duration;

use axum::{Router, extract::FromRef};
use controller::{Controller, ControllerConfig};
use domain::DeploymentsPolicy;
use idempotency::{Idempotency, IdempotencyConfig};
use outbox::{Outbox, OutboxConfig};
use platform::{Authenticator, Db, Migrations, config::ServiceConfig};
use utoipa::OpenApi;

/// The deployments tables, for both backends.
pub static MIGRATIONS: Migrations = Migrations {
    postgres: sqlx::migrate!("../../migrations/deployments/postgres"),
    sqlite: sqlx::migrate!("../../migrations/deployments/sqlite"),
};

/// The sandbox port (docs/contract.md §12).
pub const DEFAULT_PORT: u16 = 7003;
/// Where the sandbox's simulated deployment controller listens.
pub const CONTROLLER_DEFAULT_PORT: u16 = 7102;

/// Everything a handler needs.
#[derive(Clone, Debug)]
pub struct App {
    pub db: Db,
    pub idempotency: Idempotency,
    pub auth: Authenticator,
    pub policy: DeploymentsPolicy,
    /// To cancel a rollout the controller has.
    pub controller: Controller,
}

impl FromRef<App> for Idempotency {
    fn from_ref(app: &App) -> Self {
        app.idempotency.clone()
    }
}

impl FromRef<App> for Authenticator {
    fn from_ref(app: &App) -> Self {
        app.auth.clone()
    }
}

/// What the service needs beside its database: its approval policy, the
/// controller, the outbox's pace, and how often rollouts are followed.
#[derive(Debug, Clone)]
pub struct Settings {
    pub policy: DeploymentsPolicy,
    pub controller: ControllerConfig,
    pub outbox: OutboxConfig,
    pub watch_every: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            policy: DeploymentsPolicy::default(),
            controller: ControllerConfig::default(),
            outbox: OutboxConfig::default(),
            watch_every: Duration::from_millis(500),
        }
    }
}

impl Settings {
    /// `DEPLOYMENTS_ENVIRONMENTS`, `DEPLOYMENTS_APPROVAL_ENVIRONMENTS`, `DEPLOYMENTS_CONTROLLER_URL`,
    /// `DEPLOYMENTS_CONTROLLER_KEY` and the outbox's `RETRYSAFE_OUTBOX_*`.
    pub fn from_env() -> Result<Self, String> {
        Ok(Settings {
            policy: DeploymentsPolicy::from_env()?,
            controller: ControllerConfig::from_env(),
            outbox: OutboxConfig::from_env()?,
            ..Settings::default()
        })
    }
}

impl App {
    pub fn new(db: Db, idempotency: IdempotencyConfig, sandbox: bool, controller: ControllerConfig) -> Self {
        let controller = Controller::new(controller);
        App {
            idempotency: Idempotency::new(db.clone(), idempotency)
                .for_service("deployments")
                .with_sink(journal::Journal::default())
                .with_gate(approvals::Approvals)
                .with_extension(outbox::Events::new(controller::Rollouts, controller.clone())),
            auth: Authenticator::new(db.clone(), sandbox),
            policy: DeploymentsPolicy::default(),
            controller,
            db,
        }
    }

    pub fn with_policy(mut self, policy: DeploymentsPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The outbox that hands rollouts to the controller, and its reconciler
    /// ([`Outbox::spawn`] runs both).
    pub fn outbox(&self, config: OutboxConfig) -> Outbox<Controller> {
        Outbox::new(self.idempotency.clone(), self.controller.clone(), config)
    }
}

/// Applies the platform's, the idempotency layer's and the deployments' migrations.
pub async fn migrate(db: &Db) -> Result<(), sqlx::migrate::MigrateError> {
    db.migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS, &MIGRATIONS])
        .await
}

/// The service's OpenAPI document. An `environment` is one of `environments`
/// wherever a request names one: the service refuses any other with 400
/// `unknown_environment`, so the document says which it takes.
pub fn openapi(environments: &[String]) -> utoipa::openapi::OpenApi {
    let mut doc = routes::DeploymentsApi::openapi();
    doc.merge(idempotency::routes::OperationsApi::openapi());
    doc.merge(outbox::routes::SettlingApi::openapi());
    doc.merge(approvals::ApprovalsApi::openapi());
    doc.merge(journal::routes::JournalApi::openapi());
    let mut json = serde_json::to_value(&doc).expect("an OpenAPI document is JSON");
    let known = serde_json::json!(environments);
    for body in ["CreateDeploymentBody", "RollbackBody"] {
        if let Some(environment) = json.pointer_mut(&format!("/components/schemas/{body}/properties/environment")) {
            environment["enum"] = known.clone();
        }
    }
    let get_environment = "/paths/~1v1~1environments~1{service}~1{environment}/get/parameters";
    for parameter in json
        .pointer_mut(get_environment)
        .and_then(|p| p.as_array_mut())
        .into_iter()
        .flatten()
    {
        if parameter["name"] == "environment" {
            parameter["schema"]["enum"] = known.clone();
        }
    }
    serde_json::from_value(json).expect("the document read back")
}

/// The whole HTTP API of the service.
pub fn build_router(app: App) -> Router {
    let openapi = openapi(&app.policy.environments);
    let (metrics, db) = (app.idempotency.metrics().clone(), app.idempotency.db().clone());
    let routes = platform::metrics::tracked(
        routes::router()
            .merge(idempotency::routes::routes())
            .merge(outbox::routes())
            .merge(approvals::routes())
            .merge(journal::routes()),
        metrics,
    )
    .with_state(app);
    platform::service::router("Retrysafe deployments", routes, openapi, &db)
}

/// Connects, migrates, and serves on `config.listen` until `shutdown`
/// resolves; the outbox worker and its reconciler, the rollout watcher, the
/// reaper, the attempt writer and the journal's chainer run beside it.
pub async fn serve(
    config: ServiceConfig,
    idempotency: IdempotencyConfig,
    settings: Settings,
    listener: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let db = platform::service::connect(&config.database_url, config.max_connections, migrate).await?;
    if !config.sandbox && settings.controller.api_key == controller::SANDBOX_CONTROLLER_KEY {
        tracing::warn!(
            "DEPLOYMENTS_CONTROLLER_KEY is not set: using the sandbox's key, which only the simulated controller accepts"
        );
    }
    let app = App::new(db.clone(), idempotency, config.sandbox, settings.controller.clone())
        .with_policy(settings.policy.clone());
    let background = app
        .idempotency
        .spawn_background()
        .with(app.outbox(settings.outbox.clone()).spawn())
        .with(
            app.controller
                .clone()
                .spawn_watcher(app.idempotency.clone(), settings.watch_every),
        );
    let listener = platform::service::bind(listener, &config).await?;
    tracing::info!(addr = %listener.local_addr()?, backend = db.backend().name(), sandbox = config.sandbox,
        controller = %settings.controller.url, environments = ?settings.policy.environments,
        approval_environments = ?settings.policy.approval_environments,
        "deployments listening");
    let router = build_router(app);
    platform::service::run(listener, router, config.limits, shutdown, background.stop(), db).await
}

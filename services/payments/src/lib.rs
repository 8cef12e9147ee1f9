//! The payments service (docs/contract.md §7 Payments): the payments chapter
//! of the article (docs/article.md) made real.
//!
//! - Money is an amount string turned into integer minor units before
//!   anything else sees it ([`money`]).
//! - A payment intent moves no money; at most one live intent per order,
//!   decided by a partial unique index.
//! - A capture and each refund instruction are operations that answer 202 and
//!   go to the payment provider through the outbox ([`outbox`]),
//!   with the provider idempotency key derived from the client's request;
//!   [`provider`] is the provider as the outbox sees it. A lost answer leaves the
//!   operation `unknown` until the reconciler asks the provider.
//! - Refunds never add up to more than was captured: one conditional update
//!   and a CHECK decide it ([`store::begin_refund`]).
//! - Captures at or above their currency's threshold wait for a human; in a
//!   currency with none, every capture does ([`domain::PaymentsPolicy`]).
//!
//! A library with a thin `main.rs`: [`build_router`] makes the whole HTTP API
//! for tests and for the sandbox, [`serve`] runs it.

pub mod domain;
pub mod money;
pub mod provider;
pub mod routes;
pub mod store;

use axum::{Router, extract::FromRef};
use domain::PaymentsPolicy;
use idempotency::{Idempotency, IdempotencyConfig};
use outbox::{Outbox, OutboxConfig};
use platform::{Authenticator, Db, Migrations, config::ServiceConfig};
use provider::{Provider, ProviderConfig};
use utoipa::OpenApi;

/// The payments tables, for both backends.
pub static MIGRATIONS: Migrations = Migrations {
    postgres: sqlx::migrate!("../../migrations/payments/postgres"),
    sqlite: sqlx::migrate!("../../migrations/payments/sqlite"),
};

/// The sandbox port (docs/contract.md §12).
pub const DEFAULT_PORT: u16 = 7002;
/// Where the sandbox's simulated payment provider listens.
pub const PROVIDER_DEFAULT_PORT: u16 = 7101;

/// Everything a handler needs.
#[derive(Clone, Debug)]
pub struct App {
    pub db: Db,
    pub idempotency: Idempotency,
    pub auth: Authenticator,
    pub policy: PaymentsPolicy,
    /// The provider captures and refunds go to, which a person's resolution is checked with.
    pub provider: Provider,
}

/// What the service needs beside its database: its approval policy, the
/// provider, and the outbox's pace.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub policy: PaymentsPolicy,
    pub provider: ProviderConfig,
    pub outbox: OutboxConfig,
}

impl Settings {
    /// `PAYMENTS_CAPTURE_THRESHOLDS`, `PAYMENTS_PROVIDER_URL`,
    /// `PAYMENTS_PROVIDER_KEY` and the outbox's `RETRYSAFE_OUTBOX_*`.
    pub fn from_env() -> Result<Self, String> {
        Ok(Settings {
            policy: PaymentsPolicy::from_env()?,
            provider: ProviderConfig::from_env(),
            outbox: OutboxConfig::from_env()?,
        })
    }
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

impl App {
    pub fn new(db: Db, idempotency: IdempotencyConfig, sandbox: bool, provider: ProviderConfig) -> Self {
        let provider = Provider::new(provider);
        App {
            idempotency: Idempotency::new(db.clone(), idempotency)
                .for_service("payments")
                .with_sink(journal::Journal::default())
                .with_gate(approvals::Approvals)
                .with_extension(outbox::Events::new(provider::Transfers, provider.clone())),
            auth: Authenticator::new(db.clone(), sandbox),
            policy: PaymentsPolicy::default(),
            provider,
            db,
        }
    }

    pub fn with_policy(mut self, policy: PaymentsPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The outbox that carries captures and refunds to the provider, and its
    /// reconciler ([`Outbox::spawn`] runs both).
    pub fn outbox(&self, config: OutboxConfig) -> Outbox<Provider> {
        Outbox::new(self.idempotency.clone(), self.provider.clone(), config)
    }
}

/// Applies the platform's, the idempotency layer's and the payments' migrations.
pub async fn migrate(db: &Db) -> Result<(), sqlx::migrate::MigrateError> {
    db.migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS, &MIGRATIONS])
        .await
}

pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = routes::PaymentsApi::openapi();
    doc.merge(idempotency::routes::OperationsApi::openapi());
    doc.merge(outbox::routes::SettlingApi::openapi());
    doc.merge(approvals::ApprovalsApi::openapi());
    doc.merge(journal::routes::JournalApi::openapi());
    doc
}

/// The whole HTTP API of the service.
pub fn build_router(app: App) -> Router {
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
    platform::service::router("Retrysafe payments", routes, openapi(), &db)
}

/// Connects, migrates, and serves on `config.listen` until `shutdown`
/// resolves; the outbox worker and its reconciler, the reaper, the attempt
/// writer and the journal's chainer run beside it.
pub async fn serve(
    config: ServiceConfig,
    idempotency: IdempotencyConfig,
    settings: Settings,
    listener: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let db = platform::service::connect(&config.database_url, config.max_connections, migrate).await?;
    if !config.sandbox && settings.provider.merchant_key == provider::SANDBOX_MERCHANT_KEY {
        tracing::warn!(
            "PAYMENTS_PROVIDER_KEY is not set: using the sandbox's merchant key, which only the simulated provider accepts"
        );
    }
    let app = App::new(db.clone(), idempotency, config.sandbox, settings.provider.clone())
        .with_policy(settings.policy.clone());
    let background = app
        .idempotency
        .spawn_background()
        .with(app.outbox(settings.outbox.clone()).spawn());
    let listener = platform::service::bind(listener, &config).await?;
    tracing::info!(addr = %listener.local_addr()?, backend = db.backend().name(), sandbox = config.sandbox,
        provider = %settings.provider.url, capture_thresholds = ?settings.policy.capture_thresholds, "payments listening");
    let router = build_router(app);
    platform::service::run(listener, router, config.limits, shutdown, background.stop(), db).await
}

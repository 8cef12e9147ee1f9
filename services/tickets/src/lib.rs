//! The tickets service: tickets an agent can create, comment on and resolve,
//! where a retried create never makes a second ticket and one alert event
//! never gets two (docs/contract.md §7 Tickets).
//!
//! A library with a thin `main.rs`: [`build_router`] makes the whole HTTP API
//! for tests and for the sandbox, [`serve`] runs it.

pub mod domain;
pub mod routes;
pub mod store;

use axum::{Router, extract::FromRef};
use domain::TicketsPolicy;
use idempotency::{Idempotency, IdempotencyConfig};
use platform::{Authenticator, Db, Migrations, config::ServiceConfig};
use utoipa::OpenApi;

/// The tickets tables, for both backends.
pub static MIGRATIONS: Migrations = Migrations {
    postgres: sqlx::migrate!("../../migrations/tickets/postgres"),
    sqlite: sqlx::migrate!("../../migrations/tickets/sqlite"),
};

/// The sandbox port (docs/contract.md §12).
pub const DEFAULT_PORT: u16 = 7001;

/// Everything a handler needs.
#[derive(Clone, Debug)]
pub struct App {
    pub db: Db,
    pub idempotency: Idempotency,
    pub auth: Authenticator,
    /// Which creates need a human's approval.
    pub policy: TicketsPolicy,
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
    pub fn new(db: Db, idempotency: IdempotencyConfig, sandbox: bool) -> Self {
        App {
            idempotency: Idempotency::new(db.clone(), idempotency)
                .for_service("tickets")
                .with_sink(journal::Journal::default())
                .with_gate(approvals::Approvals),
            auth: Authenticator::new(db.clone(), sandbox),
            db,
            policy: TicketsPolicy::default(),
        }
    }

    pub fn with_policy(mut self, policy: TicketsPolicy) -> Self {
        self.policy = policy;
        self
    }
}

/// Applies the platform's, the idempotency layer's and the tickets' migrations.
pub async fn migrate(db: &Db) -> Result<(), sqlx::migrate::MigrateError> {
    db.migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS, &MIGRATIONS])
        .await
}

pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = routes::TicketsApi::openapi();
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
    platform::service::router("Retrysafe tickets", routes, openapi(), &db)
}

/// Connects, migrates, and serves on `config.listen` until `shutdown`
/// resolves; the retention reaper, the attempt writer and the journal's
/// chainer run beside it.
pub async fn serve(
    config: ServiceConfig,
    idempotency: IdempotencyConfig,
    policy: TicketsPolicy,
    listener: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let db = platform::service::connect(&config.database_url, config.max_connections, migrate).await?;
    let app = App::new(db.clone(), idempotency, config.sandbox).with_policy(policy);
    if !app.idempotency.config().enabled {
        tracing::warn!("RETRYSAFE_IDEMPOTENCY=off: no claims, no replays. For measuring the layer's cost only");
    }
    let background = app.idempotency.spawn_background();
    let listener = platform::service::bind(listener, &config).await?;
    tracing::info!(addr = %listener.local_addr()?, backend = db.backend().name(), sandbox = config.sandbox, approval_from = ?policy.approval_from, "tickets listening");
    let router = build_router(app);
    platform::service::run(listener, router, config.limits, shutdown, background.stop(), db).await
}

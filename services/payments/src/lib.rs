//! The payments service (CONTRACT §7 Payments), being built (issue 4). So
//! far: the money it takes — amount strings turned into integer minor units
//! before anything else sees them ([`money`]) — and payment intents, at most
//! one live intent per order, created and cancelled as idempotent operations.
//! Captures through the outbox, refunds and the reconciler follow, on the
//! simulated provider in `services/payment-provider`.
//!
//! A library with a thin `main.rs`: [`build_router`] makes the whole HTTP API
//! for tests and for the sandbox, [`serve`] runs it.

pub mod domain;
pub mod money;
pub mod routes;
pub mod store;

use axum::{Router, extract::FromRef};
use idempotency::{Idempotency, IdempotencyConfig};
use platform::{Authenticator, Db, Migrations, config::ServiceConfig};
use utoipa::OpenApi;

/// The payments tables, for both backends.
pub static MIGRATIONS: Migrations = Migrations {
    postgres: sqlx::migrate!("../../migrations/payments/postgres"),
    sqlite: sqlx::migrate!("../../migrations/payments/sqlite"),
};

/// The sandbox port (CONTRACT §12).
pub const DEFAULT_PORT: u16 = 7002;

/// Everything a handler needs.
#[derive(Clone, Debug)]
pub struct App {
    pub db: Db,
    pub idempotency: Idempotency,
    pub auth: Authenticator,
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
            idempotency: Idempotency::new(db.clone(), idempotency),
            auth: Authenticator::new(db.clone(), sandbox),
            db,
        }
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
    doc
}

/// The whole HTTP API of the service.
pub fn build_router(app: App) -> Router {
    platform::service::finish(
        routes::router()
            .merge(idempotency::routes::routes())
            .with_state(app)
            .merge(platform::service::common_routes("Retrysafe payments", openapi())),
    )
}

/// Connects, migrates, and serves on `config.listen` until `shutdown`
/// resolves; the reaper, the attempt writer and the journal's chainer run beside it.
pub async fn serve(
    config: ServiceConfig,
    idempotency: IdempotencyConfig,
    listener: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    platform::prepare_sqlite_dir(&config.database_url)?;
    let db = Db::connect(&config.database_url, config.max_connections).await?;
    migrate(&db).await?;
    let app = App::new(db.clone(), idempotency, config.sandbox);
    let background = app.idempotency.spawn_background();
    let listener = match listener {
        Some(listener) => listener,
        None => tokio::net::TcpListener::bind(config.listen).await?,
    };
    tracing::info!(addr = %listener.local_addr()?, backend = db.backend().name(), sandbox = config.sandbox, "payments listening");
    let served = platform::serve(listener, build_router(app), shutdown).await;
    background.stop().await;
    db.close().await;
    Ok(served?)
}

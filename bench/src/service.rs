//! A tickets service on loopback, serving as in its own process, for the load to hit.

use idempotency::{ClaimMode, IdempotencyConfig};
use platform::Db;
use tickets::App;
use tokio::runtime::Runtime;

/// A tickets service serving on loopback, and its database.
pub struct Service {
    pub addr: std::net::SocketAddr,
    pub app: App,
    pub db: Db,
    pub stop: tokio::sync::oneshot::Sender<()>,
}

pub fn start_service(services: &Runtime, db: Db, config: IdempotencyConfig) -> Service {
    let app = App::new(db.clone(), config, true);
    let (addr, stop) = serve_router(services, tickets::build_router(app.clone()), &app.idempotency);
    Service { addr, app, db, stop }
}

/// A service's router on loopback, with its idempotency layer's background
/// work running beside it as in the service's own process (the journal's
/// chainer, the attempt writer, the reaper): its address, and what stops it.
pub fn serve_router(
    services: &Runtime,
    router: axum::Router,
    idempotency: &idempotency::Idempotency,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let listener = free_listener();
    let addr = listener.local_addr().unwrap();
    let background = {
        let _on_the_services_runtime = services.enter();
        idempotency.spawn_background()
    };
    services.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let _ = platform::serve(listener, router, Default::default(), async {
            let _ = stopped.await;
        })
        .await;
        background.stop().await;
    });
    (addr, stop)
}

/// A loopback listener on a free port, to hand to the services' runtime.
pub fn free_listener() -> std::net::TcpListener {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.set_nonblocking(true).expect("a non-blocking listener");
    listener
}

pub fn config(enabled: bool) -> IdempotencyConfig {
    IdempotencyConfig {
        claim: ClaimMode::InTransaction,
        enabled,
        ..IdempotencyConfig::default()
    }
}

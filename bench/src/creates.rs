//! The create measured: idempotent vs layer off, called straight, at the
//! floor any claim must cost, and beside idle half-open connections.

use std::sync::Arc;

use idempotency::{IdempotencyHeaders, IdempotencyKey};
use platform::{Db, Principal, Role, on_pool};
use tickets::{App, domain::CreateTicket};

use crate::{
    BODY,
    load::{Load, Workload, median_figure},
    plan::Plan,
    report::{CreateComparison, IdleConnections},
    service::Service,
};

/// How many idle half-open connections the create is measured beside.
pub const IDLE_CONNECTIONS: usize = 500;

/// The create at one client, alone and while [`IDLE_CONNECTIONS`] clients
/// hold half-sent headers, alternated round by round. Each round opens them
/// anew: the server closes them when their headers are late.
pub async fn idle_connections(plan: &Plan, load: &Load, service: &Service) -> IdleConnections {
    let creates = load.creates(service.addr, "beside-idle");
    load.run(1, &creates).await;
    let (mut unloaded, mut loaded) = (Vec::new(), Vec::new());
    for _ in 0..plan.rounds {
        unloaded.push(load.run(1, &creates).await);
        let held = hold_half_open(service.addr, IDLE_CONNECTIONS).await;
        loaded.push(load.run(1, &creates).await);
        drop(held);
    }
    let (unloaded, loaded) = (median_figure(&unloaded), median_figure(&loaded));
    IdleConnections {
        held: IDLE_CONNECTIONS,
        unloaded,
        loaded,
        p50_ratio: loaded.p50_ms / unloaded.p50_ms,
    }
}

/// `count` connections to `addr`, each with the first half of a request's headers sent.
pub async fn hold_half_open(addr: std::net::SocketAddr, count: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("a connection");
        stream
            .write_all(b"POST /v1/tickets HTTP/1.1\r\nHost: bench\r\n")
            .await
            .expect("half the headers sent");
        held.push(stream);
    }
    held
}

/// The idempotent create vs the same create with the layer off, at each concurrency.
pub async fn compare_creates(plan: &Plan, load: &Load, on: &Service, off: &Service) -> Vec<CreateComparison> {
    let mut create = Vec::new();
    for &concurrency in &plan.concurrency {
        eprintln!("create, {concurrency} clients");
        let (a, b) = load
            .side_by_side(
                plan.rounds,
                concurrency,
                &load.creates(on.addr, "on"),
                &load.creates(off.addr, "off"),
            )
            .await;
        let (on_figure, off_figure) = (median_figure(&a), median_figure(&b));
        create.push(CreateComparison {
            concurrency,
            on: on_figure,
            off: off_figure,
            throughput_ratio: on_figure.rps / off_figure.rps,
            p50_ratio: on_figure.p50_ms / off_figure.p50_ms,
            p99_ratio: on_figure.p99_ms / off_figure.p99_ms,
        });
    }
    create
}

/// `tickets::routes::create` called straight, as the handler would call it.
pub fn direct_creates(app: App) -> Workload {
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    Workload::Direct(Arc::new(move |_, _| {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let app = app.clone();
        Box::pin(async move { create_directly(&app, &format!("direct-{}-{n}", std::process::id())).await })
    }))
}

/// The least any claim can add to the layer-off create while keeping §3 of
/// the contract (the key claimed under a unique constraint, in the effect's
/// own transaction): the same ticket insert, plus one bare insert of the key
/// into a table that holds nothing else (`bench_claims`, made here in the
/// layer-off database) — no stored answer, no fingerprint, no journal. What
/// the real claim costs above this is what the contract asks it to keep.
pub async fn floor_creates(db: Db) -> Workload {
    on_pool!(db.write(), |pool| {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS bench_claims (account_id TEXT NOT NULL, idempotency_key TEXT NOT NULL, \
             PRIMARY KEY (account_id, idempotency_key))",
        )
        .execute(pool)
        .await
        .expect("the floor's table");
    });
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    Workload::Direct(Arc::new(move |_, _| {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let db = db.clone();
        Box::pin(async move { create_with_bare_claim(&db, &format!("floor-{}-{n}", std::process::id())).await })
    }))
}

/// One ticket create as the layer-off path runs it (the effect's insert and
/// its JSON answer, in one transaction), with `key` inserted beside it.
pub async fn create_with_bare_claim(db: &Db, key: &str) -> bool {
    let command =
        CreateTicket::from(platform::json::parse_json::<tickets::domain::CreateTicketBody>(BODY.as_bytes()).unwrap());
    let Ok(mut tx) = db.begin().await else { return false };
    let Ok((ticket, outcome)) = tickets::store::create_ticket(&mut tx, "acme", &command).await else {
        return false;
    };
    let answer = serde_json::to_vec(&tickets::domain::TicketCreated { ticket, outcome });
    let claimed = platform::on_tx!(&mut tx, |conn| {
        sqlx::query("INSERT INTO bench_claims (account_id, idempotency_key) VALUES ($1, $2)")
            .bind("acme")
            .bind(key)
            .execute(conn)
            .await
            .is_ok()
    });
    answer.is_ok() && claimed && tx.commit().await.is_ok()
}

/// One ticket create with the key `key`, through the service's own code with
/// no HTTP. `true`: it succeeded.
pub async fn create_directly(app: &App, key: &str) -> bool {
    let principal = Principal {
        account_id: "acme".into(),
        principal_id: "acme-agent".into(),
        role: Role::Agent,
    };
    let key = IdempotencyKey::parse(key).unwrap();
    let command =
        CreateTicket::from(platform::json::parse_json::<tickets::domain::CreateTicketBody>(BODY.as_bytes()).unwrap());
    let response = tickets::routes::create(app, &principal, IdempotencyHeaders { key, wait: None }, command).await;
    response.status().is_success()
}

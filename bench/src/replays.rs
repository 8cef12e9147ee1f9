//! The replay against the HTTP floor: what a replay costs over the least any
//! request to the same service costs (`GET /healthz`).

use std::sync::Arc;

use platform::Backend;
use tokio::runtime::Runtime;

use crate::{
    db::fresh_db,
    load::{Load, median_figure},
    plan::Plan,
    report::ReplayFloor,
    service::{Service, config, start_service},
};

/// Replays of `keys` against `GET /healthz`, both on `service` at
/// `concurrency` clients, alternated round by round.
pub async fn replay_floor(
    plan: &Plan,
    load: &Load,
    concurrency: usize,
    service: &Service,
    keys: Arc<Vec<String>>,
) -> ReplayFloor {
    eprintln!("replay vs GET /healthz, {concurrency} clients");
    let (replays, healthz) = load
        .side_by_side(
            plan.rounds,
            concurrency,
            &load.replays(service.addr, keys),
            &load.healthz(service.addr),
        )
        .await;
    let (replay, healthz) = (median_figure(&replays), median_figure(&healthz));
    ReplayFloor {
        concurrency,
        replay,
        healthz,
        throughput_ratio: replay.rps / healthz.rps,
        p50_ratio: replay.p50_ms / healthz.p50_ms,
    }
}

/// `--replay-floor`: that comparison alone, printed, with no report written.
pub async fn print_replay_floor(backend: Backend, plan: &Plan, services: Arc<Runtime>) -> Result<(), String> {
    if backend == Backend::Postgres && !platform::testing::backend_available(Backend::Postgres).await {
        return Err("PostgreSQL is unreachable; set TEST_DATABASE_URL or pass --backend sqlite".into());
    }
    let on = start_service(&services, fresh_db(backend, "on").await, config(true));
    let load = Load::new(plan.run);
    let keys = load.prepare_replays(on.addr, 256).await;
    let concurrency = 16.min(*plan.concurrency.last().unwrap());
    let floor = replay_floor(plan, &load, concurrency, &on, keys).await;
    println!(
        "{:<8} c={:<3} replay {:>7.0}/s p50 {:>6.2} p99 {:>6.2} ms | healthz {:>7.0}/s p50 {:>6.2} p99 {:>6.2} ms | replay / HTTP floor {:.2} p50 {:.2}",
        backend.name(),
        floor.concurrency,
        floor.replay.rps,
        floor.replay.p50_ms,
        floor.replay.p99_ms,
        floor.healthz.rps,
        floor.healthz.p50_ms,
        floor.healthz.p99_ms,
        floor.throughput_ratio,
        floor.p50_ratio
    );
    let _ = on.stop.send(());
    on.db.close().await;
    Ok(())
}

//! One backend's run: every measurement in turn, and the targets checked against them.

use std::{collections::BTreeMap, sync::Arc};

use platform::Backend;
use tokio::runtime::Runtime;

use crate::{
    creates::{IDLE_CONNECTIONS, compare_creates, direct_creates, floor_creates, idle_connections},
    db::{count_tickets_titled, fresh_db, seeded_db},
    load::{Load, median, median_figure},
    other_writes::other_writes,
    plan::Plan,
    replays::replay_floor,
    report::{BackendReport, DbOnly, Machine, ReplayComparison, Storm, TableSize, TargetCheck},
    service::{config, start_service},
    wal::wal_per_create,
};

pub async fn bench_backend(backend: Backend, plan: &Plan, services: Arc<Runtime>) -> Result<BackendReport, String> {
    if backend == Backend::Postgres && !platform::testing::backend_available(Backend::Postgres).await {
        return Err("PostgreSQL is unreachable; set TEST_DATABASE_URL or pass --backend sqlite".into());
    }
    let on = start_service(&services, fresh_db(backend, "on").await, config(true));
    let off = start_service(&services, fresh_db(backend, "off").await, config(false));
    let load = Load::new(plan.run);

    // 1. Idempotent create vs the same create with the layer off.
    let create = compare_creates(plan, &load, &on, &off).await;

    // 2. Replays vs creates, on the same service.
    let concurrency = 16.min(*plan.concurrency.last().unwrap());
    eprintln!("replay vs create, {concurrency} clients");
    let keys = load.prepare_replays(on.addr, 256).await;
    let (replays, creates) = load
        .side_by_side(
            plan.rounds,
            concurrency,
            &load.replays(on.addr, keys.clone()),
            &load.creates(on.addr, "vs-replay"),
        )
        .await;
    let (replay_figure, create_figure) = (median_figure(&replays), median_figure(&creates));
    let replay = ReplayComparison {
        concurrency,
        replay: replay_figure,
        create: create_figure,
        throughput_ratio: replay_figure.rps / create_figure.rps,
        p50_ratio: replay_figure.p50_ms / create_figure.p50_ms,
    };
    // and against the least a request to the same service costs
    let replay_floor = replay_floor(plan, &load, concurrency, &on, keys).await;

    // 3. Same-key storms: exactly one effect each, every request answered.
    eprintln!("{} storms of {} copies", plan.storms, plan.storm_copies);
    let mut effects_per_storm = Vec::new();
    let mut statuses = BTreeMap::new();
    let mut storm_samples = Vec::new();
    for storm in 0..plan.storms {
        let title = format!("storm {} {storm}", std::process::id());
        let (sample, answers) = load.storm(on.addr, plan.storm_copies, &title).await;
        for status in answers {
            *statuses.entry(status).or_insert(0) += 1;
        }
        effects_per_storm.push(count_tickets_titled(&on.db, &title).await);
        storm_samples.push(sample);
    }
    let (storm_p50, storm_p99) = (
        median(storm_samples.iter().map(|s| s.p50_ms)),
        median(storm_samples.iter().map(|s| s.p99_ms)),
    );
    let storm = Storm {
        copies: plan.storm_copies,
        storms: plan.storms,
        effects_per_storm,
        statuses,
        p50_ms: storm_p50,
        p99_ms: storm_p99,
        p99_over_p50: storm_p99 / storm_p50,
    };

    // 4. The service's own create with no HTTP: how much of the time is HTTP.
    eprintln!("database path without HTTP, {concurrency} clients");
    let (direct_on, direct_off) = load
        .side_by_side(
            plan.rounds,
            concurrency,
            &direct_creates(on.app.clone()),
            &direct_creates(off.app.clone()),
        )
        .await;
    let (direct_on, direct_off) = (median_figure(&direct_on), median_figure(&direct_off));
    eprintln!("the least a claim can cost, without HTTP, {concurrency} clients");
    let (floor, floor_off) = load
        .side_by_side(
            plan.rounds,
            concurrency,
            &floor_creates(off.db.clone()).await,
            &direct_creates(off.app.clone()),
        )
        .await;
    let (floor, floor_off) = (median_figure(&floor), median_figure(&floor_off));
    let http_on = create
        .iter()
        .find(|c| c.concurrency == concurrency)
        .map(|c| c.on)
        .unwrap_or(create_figure);
    let db_only = DbOnly {
        concurrency,
        on: direct_on,
        off: direct_off,
        throughput_ratio: direct_on.rps / direct_off.rps,
        http_on,
        floor,
        floor_ratio: floor.rps / floor_off.rps,
    };
    eprintln!("what a create writes to the WAL");
    let wal = wal_per_create(&on, &off, plan.quick).await;
    // 5. The other services' writes, at the same concurrency.
    let other_writes = other_writes(backend, plan, &services, &load, concurrency, &on).await;
    eprintln!("create beside {IDLE_CONNECTIONS} idle half-open connections");
    let idle_connections = idle_connections(plan, &load, &on).await;
    let _ = on.stop.send(());
    let _ = off.stop.send(());
    on.db.close().await;
    off.db.close().await;

    // 6. The claim's cost against the size of the operations table.
    eprintln!(
        "table size: {} vs {} stored operations",
        plan.small_table, plan.large_table
    );
    let small = start_service(&services, seeded_db(backend, plan.small_table).await, config(true));
    let large = start_service(&services, seeded_db(backend, plan.large_table).await, config(true));
    let (s, l) = load
        .side_by_side(
            plan.rounds,
            1,
            &load.creates(small.addr, "small"),
            &load.creates(large.addr, "large"),
        )
        .await;
    let (small_figure, large_figure) = (median_figure(&s), median_figure(&l));
    let table_size = TableSize {
        small_operations: plan.small_table,
        large_operations: plan.large_table,
        concurrency: 1,
        small: small_figure,
        large: large_figure,
        p50_ratio: large_figure.p50_ms / small_figure.p50_ms,
    };
    let _ = small.stop.send(());
    let _ = large.stop.send(());

    let mut targets = Vec::new();
    for c in &create {
        targets.push(check(
            &format!("create/off c={}", c.concurrency),
            ">=",
            0.70,
            c.throughput_ratio,
        ));
        targets.push(check(&format!("p50/off c={}", c.concurrency), "<=", 1.40, c.p50_ratio));
    }
    targets.push(check("replay/create", ">=", 3.0, replay.throughput_ratio));
    targets.push(check("replay / HTTP floor", ">=", 0.5, replay_floor.throughput_ratio));
    targets.push(check("storm p99/p50", "<", 5.0, storm.p99_over_p50));
    targets.push(check("p50 large/small", "<=", 1.20, table_size.p50_ratio));
    Ok(BackendReport {
        backend: backend.name().into(),
        create,
        replay,
        replay_floor: Some(replay_floor),
        storm,
        table_size,
        db_only,
        wal: Some(wal),
        other_writes,
        idle_connections: Some(idle_connections),
        targets,
    })
}

/// `--creates-only`: the create comparison alone, printed, with no report written.
pub async fn print_creates(backend: Backend, plan: &Plan, services: Arc<Runtime>) -> Result<(), String> {
    if backend == Backend::Postgres && !platform::testing::backend_available(Backend::Postgres).await {
        return Err("PostgreSQL is unreachable; set TEST_DATABASE_URL or pass --backend sqlite".into());
    }
    let on = start_service(&services, fresh_db(backend, "on").await, config(true));
    let off = start_service(&services, fresh_db(backend, "off").await, config(false));
    for c in compare_creates(plan, &Load::new(plan.run), &on, &off).await {
        println!(
            "{:<8} c={:<3} on {:>7.0}/s p50 {:>6.2} ms | off {:>7.0}/s p50 {:>6.2} ms | throughput {:.2} p50 {:.2}",
            backend.name(),
            c.concurrency,
            c.on.rps,
            c.on.p50_ms,
            c.off.rps,
            c.off.p50_ms,
            c.throughput_ratio,
            c.p50_ratio
        );
    }
    let _ = on.stop.send(());
    let _ = off.stop.send(());
    on.db.close().await;
    off.db.close().await;
    Ok(())
}

pub fn check(name: &str, op: &str, threshold: f64, measured: f64) -> TargetCheck {
    let met = match op {
        ">=" => measured >= threshold,
        "<=" => measured <= threshold,
        _ => measured < threshold,
    };
    TargetCheck {
        name: name.into(),
        target: format!("{op} {threshold:.2}"),
        measured,
        met,
    }
}

pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split(':').nth(1)))
        .map(|m| m.trim().to_owned())
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|r| {
            r.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_owned()))
        })
        .unwrap_or_else(|| std::env::consts::OS.to_owned());
    Machine {
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        cpu_model,
        memory_gib: (memory_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        os,
    }
}

//! `--compare-partitions`: the create on the partitioned schema against the
//! same create on the schema just before it (docs/design.md §13), on
//! PostgreSQL, with today's code on both. The two schemas are two databases
//! on the same server, each with an idempotent service and a layer-off one;
//! the four creates alternate round by round in one run, so the machine's
//! drift falls on every side alike.

use std::sync::Arc;

use platform::{Backend, Db, on_pool};
use tokio::runtime::Runtime;

use crate::{
    cpu::cpu_per_create,
    db::{fresh_db, fresh_db_before},
    load::{Load, Sample, median, median_figure},
    plan::Plan,
    report::Figure,
    service::{Service, config, start_service},
    wal::wal_written,
};

/// The first migration of the change that begins every key with the account
/// and partitions operations, outbox and inbox (0010 to 0013, one per crate).
const PARTITIONED_AT: i64 = 10;

/// How many samples of the WAL a create writes are taken on each side.
const WAL_SAMPLES: usize = 5;

/// How many samples of the CPU a create costs are taken on each side.
const CPU_SAMPLES: usize = 7;

/// One schema's two services: the idempotent create and the layer-off one.
struct Schema {
    name: &'static str,
    on: Service,
    off: Service,
}

pub async fn compare_partitions(plan: &Plan, services: Arc<Runtime>) -> Result<(), String> {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return Err("--compare-partitions needs PostgreSQL; set TEST_DATABASE_URL".into());
    }
    let partitioned = Schema {
        name: "partitioned",
        on: start_service(&services, partitioned_db("partitioned_on").await?, config(true)),
        off: start_service(&services, partitioned_db("partitioned_off").await?, config(false)),
    };
    let unpartitioned = Schema {
        name: "unpartitioned",
        on: start_service(&services, unpartitioned_db("unpartitioned_on").await?, config(true)),
        off: start_service(&services, unpartitioned_db("unpartitioned_off").await?, config(false)),
    };
    let load = Load::new(plan.run);
    for &concurrency in &plan.concurrency {
        eprintln!(
            "partitioned vs unpartitioned, {concurrency} clients, {} rounds",
            plan.rounds
        );
        let workloads = [
            load.creates(partitioned.on.addr, "partitioned-on"),
            load.creates(partitioned.off.addr, "partitioned-off"),
            load.creates(unpartitioned.on.addr, "unpartitioned-on"),
            load.creates(unpartitioned.off.addr, "unpartitioned-off"),
        ];
        let samples = load.alternated(plan.rounds, concurrency, &workloads.each_ref()).await;
        let [p_on, p_off, u_on, u_off] = samples.as_slice() else {
            unreachable!("four workloads, four sample lists")
        };
        print_side("idempotent", concurrency, p_on, u_on);
        print_side("layer off", concurrency, p_off, u_off);
        for (schema, on, off) in [("partitioned", p_on, p_off), ("unpartitioned", u_on, u_off)] {
            let (on, off) = (median_figure(on), median_figure(off));
            println!(
                "c={concurrency:<3} {schema:<13} idempotent / layer off: throughput {:.3} p50 {:.3}",
                on.rps / off.rps,
                on.p50_ms / off.p50_ms
            );
        }
    }
    // a count that does not move with the machine; the server's WAL is
    // shared, and another database's writes (or a checkpoint's full-page
    // images) only ever add to a sample, so the least of several is the truest
    let creates = if plan.quick { 20 } else { 200 };
    for schema in [&partitioned, &unpartitioned] {
        let (mut on, mut off) = (f64::INFINITY, f64::INFINITY);
        for sample in 0..WAL_SAMPLES {
            on = on.min(wal_written(&schema.on, creates, &format!("wal-{}-on-{sample}", schema.name)).await);
            off = off.min(wal_written(&schema.off, creates, &format!("wal-{}-off-{sample}", schema.name)).await);
        }
        println!(
            "WAL per create, {:<13} idempotent {on:>6.0} bytes, layer off {off:>5.0} bytes \
             (the least of {WAL_SAMPLES} samples of {creates} creates)",
            schema.name
        );
    }
    print_cpu(plan, [&partitioned, &unpartitioned]).await;
    for schema in [partitioned, unpartitioned] {
        for service in [schema.on, schema.off] {
            let _ = service.stop.send(());
            service.db.close().await;
        }
    }
    Ok(())
}

/// The CPU one create costs on each side (see [`cpu_per_create`]): samples
/// of creates one after another, the four sides alternated as the load
/// runs are, and the median of each side's samples.
async fn print_cpu(plan: &Plan, [partitioned, unpartitioned]: [&Schema; 2]) {
    let (samples, creates) = if plan.quick { (1, 50) } else { (CPU_SAMPLES, 1000) };
    let sides = [
        (&partitioned.on, "partitioned-on"),
        (&partitioned.off, "partitioned-off"),
        (&unpartitioned.on, "unpartitioned-on"),
        (&unpartitioned.off, "unpartitioned-off"),
    ];
    let mut spent = vec![Vec::new(); sides.len()];
    for sample in 0..samples {
        let mut order: Vec<usize> = (0..sides.len()).collect();
        if sample % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (service, tag) = sides[i];
            let Some(us) = cpu_per_create(service, creates, &format!("cpu-{tag}-{sample}")).await else {
                println!("CPU per create: the kernel's counters cannot be read here");
                return;
            };
            spent[i].push(us);
        }
    }
    let [p_on, p_off, u_on, u_off] = [0, 1, 2, 3].map(|i| median(spent[i].iter().copied()));
    // each sample's partitioned over unpartitioned: how far the noise reaches
    let mut paired: Vec<f64> = spent[0].iter().zip(&spent[2]).map(|(p, u)| p / u).collect();
    paired.sort_by(f64::total_cmp);
    println!(
        "CPU per create (µs, median of {samples} samples of {creates}): idempotent partitioned {p_on:.0}, \
         unpartitioned {u_on:.0}, partitioned / unpartitioned {:.3} (samples {:.2}–{:.2}); layer off \
         partitioned {p_off:.0}, unpartitioned {u_off:.0}, {:.3}; the layer's own: partitioned {:.0}, \
         unpartitioned {:.0}",
        p_on / u_on,
        paired[0],
        paired[paired.len() - 1],
        p_off / u_off,
        p_on - p_off,
        u_on - u_off
    );
}

/// Prints one create (idempotent or layer off) on both schemas, and the
/// partitioned over the unpartitioned: of the medians, as every comparison of
/// the harness is made, and of each round's two runs (neighbours in time),
/// the median and the range, which show how far the noise reaches.
fn print_side(side: &str, concurrency: usize, partitioned: &[Sample], unpartitioned: &[Sample]) {
    let (p, u): (Figure, Figure) = (median_figure(partitioned), median_figure(unpartitioned));
    let mut rounds: Vec<f64> = partitioned
        .iter()
        .zip(unpartitioned)
        .map(|(p, u)| p.rps / u.rps)
        .collect();
    rounds.sort_by(f64::total_cmp);
    println!(
        "c={concurrency:<3} {side:<10} partitioned {:>6.0}/s p50 {:>6.2} ms | unpartitioned {:>6.0}/s p50 {:>6.2} ms | \
         partitioned / unpartitioned: throughput {:.3} (rounds: median {:.3}, {:.2}–{:.2}) p50 {:.3}",
        p.rps,
        p.p50_ms,
        u.rps,
        u.p50_ms,
        p.rps / u.rps,
        rounds[rounds.len() / 2],
        rounds[0],
        rounds[rounds.len() - 1],
        p.p50_ms / u.p50_ms
    );
}

/// A database with every migration: the tables partitioned.
async fn partitioned_db(name: &str) -> Result<Db, String> {
    let db = fresh_db(Backend::Postgres, name).await;
    expect_shape(&db, true).await?;
    Ok(db)
}

/// A database migrated up to the partitions and no further.
async fn unpartitioned_db(name: &str) -> Result<Db, String> {
    let db = fresh_db_before(Backend::Postgres, name, PARTITIONED_AT).await;
    expect_shape(&db, false).await?;
    Ok(db)
}

/// Checks that the operations table is partitioned, or not, as the comparison says.
async fn expect_shape(db: &Db, partitioned: bool) -> Result<(), String> {
    let kind: String = on_pool!(db.read(), |pool| sqlx::query_scalar(
        "SELECT relkind::text FROM pg_class WHERE relname = 'idempotency_operations'"
    )
    .fetch_one(pool)
    .await
    .map_err(|e| e.to_string())?);
    match (kind.as_str(), partitioned) {
        ("p", true) | ("r", false) => Ok(()),
        _ => Err(format!(
            "idempotency_operations has relkind {kind}, where the comparison needs it {}partitioned",
            if partitioned { "" } else { "not " }
        )),
    }
}

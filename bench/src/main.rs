//! The benchmark harness: the idempotent write path measured against its
//! performance targets, over real HTTP on loopback, on SQLite
//! and on PostgreSQL.
//!
//! ```sh
//! cargo run --release -p bench                 # the full run (minutes); writes bench/results/
//! cargo run --release -p bench -- --quick      # a smoke run (seconds): proves the harness works
//! cargo run --release -p bench -- --compare-partitions   # PostgreSQL: the partitioned schema against the one before
//! cargo run --release -p bench -- --replay-floor         # replays against GET /healthz alone, printed
//! ```
//!
//! Every comparison is measured side by side in the same run, alternating the
//! two sides round by round, and every figure is the median of the rounds:
//! these machines are noisy, so the ratios are the result, not the times.

mod chart;
mod cpu;
mod creates;
mod db;
mod load;
mod other_writes;
mod partitions;
mod plan;
mod replays;
mod report;
mod run;
mod service;
mod table;
mod wal;

use std::sync::Arc;

use crate::{
    partitions::compare_partitions,
    plan::parse_args,
    replays::print_replay_floor,
    report::Report,
    run::{bench_backend, machine, print_creates},
    table::print_table,
};

/// The body of every ticket create the benchmark sends.
const BODY: &str = r#"{"project":"ops","title":"Rotate staging certificate","priority":"high"}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    // The services run on a runtime of their own, as they would in their own
    // process; the load generator runs on another. Both share the machine's cores.
    // named apart, so a profile tells the service's threads from the load's
    let services = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("services")
        .enable_all()
        .build()?;
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("clients")
        .enable_all()
        .build()?;
    let services = Arc::new(services);

    if args.plan.compare_partitions {
        eprintln!("== postgres: partitioned vs unpartitioned ==");
        clients.block_on(compare_partitions(&args.plan, services.clone()))?;
        return Ok(());
    }
    if args.plan.creates_only {
        for backend in &args.backends {
            eprintln!("== {} ==", backend.name());
            clients.block_on(print_creates(*backend, &args.plan, services.clone()))?;
        }
        return Ok(());
    }
    if args.plan.replay_floor_only {
        for backend in &args.backends {
            eprintln!("== {} ==", backend.name());
            clients.block_on(print_replay_floor(*backend, &args.plan, services.clone()))?;
        }
        return Ok(());
    }
    let mut backends = Vec::new();
    let mut broken = Vec::new();
    for backend in &args.backends {
        eprintln!("== {} ==", backend.name());
        let report = clients.block_on(bench_backend(*backend, &args.plan, services.clone()))?;
        for storm_effects in &report.storm.effects_per_storm {
            if *storm_effects != 1 {
                broken.push(format!(
                    "{}: a storm made {storm_effects} tickets instead of 1",
                    backend.name()
                ));
            }
        }
        backends.push(report);
    }

    let report = Report {
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        machine: machine(),
        quick: args.plan.quick,
        backends,
    };
    print_table(&report);
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("report.json"), serde_json::to_string_pretty(&report)?)?;
    std::fs::write(args.out.join("report.svg"), chart::render_svg(&report)?)?;
    eprintln!("wrote {}/report.json and report.svg", args.out.display());
    if !broken.is_empty() {
        return Err(broken.join("; ").into());
    }
    Ok(())
}

//! The report printed as a table, for the terminal.

use crate::report::{Figure, Report};

pub fn print_table(report: &Report) {
    println!();
    println!(
        "Retrysafe benchmark, {} — {} cpus, {}, {} GiB{}",
        report.date,
        report.machine.cpus,
        report.machine.cpu_model,
        report.machine.memory_gib,
        if report.quick {
            " (quick run: the numbers mean nothing)"
        } else {
            ""
        }
    );
    for b in &report.backends {
        println!();
        println!("{}", b.backend);
        println!("  {:<34} {:>10} {:>10} {:>10}", "", "req/s", "p50 ms", "p99 ms");
        let row =
            |name: String, f: &Figure| println!("  {name:<34} {:>10.0} {:>10.2} {:>10.2}", f.rps, f.p50_ms, f.p99_ms);
        for c in &b.create {
            row(format!("create, idempotent, c={}", c.concurrency), &c.on);
            row(format!("create, layer off,  c={}", c.concurrency), &c.off);
        }
        // what a newcomer feels: one request waited for, in the unit it is felt in
        if let Some(one) = b.create.iter().find(|c| c.concurrency == 1) {
            println!(
                "  one create at one client, p50: idempotent {:.0} µs, layer off {:.0} µs",
                one.on.p50_ms * 1000.0,
                one.off.p50_ms * 1000.0
            );
        }
        row(format!("replay, c={}", b.replay.concurrency), &b.replay.replay);
        row(
            format!("create (beside replay), c={}", b.replay.concurrency),
            &b.replay.create,
        );
        if let Some(floor) = &b.replay_floor {
            row(format!("replay, c={}", floor.concurrency), &floor.replay);
            row(
                format!("GET /healthz (beside replay), c={}", floor.concurrency),
                &floor.healthz,
            );
            println!(
                "  {:<34} {:>10.2} {:>10.2}",
                "  replay / HTTP floor (thr., p50)", floor.throughput_ratio, floor.p50_ratio
            );
        }
        row(
            format!("create, {} ops stored, c=1", b.table_size.small_operations),
            &b.table_size.small,
        );
        row(
            format!("create, {} ops stored, c=1", b.table_size.large_operations),
            &b.table_size.large,
        );
        row(
            format!("no HTTP: create, idempotent, c={}", b.db_only.concurrency),
            &b.db_only.on,
        );
        row(
            format!("no HTTP: create, layer off,  c={}", b.db_only.concurrency),
            &b.db_only.off,
        );
        row(
            format!("no HTTP: off + bare key claim, c={}", b.db_only.concurrency),
            &b.db_only.floor,
        );
        println!(
            "  without HTTP, over the layer off: idempotent {:.2}, off + bare key claim {:.2}",
            b.db_only.throughput_ratio, b.db_only.floor_ratio
        );
        if let Some(wal) = &b.wal {
            println!(
                "  WAL per create ({} sequential): idempotent {:.1} {}, layer off {:.1}, ratio {:.2}",
                wal.creates, wal.on, wal.unit, wal.off, wal.ratio
            );
        }
        for w in &b.other_writes {
            row(format!("{}, c={}", w.name, w.concurrency), &w.write);
            row(format!("  beside: {}", w.baseline_name), &w.baseline);
            println!(
                "  {:<34} {:>10.2} {:>10.2}",
                "  ratio (throughput, p50)", w.throughput_ratio, w.p50_ratio
            );
        }
        if let Some(idle) = &b.idle_connections {
            row("create, c=1".into(), &idle.unloaded);
            row(format!("  beside {} idle half-open", idle.held), &idle.loaded);
            println!("  {:<34} {:>10} {:>10.2}", "  p50 ratio", "", idle.p50_ratio);
        }
        println!(
            "  storm: {} × {} copies, tickets per storm {:?}, answers {:?}, p50 {:.2} ms, p99 {:.2} ms",
            b.storm.storms, b.storm.copies, b.storm.effects_per_storm, b.storm.statuses, b.storm.p50_ms, b.storm.p99_ms
        );
        println!("  targets:");
        for t in &b.targets {
            println!(
                "    {:<20} {:>8.2}  {:<8} {}",
                t.name,
                t.measured,
                t.target,
                if t.met { "met" } else { "MISSED" }
            );
        }
    }
}

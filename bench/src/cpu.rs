//! The CPU time one create costs the machine, from the kernel's run-time
//! counters (Linux's `schedstat`, in nanoseconds): this process's threads
//! (the service, its background work, the caller) and the PostgreSQL
//! backends connected to the service's database. A load that shares the
//! machine slows each create down but costs it little more CPU, so this
//! moves far less with the machine than a throughput does.

use std::collections::BTreeMap;

use platform::{Db, Pool};

use crate::{creates::create_directly, service::Service};

/// Microseconds of CPU per create, over `creates` creates one after
/// another; `None` where the counters cannot be read (not Linux, or the
/// database on another host).
pub async fn cpu_per_create(service: &Service, creates: u64, tag: &str) -> Option<f64> {
    let idempotency = &service.app.idempotency;
    idempotency.flush_journal().await;
    let before = cpu_now(&service.db).await?;
    for n in 0..creates {
        assert!(
            create_directly(&service.app, &format!("{tag}-{}-{n}", std::process::id())).await,
            "a create failed while measuring its CPU"
        );
    }
    // the journal's round for these creates is part of what they cost
    idempotency.flush_journal().await;
    let after = cpu_now(&service.db).await?;
    // a thread or backend that ended meanwhile is left out; one that began counts from zero
    let spent: u64 = after
        .iter()
        .map(|(id, ns)| ns.saturating_sub(before.get(id).copied().unwrap_or(0)))
        .sum();
    Some(spent as f64 / 1000.0 / creates as f64)
}

/// Nanoseconds run so far by each of this process's threads and each
/// backend of the service's database, keyed by thread or process id.
async fn cpu_now(db: &Db) -> Option<BTreeMap<(bool, u32), u64>> {
    let backends: Vec<i32> = match db.write() {
        Pool::Postgres(pool) => {
            sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
                .fetch_all(pool)
                .await
                .ok()?
        }
        Pool::Sqlite(_) => Vec::new(),
    };
    let mut spent = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let tid: u32 = task.ok()?.file_name().to_str()?.parse().ok()?;
        if let Some(ns) = run_time(&format!("/proc/self/task/{tid}/schedstat")) {
            spent.insert((false, tid), ns);
        }
    }
    for pid in backends {
        // a backend is one thread: its process's counter is all of it
        spent.insert((true, pid as u32), run_time(&format!("/proc/{pid}/schedstat"))?);
    }
    Some(spent)
}

/// The first field of a `schedstat`: nanoseconds spent on a CPU.
fn run_time(path: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

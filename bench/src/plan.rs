//! The plan of a run (how long, how often, at which concurrency) and the
//! command line that chooses it.

use std::{path::PathBuf, time::Duration};

use platform::Backend;

/// How long and how often: the full run, or a smoke run that only proves the harness works.
#[derive(Debug, Clone)]
pub struct Plan {
    pub quick: bool,
    pub run: Duration,
    pub rounds: usize,
    pub concurrency: Vec<usize>,
    pub storm_copies: usize,
    pub storms: usize,
    pub small_table: u64,
    pub large_table: u64,
    /// Only the idempotent-vs-off create comparison, printed: for iterating on the hot path.
    pub creates_only: bool,
    /// Only the replays against `GET /healthz`, printed (`--replay-floor`).
    pub replay_floor_only: bool,
    /// Only the creates on the partitioned schema against the schema before
    /// it, on PostgreSQL, printed (`--compare-partitions`).
    pub compare_partitions: bool,
}

impl Plan {
    pub fn full() -> Self {
        Plan {
            quick: false,
            run: Duration::from_secs(3),
            rounds: 5,
            concurrency: vec![1, 16, 64],
            storm_copies: 200,
            storms: 5,
            small_table: 10_000,
            large_table: 10_000_000,
            creates_only: false,
            replay_floor_only: false,
            compare_partitions: false,
        }
    }

    pub fn quick() -> Self {
        Plan {
            quick: true,
            run: Duration::from_millis(250),
            rounds: 1,
            concurrency: vec![1, 16],
            storm_copies: 50,
            storms: 1,
            small_table: 1_000,
            large_table: 10_000,
            creates_only: false,
            replay_floor_only: false,
            compare_partitions: false,
        }
    }
}

pub struct Args {
    pub plan: Plan,
    pub backends: Vec<Backend>,
    pub out: PathBuf,
}

pub fn parse_args() -> Result<Args, String> {
    // `--quick` chooses the plan; the other flags adjust it, wherever they stand
    let mut plan = if std::env::args().any(|arg| arg == "--quick") {
        Plan::quick()
    } else {
        Plan::full()
    };
    let mut backends = vec![Backend::Sqlite, Backend::Postgres];
    let mut out = PathBuf::from("bench/results");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => {}
            "--creates-only" => plan.creates_only = true,
            "--compare-partitions" => plan.compare_partitions = true,
            "--replay-floor" => plan.replay_floor_only = true,
            "--rounds" => {
                plan.rounds = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--rounds takes a number of rounds, at least one")?
            }
            "--clients" => {
                plan.concurrency = args
                    .next()
                    .and_then(|list| list.split(',').map(|n| n.trim().parse().ok()).collect())
                    .ok_or("--clients takes a comma-separated list of client counts")?
            }
            "--backend" => {
                backends = match args.next().as_deref() {
                    Some("sqlite") => vec![Backend::Sqlite],
                    Some("postgres") => vec![Backend::Postgres],
                    Some("both") => vec![Backend::Sqlite, Backend::Postgres],
                    other => return Err(format!("--backend takes sqlite, postgres or both, not {other:?}")),
                }
            }
            "--out" => out = args.next().map(PathBuf::from).ok_or("--out takes a directory")?,
            "--large" => {
                plan.large_table = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--large takes a number of operations")?
            }
            "--seconds" => {
                let seconds: f64 = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--seconds takes a number")?;
                plan.run = Duration::from_secs_f64(seconds);
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}`; usage: bench [--quick] [--backend sqlite|postgres|both] [--out DIR] \
                     [--large OPERATIONS] [--seconds PER_RUN] [--clients 1,16,64] [--rounds N] [--creates-only | --compare-partitions | --replay-floor]"
                ));
            }
        }
    }
    Ok(Args { plan, backends, out })
}

//! What a benchmark run found: every figure, every comparison, every target.
//! Written as JSON, printed as a table, drawn as a chart.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// UTC, RFC 3339.
    pub date: String,
    pub machine: Machine,
    /// A smoke run (`--quick`): too short for its numbers to mean anything.
    pub quick: bool,
    pub backends: Vec<BackendReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub os: String,
}

/// One load measurement: the median over `runs` runs of each number.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Figure {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub runs: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackendReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Idempotent create vs the same create with the idempotency layer off.
    pub create: Vec<CreateComparison>,
    pub replay: ReplayComparison,
    /// Replays against `GET /healthz` on the same service.
    #[serde(default)]
    pub replay_floor: Option<ReplayFloor>,
    pub storm: Storm,
    pub table_size: TableSize,
    pub db_only: DbOnly,
    /// What one create writes to the write-ahead log, idempotent and layer off.
    #[serde(default)]
    pub wal: Option<WalPerCreate>,
    /// The other services' write paths, beside the tickets create.
    #[serde(default)]
    pub other_writes: Vec<OtherWrite>,
    /// The create while idle half-open connections are held, beside none.
    #[serde(default)]
    pub idle_connections: Option<IdleConnections>,
    pub targets: Vec<TargetCheck>,
}

/// What idle half-open connections (headers begun, never finished) cost a
/// client with a complete request: its create, one client, with `held` of
/// them open and with none, alternated round by round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdleConnections {
    pub held: usize,
    pub unloaded: Figure,
    pub loaded: Figure,
    /// loaded.p50 / unloaded.p50
    pub p50_ratio: f64,
}

/// Another service's write, measured against a baseline side by side: a
/// payment intent against itself with the layer off; a deployment (its claim,
/// its record and its outbox event in one transaction) against the tickets
/// create, to show what the outbox adds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OtherWrite {
    pub name: String,
    pub baseline_name: String,
    pub concurrency: usize,
    pub write: Figure,
    pub baseline: Figure,
    /// write.rps / baseline.rps
    pub throughput_ratio: f64,
    /// write.p50 / baseline.p50
    pub p50_ratio: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateComparison {
    pub concurrency: usize,
    pub on: Figure,
    pub off: Figure,
    /// on.rps / off.rps
    pub throughput_ratio: f64,
    /// on.p50 / off.p50
    pub p50_ratio: f64,
    /// on.p99 / off.p99
    pub p99_ratio: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayComparison {
    pub concurrency: usize,
    pub replay: Figure,
    pub create: Figure,
    /// replay.rps / create.rps
    pub throughput_ratio: f64,
    /// replay.p50 / create.p50
    pub p50_ratio: f64,
}

/// What a replay costs over the least any request to the service costs:
/// replays against `GET /healthz` (no key, no body, no account), both over
/// HTTP on the same service, alternated round by round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayFloor {
    pub concurrency: usize,
    pub replay: Figure,
    pub healthz: Figure,
    /// replay.rps / healthz.rps
    pub throughput_ratio: f64,
    /// replay.p50 / healthz.p50
    pub p50_ratio: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Storm {
    /// Requests fired at once with one key and one body, per storm.
    pub copies: usize,
    pub storms: usize,
    /// Tickets made per storm (asserted to be 1 each).
    pub effects_per_storm: Vec<i64>,
    /// Every request got an answer; by status, over all storms.
    pub statuses: BTreeMap<u16, usize>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p99_over_p50: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableSize {
    pub small_operations: u64,
    pub large_operations: u64,
    pub concurrency: usize,
    pub small: Figure,
    pub large: Figure,
    /// large.p50 / small.p50
    pub p50_ratio: f64,
}

/// The service's own idempotent create (`tickets::create`) in a loop, with no HTTP.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DbOnly {
    pub concurrency: usize,
    pub on: Figure,
    pub off: Figure,
    pub throughput_ratio: f64,
    /// The HTTP create at the same concurrency, for comparison.
    pub http_on: Figure,
    /// The layer-off create plus a bare insert of its key in the same
    /// transaction: the least any claim that keeps §3 can cost.
    pub floor: Figure,
    /// `floor` over the layer-off create, measured side by side with it.
    pub floor_ratio: f64,
}

/// What one create writes to the database's write-ahead log: a count, not a
/// time, so it does not move with the machine's noise. On SQLite it is WAL
/// frames, one whole page each for every page a transaction changed, written
/// at its commit; on PostgreSQL, bytes of WAL records (the journal's chain
/// round included).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WalPerCreate {
    /// `pages` (SQLite) or `bytes` (PostgreSQL).
    pub unit: String,
    /// Sequential creates measured, per side and per sample.
    pub creates: u64,
    pub on: f64,
    pub off: f64,
    /// on / off
    pub ratio: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetCheck {
    pub name: String,
    /// e.g. `>= 0.70`
    pub target: String,
    pub measured: f64,
    pub met: bool,
}

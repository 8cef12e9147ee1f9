//! The benchmark harness: the idempotent write path measured against its
//! performance targets, over real HTTP on loopback, on SQLite
//! and on PostgreSQL.
//!
//! ```sh
//! cargo run --release -p bench                 # the full run (minutes); writes bench/results/
//! cargo run --release -p bench -- --quick      # a smoke run (seconds): proves the harness works
//! ```
//!
//! Every comparison is measured side by side in the same run, alternating the
//! two sides round by round, and every figure is the median of the rounds:
//! these machines are noisy, so the ratios are the result, not the times.

mod chart;
mod load;
mod report;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use idempotency::{ClaimMode, IdempotencyConfig, IdempotencyHeaders, IdempotencyKey};
use platform::{Backend, Db, Principal, Role, Timestamp, on_pool};
use report::{
    BackendReport, CreateComparison, DbOnly, Figure, IdleConnections, Machine, OtherWrite, ReplayComparison, Report,
    Storm, TableSize, TargetCheck, WalPerCreate,
};
use tickets::{App, domain::CreateTicket};
use tokio::runtime::Runtime;

use crate::load::{Load, Sample, Workload, median_figure};

const BODY: &str = r#"{"project":"ops","title":"Rotate staging certificate","priority":"high"}"#;

/// How long and how often: the full run, or a smoke run that only proves the harness works.
#[derive(Debug, Clone)]
struct Plan {
    quick: bool,
    run: Duration,
    rounds: usize,
    concurrency: Vec<usize>,
    storm_copies: usize,
    storms: usize,
    small_table: u64,
    large_table: u64,
    /// Only the idempotent-vs-off create comparison, printed: for iterating on the hot path.
    creates_only: bool,
}

impl Plan {
    fn full() -> Self {
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
        }
    }

    fn quick() -> Self {
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
        }
    }
}

struct Args {
    plan: Plan,
    backends: Vec<Backend>,
    out: PathBuf,
}

fn parse_args() -> Result<Args, String> {
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
                     [--large OPERATIONS] [--seconds PER_RUN] [--clients 1,16,64] [--creates-only]"
                ));
            }
        }
    }
    Ok(Args { plan, backends, out })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    // The services run on a runtime of their own, as they would in their own
    // process; the load generator runs on another. Both share the machine's cores.
    let services = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let services = Arc::new(services);

    if args.plan.creates_only {
        for backend in &args.backends {
            eprintln!("== {} ==", backend.name());
            clients.block_on(print_creates(*backend, &args.plan, services.clone()))?;
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

/// A tickets service serving on loopback, and its database.
struct Service {
    addr: std::net::SocketAddr,
    app: App,
    db: Db,
    stop: tokio::sync::oneshot::Sender<()>,
}

fn start_service(services: &Runtime, db: Db, config: IdempotencyConfig) -> Service {
    let app = App::new(db.clone(), config, true);
    let (addr, stop) = serve_router(services, tickets::build_router(app.clone()), &app.idempotency);
    Service { addr, app, db, stop }
}

/// A service's router on loopback, with its idempotency layer's background
/// work running beside it as in the service's own process (the journal's
/// chainer, the attempt writer, the reaper): its address, and what stops it.
fn serve_router(
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
fn free_listener() -> std::net::TcpListener {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.set_nonblocking(true).expect("a non-blocking listener");
    listener
}

/// Opens a fresh database `name` for `backend` (dropped and made anew).
/// A new, empty tickets database.
async fn fresh_db(backend: Backend, name: &str) -> Db {
    let db = empty_db(backend, name).await;
    tickets::migrate(&db).await.expect("migrations apply");
    db
}

/// A new database with no tables yet, for any service's migrations.
async fn empty_db(backend: Backend, name: &str) -> Db {
    Db::connect(&database_url(backend, name, true).await, 16)
        .await
        .expect("a benchmark database")
}

async fn database_url(backend: Backend, name: &str, fresh: bool) -> String {
    match backend {
        Backend::Sqlite => {
            let dir = Path::new("target/bench-data");
            std::fs::create_dir_all(dir).unwrap();
            let file = dir.join(format!("{name}.db"));
            if fresh {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
                }
            }
            format!("sqlite://{}", file.display())
        }
        Backend::Postgres => {
            let admin = platform::testing::postgres_admin_url();
            let database = format!("rsbench_{name}");
            if fresh {
                let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
                    .await
                    .expect("PostgreSQL");
                let drop = format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)");
                sqlx::query(sqlx::AssertSqlSafe(drop))
                    .execute(&mut connection)
                    .await
                    .unwrap();
            }
            let (server, _) = admin.rsplit_once('/').unwrap_or((&admin, ""));
            format!("{server}/{database}")
        }
    }
}

fn config(enabled: bool) -> IdempotencyConfig {
    IdempotencyConfig {
        claim: ClaimMode::InTransaction,
        enabled,
        ..IdempotencyConfig::default()
    }
}

async fn bench_backend(backend: Backend, plan: &Plan, services: Arc<Runtime>) -> Result<BackendReport, String> {
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
            &load.replays(on.addr, keys),
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
    targets.push(check("storm p99/p50", "<", 5.0, storm.p99_over_p50));
    targets.push(check("p50 large/small", "<=", 1.20, table_size.p50_ratio));
    Ok(BackendReport {
        backend: backend.name().into(),
        create,
        replay,
        storm,
        table_size,
        db_only,
        wal: Some(wal),
        other_writes,
        idle_connections: Some(idle_connections),
        targets,
    })
}

/// How many idle half-open connections the create is measured beside.
const IDLE_CONNECTIONS: usize = 500;

/// The create at one client, alone and while [`IDLE_CONNECTIONS`] clients
/// hold half-sent headers, alternated round by round. Each round opens them
/// anew: the server closes them when their headers are late.
async fn idle_connections(plan: &Plan, load: &Load, service: &Service) -> IdleConnections {
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
async fn hold_half_open(addr: std::net::SocketAddr, count: usize) -> Vec<tokio::net::TcpStream> {
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
async fn compare_creates(plan: &Plan, load: &Load, on: &Service, off: &Service) -> Vec<CreateComparison> {
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

/// `--creates-only`: the create comparison alone, printed, with no report written.
async fn print_creates(backend: Backend, plan: &Plan, services: Arc<Runtime>) -> Result<(), String> {
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

/// A payment intent, idempotent vs layer off; a deployment (claim, record and
/// outbox event in one transaction; nothing delivers the events here) vs the
/// tickets create.
async fn other_writes(
    backend: Backend,
    plan: &Plan,
    services: &Runtime,
    load: &Load,
    concurrency: usize,
    tickets: &Service,
) -> Vec<OtherWrite> {
    fn intent(n: u64) -> String {
        format!(
            r#"{{"order_id":"order-{n}","amount":"12.50","currency":"EUR","payee":{{"name":"Acme","account":"DE89370400440532013000"}}}}"#
        )
    }
    fn deployment(n: u64) -> String {
        format!(
            r#"{{"service":"svc-{n}","environment":"staging","artifact_digest":"sha256:{}"}}"#,
            "a".repeat(64)
        )
    }
    let (pay_on_db, pay_off_db, dep_db) = (
        empty_db(backend, "payments_on").await,
        empty_db(backend, "payments_off").await,
        empty_db(backend, "deployments").await,
    );
    for db in [&pay_on_db, &pay_off_db] {
        payments::migrate(db).await.expect("payments migrations apply");
    }
    deployments::migrate(&dep_db)
        .await
        .expect("deployments migrations apply");
    let (pay_on_app, pay_off_app) = (
        payments::App::new(pay_on_db.clone(), config(true), true, Default::default()),
        payments::App::new(pay_off_db.clone(), config(false), true, Default::default()),
    );
    let dep_app = deployments::App::new(dep_db.clone(), config(true), true, Default::default());
    let (pay_on, stop_on) = serve_router(
        services,
        payments::build_router(pay_on_app.clone()),
        &pay_on_app.idempotency,
    );
    let (pay_off, stop_off) = serve_router(
        services,
        payments::build_router(pay_off_app.clone()),
        &pay_off_app.idempotency,
    );
    let (dep, stop_dep) = serve_router(
        services,
        deployments::build_router(dep_app.clone()),
        &dep_app.idempotency,
    );
    let mut writes = Vec::new();
    eprintln!("payment intents, idempotent vs layer off, {concurrency} clients");
    let (on, off) = load
        .side_by_side(
            plan.rounds,
            concurrency,
            &load.writes(pay_on, "/v1/payment_intents", "pi-on", intent, |r| r.status == 201),
            &load.writes(pay_off, "/v1/payment_intents", "pi-off", intent, |r| r.status == 201),
        )
        .await;
    writes.push(other_write(
        "payment intent, idempotent",
        "payment intent, layer off",
        concurrency,
        &on,
        &off,
    ));
    eprintln!("deployments (with their outbox event) vs ticket creates, {concurrency} clients");
    let (deployed, created) = load
        .side_by_side(
            plan.rounds,
            concurrency,
            &load.writes(dep, "/v1/deployments", "dep", deployment, |r| r.status == 202),
            &load.creates(tickets.addr, "vs-deployments"),
        )
        .await;
    writes.push(other_write(
        "deployment + outbox event",
        "ticket create, idempotent",
        concurrency,
        &deployed,
        &created,
    ));
    for stop in [stop_on, stop_off, stop_dep] {
        let _ = stop.send(());
    }
    for db in [pay_on_db, pay_off_db, dep_db] {
        db.close().await;
    }
    writes
}

fn other_write(
    name: &str,
    baseline_name: &str,
    concurrency: usize,
    write: &[Sample],
    baseline: &[Sample],
) -> OtherWrite {
    let (write, baseline) = (median_figure(write), median_figure(baseline));
    OtherWrite {
        name: name.into(),
        baseline_name: baseline_name.into(),
        concurrency,
        write,
        baseline,
        throughput_ratio: write.rps / baseline.rps,
        p50_ratio: write.p50_ms / baseline.p50_ms,
    }
}

fn check(name: &str, op: &str, threshold: f64, measured: f64) -> TargetCheck {
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

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

async fn count_tickets_titled(db: &Db, title: &str) -> i64 {
    on_pool!(db.read(), |pool| sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM tickets WHERE title = $1"
    )
    .bind(title)
    .fetch_one(pool)
    .await
    .unwrap())
}

/// `tickets::routes::create` called straight, as the handler would call it.
fn direct_creates(app: App) -> Workload {
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
async fn floor_creates(db: Db) -> Workload {
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
async fn create_with_bare_claim(db: &Db, key: &str) -> bool {
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
async fn create_directly(app: &App, key: &str) -> bool {
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

/// What one create writes to the WAL, idempotent and layer off (see
/// [`WalPerCreate`]): the median of three samples of sequential creates.
async fn wal_per_create(on: &Service, off: &Service, quick: bool) -> WalPerCreate {
    let (unit, creates) = match on.db {
        // few enough that SQLite's automatic checkpoint (at 1000 frames) does not restart the log
        Db::Sqlite(_) => ("pages", if quick { 5 } else { 40 }),
        Db::Postgres(_) => ("bytes", if quick { 20 } else { 200 }),
    };
    let mut samples = (Vec::new(), Vec::new());
    for sample in 0..3 {
        samples
            .0
            .push(wal_written(on, creates, &format!("wal-on-{sample}")).await);
        samples
            .1
            .push(wal_written(off, creates, &format!("wal-off-{sample}")).await);
    }
    let (on, off) = (median(samples.0.into_iter()), median(samples.1.into_iter()));
    WalPerCreate {
        unit: unit.into(),
        creates,
        on,
        off,
        ratio: on / off,
    }
}

/// `creates` creates, one after another, and the WAL they wrote per create:
/// SQLite's frames (the log is emptied first), PostgreSQL's bytes (the
/// journal's pending round included; the cluster's WAL is shared, so other
/// databases must be quiet meanwhile).
async fn wal_written(service: &Service, creates: u64, tag: &str) -> f64 {
    let idempotency = &service.app.idempotency;
    idempotency.flush_journal().await;
    let create_all = async {
        for n in 0..creates {
            assert!(
                create_directly(&service.app, &format!("{tag}-{}-{n}", std::process::id())).await,
                "a create failed while measuring the WAL"
            );
        }
        idempotency.flush_journal().await;
    };
    let written = match service.db.write() {
        platform::Pool::Sqlite(pool) => {
            // (busy, frames in the log, frames checkpointed); busy while a
            // reader (the chainer's, say) still reads from the log
            let mut emptied = false;
            for _ in 0..100 {
                let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
                    .fetch_one(pool)
                    .await
                    .unwrap();
                if busy == 0 {
                    emptied = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(emptied, "the WAL could not be emptied: a reader stayed in the way");
            create_all.await;
            let (_, frames, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
                .fetch_one(pool)
                .await
                .unwrap();
            frames as f64
        }
        platform::Pool::Postgres(pool) => {
            let start: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
                .fetch_one(pool)
                .await
                .unwrap();
            create_all.await;
            sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::float8")
                .bind(start)
                .fetch_one(pool)
                .await
                .unwrap()
        }
    };
    written / creates as f64
}

/// A database with `operations` finished operations already stored, made once
/// and kept (seeding ten million rows takes minutes).
async fn seeded_db(backend: Backend, operations: u64) -> Db {
    let name = format!("seeded_{operations}");
    let mut db = Db::connect(&database_url(backend, &name, false).await, 16)
        .await
        .expect("a seeded database");
    if let Err(e) = tickets::migrate(&db).await {
        // seeded under migrations that have changed since: seed it afresh
        println!("the seeded database no longer matches the migrations ({e}); seeding it again");
        db.close().await;
        db = Db::connect(&database_url(backend, &name, true).await, 16)
            .await
            .expect("a seeded database");
        tickets::migrate(&db).await.expect("migrations apply");
    }
    let have: i64 = on_pool!(db.read(), |pool| sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM idempotency_operations WHERE idempotency_key LIKE 'seed-%'"
    )
    .fetch_one(pool)
    .await
    .unwrap());
    let mut next = have as u64 + 1;
    let batch = 500_000;
    while next <= operations {
        let last = (next + batch - 1).min(operations);
        eprintln!("  seeding operations {next}..={last} of {operations}");
        seed(&db, next as i64, last as i64).await;
        next = last + 1;
    }
    db
}

async fn seed(db: &Db, first: i64, last: i64) {
    let now = Timestamp::now();
    match db.write() {
        platform::Pool::Postgres(pool) => {
            sqlx::query(
                "INSERT INTO idempotency_operations (account_id, idempotency_key, operation_id, principal_id, method, \
                 route, fingerprint, state, attempts, response_status, response_content_type, response_body, \
                 created_at, updated_at) \
                 SELECT 'acme', 'seed-' || g, 'op_seed_' || g, 'acme-agent', 'POST', '/v1/tickets', \
                        md5(g::text) || md5((g + 1)::text), 'completed', 1, 201, 'application/json', '\\x7b7d'::bytea, $3, $3 \
                 FROM generate_series($1::bigint, $2::bigint) AS g",
            )
            .bind(first)
            .bind(last)
            .bind(now)
            .execute(pool)
            .await
            .unwrap();
        }
        platform::Pool::Sqlite(pool) => {
            sqlx::query(
                "WITH RECURSIVE g(n) AS (SELECT $1 UNION ALL SELECT n + 1 FROM g WHERE n < $2) \
                 INSERT INTO idempotency_operations (account_id, idempotency_key, operation_id, principal_id, method, \
                 route, fingerprint, state, attempts, response_status, response_content_type, response_body, \
                 created_at, updated_at) \
                 SELECT 'acme', 'seed-' || n, 'op_seed_' || n, 'acme-agent', 'POST', '/v1/tickets', \
                        printf('%064x', n), 'completed', 1, 201, 'application/json', X'7b7d', $3, $3 FROM g",
            )
            .bind(first)
            .bind(last)
            .bind(now)
            .execute(pool)
            .await
            .unwrap();
        }
    }
}

fn machine() -> Machine {
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

fn print_table(report: &Report) {
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
        row(format!("replay, c={}", b.replay.concurrency), &b.replay.replay);
        row(
            format!("create (beside replay), c={}", b.replay.concurrency),
            &b.replay.create,
        );
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

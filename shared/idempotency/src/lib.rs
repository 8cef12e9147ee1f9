//! Idempotent writes for services whose callers retry (docs/contract.md §1–§5).
//!
//! A service hands each POST that creates an effect to [`Idempotency::execute`]
//! with the validated command and a closure doing the business writes. The
//! crate does everything else, once: it parses the key ([`IdempotencyKey`]),
//! computes the [`Fingerprint`], claims the key under the primary key before any
//! effect, runs the closure in a transaction that also completes the
//! operation, and answers duplicates — replay byte for byte, 409 while running,
//! 422 for a changed request. [`routes`] serves the operation status resource;
//! [`reaper`] removes finished operations after the retention period.
//!
//! # How a route is shaped
//!
//! Nothing happens before the claim (docs/contract.md §3): an attempt answered
//! with a replay, a 409 or a 422 has had no effect at all. So every POST
//! handler does, in this order, and nothing else:
//!
//! 1. **parse** the request into a validated command (a 400 claims nothing);
//! 2. **look up, read-only**, what the command or an approver's summary needs
//!    (the intent a capture names, the release a rollback restores) — never a
//!    write, a call to another system or a state change;
//! 3. **[`Idempotency::execute`]** with a closure doing *every* write, in the
//!    transaction it is given. Work for another system goes to the outbox
//!    ([`Effect::with_outbox`]); a call whose answer the effect needs (a
//!    cancel at a controller) is the call-out of
//!    [`Idempotency::execute_calling_out`], made once the claim has committed;
//! 4. **answer** what the crate answers.
//!
//! A POST that needs no key (a cancel) keeps the same order with no claim:
//! whatever it sends out follows a committed record of the request.
//!
//! ```ignore
//! async fn create_ticket(State(app): State<App>, principal: Principal, key: IdempotencyHeaders,
//!                        ApiJson(body): ApiJson<CreateTicketBody>) -> Response {
//!     let command = CreateTicket::from(body);               // validated: nothing claimed on 400
//!     app.idempotency.execute(Attempt::post("/v1/tickets", &principal, key), &command,
//!         async |tx, _| store::create_ticket(tx, &principal, &command).await.map(Ticket::into_effect)).await
//! }
//! ```
//!
//! # Where each part is
//!
//! - [`execute`]: one attempt, from its key to its answer: the two claim
//!   modes, what a taken key means (`execute/verdict.rs`, a pure function),
//!   and how a run ends (`execute/conclude.rs`);
//! - [`store`]: the operations table's statements — claim, complete, read, reap;
//! - [`approval`]: approvals bound to the exact fingerprint;
//! - [`outbox`]: work that leaves the process — the worker, the reconciler,
//!   and the settlement plan both follow (`outbox/plan.rs`);
//! - [`audit`]: the hash-chained journal — its entries, how transitions reach
//!   it, the chainer, and the reading of it;
//! - [`routes`]: the operation status, approvals and audit routes every
//!   service mounts; [`reaper`], [`replay_cache`] and [`attempts`] help from
//!   the side.

pub mod approval;
pub mod attempts;
pub mod audit;
pub mod execute;
mod fail_point;
pub mod fingerprint;
mod gauges;
pub mod key;
pub mod operation;
pub mod outbox;
pub mod reaper;
pub mod replay_cache;
pub mod routes;
pub mod store;

use std::time::Duration;

use platform::{Db, Migrations};

pub use execute::{Attempt, Effect, IDEMPOTENT_REPLAYED, OPERATION_ID};
pub use fingerprint::Fingerprint;
pub use key::{IdempotencyHeaders, IdempotencyKey, OptionalIdempotencyHeaders};
pub use operation::{OperationRecord, OperationState, ResourceRef, StoredResponse};
/// The types this crate's API is written in (`Db`, `Tx`, `Principal`,
/// `ApiError`, `ApiJson`), so that a service needs no other crate of the project.
pub use platform;

/// The operations, approvals and audit journal tables, for both backends.
pub static MIGRATIONS: Migrations = Migrations {
    postgres: sqlx::migrate!("../../migrations/idempotency/postgres"),
    sqlite: sqlx::migrate!("../../migrations/idempotency/sqlite"),
};

/// When a first attempt's claim commits (why, and when each is used:
/// docs/design.md §2, §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    /// The claim, the effect and the stored answer commit in one transaction.
    /// Nothing is ever visible half done, so a crash leaves nothing to take
    /// over; a concurrent duplicate waits on the primary key and gets the
    /// replay. The fastest path, for effects that stay in the database.
    InTransaction,
    /// The claim commits first, holding a lease; the effect and the answer
    /// commit in a second transaction. Duplicates see `request_in_progress`,
    /// and a crashed holder's lease is taken over after it runs out. For work
    /// that outlives a request (approvals, an outbox).
    Leased,
}

/// How claims are made, and how long leases and stored answers last.
#[derive(Debug, Clone)]
pub struct IdempotencyConfig {
    /// When the claim commits; see [`ClaimMode`].
    pub claim: ClaimMode,
    /// How long a claimed operation is held by the attempt running it. When it
    /// runs out (the process died, or is far too slow) the next attempt with
    /// the same key may take the operation over.
    pub lease: Duration,
    /// How long finished operations are kept for replay (at least 24 h by the contract).
    pub retention: Duration,
    /// How often the reaper looks for operations past their retention.
    pub reap_every: Duration,
    /// How many finished answers each process keeps in memory to answer
    /// replays with no query (0: none). See [`replay_cache`].
    pub replay_cache_entries: usize,
    /// How long an approval request waits for a decision, and an approved
    /// operation for the retry that runs it (docs/contract.md §6; 15 minutes).
    pub approval_ttl: Duration,
    /// `false` only to measure what idempotency costs (`RETRYSAFE_IDEMPOTENCY=off`):
    /// the same handler, validation, transaction and effect run with no claim,
    /// no stored answer and no replay. It breaks the contract; never turn it
    /// off for real traffic.
    pub enabled: bool,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            claim: ClaimMode::InTransaction,
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 60 * 60),
            reap_every: Duration::from_secs(60),
            replay_cache_entries: 10_000,
            approval_ttl: Duration::from_secs(15 * 60),
            enabled: true,
        }
    }
}

impl IdempotencyConfig {
    /// `RETRYSAFE_CLAIM` (`transaction` or `leased`), `RETRYSAFE_REPLAY_CACHE` (10000 answers),
    /// `RETRYSAFE_LEASE_SECONDS` (30),
    /// `RETRYSAFE_RETENTION_HOURS` (24), `RETRYSAFE_REAP_EVERY_SECONDS` (60),
    /// `RETRYSAFE_APPROVAL_TTL_SECONDS` (900), `RETRYSAFE_IDEMPOTENCY` (`on`).
    pub fn from_env() -> Result<Self, String> {
        let mut config = IdempotencyConfig::default();
        if let Some(seconds) = number("RETRYSAFE_LEASE_SECONDS")? {
            config.lease = Duration::from_secs_f64(seconds);
        }
        if let Some(hours) = number("RETRYSAFE_RETENTION_HOURS")? {
            config.retention = Duration::from_secs_f64(hours * 3600.0);
        }
        if let Some(seconds) = number("RETRYSAFE_REAP_EVERY_SECONDS")? {
            config.reap_every = Duration::from_secs_f64(seconds);
        }
        if let Some(seconds) = number("RETRYSAFE_APPROVAL_TTL_SECONDS")? {
            config.approval_ttl = Duration::from_secs_f64(seconds);
        }
        if let Some(entries) = number("RETRYSAFE_REPLAY_CACHE")? {
            config.replay_cache_entries = entries as usize;
        }
        match std::env::var("RETRYSAFE_CLAIM").as_deref() {
            Ok("transaction") | Ok("") | Err(_) => {}
            Ok("leased") => config.claim = ClaimMode::Leased,
            Ok(other) => {
                return Err(format!(
                    "RETRYSAFE_CLAIM `{other}` is neither `transaction` nor `leased`"
                ));
            }
        }
        match std::env::var("RETRYSAFE_IDEMPOTENCY").as_deref() {
            Ok("off") => config.enabled = false,
            Ok("on") | Ok("") | Err(_) => {}
            Ok(other) => return Err(format!("RETRYSAFE_IDEMPOTENCY `{other}` is neither `on` nor `off`")),
        }
        Ok(config)
    }
}

pub(crate) fn number(name: &str) -> Result<Option<f64>, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<f64>() {
            Ok(n) if n.is_finite() && n > 0.0 => Ok(Some(n)),
            _ => Err(format!("{name} `{v}` is not a positive number")),
        },
        _ => Ok(None),
    }
}

/// The idempotency layer of one service: its database and its settings.
#[derive(Debug, Clone)]
pub struct Idempotency {
    db: Db,
    config: IdempotencyConfig,
    attempts: attempts::AttemptCounter,
    replay_cache: std::sync::Arc<replay_cache::ReplayCache>,
    journal: audit::Journal,
    /// Wakes this process's outbox worker when an effect wrote an event.
    outbox_wake: std::sync::Arc<tokio::sync::Notify>,
    /// The service's rows for its outbox work, if it has any.
    ledger: Option<std::sync::Arc<dyn outbox::Ledger>>,
    /// The external system that work goes to, as a person's resolution asks it.
    witness: Option<std::sync::Arc<dyn outbox::Witness>>,
    /// The service's metrics registry.
    metrics: platform::metrics::Metrics,
    /// When `/metrics` last read its gauges from the database.
    gauges_read: std::sync::Arc<tokio::sync::Mutex<Option<std::time::Instant>>>,
}

impl Idempotency {
    pub fn new(db: Db, config: IdempotencyConfig) -> Self {
        let lifetime = config.retention.saturating_sub(config.reap_every * 2);
        let replay_cache = replay_cache::ReplayCache::new(config.replay_cache_entries, lifetime);
        Idempotency {
            db,
            config,
            attempts: Default::default(),
            replay_cache: std::sync::Arc::new(replay_cache),
            journal: Default::default(),
            outbox_wake: Default::default(),
            ledger: None,
            witness: None,
            metrics: platform::metrics::Metrics::new("unnamed"),
            gauges_read: Default::default(),
        }
    }

    /// The layer of the service called `service`, which labels its metrics.
    pub fn for_service(mut self, service: &'static str) -> Self {
        self.metrics = platform::metrics::Metrics::new(service);
        self
    }

    /// The service's metrics registry, for its routes' middleware and `/metrics`.
    pub fn metrics(&self) -> &platform::metrics::Metrics {
        &self.metrics
    }

    /// Begins a transaction, counting how long it waited for a connection
    /// (on SQLite a write waits for the one writer).
    pub(crate) async fn begin(&self) -> Result<platform::Tx, sqlx::Error> {
        let started = std::time::Instant::now();
        let tx = self.db.begin().await;
        self.metrics
            .observe(platform::metrics::names::DB_ACQUIRE, &[], started.elapsed());
        tx
    }

    /// The layer of a service whose work leaves the process: `ledger` writes
    /// how each outbox event ended in the service's rows, for the reconciler
    /// and for a person settling an operation by hand alike.
    pub fn with_ledger(mut self, ledger: impl outbox::Ledger) -> Self {
        self.ledger = Some(std::sync::Arc::new(ledger));
        self
    }

    pub(crate) fn ledger(&self) -> Option<std::sync::Arc<dyn outbox::Ledger>> {
        self.ledger.clone()
    }

    /// The layer of a service whose work leaves the process: `witness` is the
    /// external system a person's resolution is checked with (its outbox's
    /// [`Destination`](outbox::Destination), asked as the reconciler asks).
    pub fn with_witness(mut self, witness: impl outbox::Witness) -> Self {
        self.witness = Some(std::sync::Arc::new(witness));
        self
    }

    pub(crate) fn witness(&self) -> Option<std::sync::Arc<dyn outbox::Witness>> {
        self.witness.clone()
    }

    /// Writes attempt counts in the background, shortly after they arrive.
    /// Without it they are written when an operation's status is read.
    pub fn spawn_attempt_writer(&self) -> tokio::task::JoinHandle<()> {
        let (attempts, db) = (self.attempts.clone(), self.db.clone());
        tokio::spawn(async move { attempts.write_continuously(&db).await })
    }

    /// Writes every attempt counted so far. A failure is logged, not
    /// returned: the counts are kept for the next round, and no answer
    /// depends on them.
    pub async fn flush_attempts(&self) {
        if let Err(e) = self.attempts.flush(&self.db).await {
            tracing::warn!(error = %e, "could not write attempt counts; they are kept for the next round");
        }
    }

    /// Links journal events into the hash chain in the background, shortly
    /// after they are recorded (see [`audit::Journal`]). It logs the chain's
    /// head first: the head the service starts from, for operators to pin,
    /// and the one its rounds refuse to go behind.
    pub fn spawn_journal_chainer(&self) -> tokio::task::JoinHandle<()> {
        let (journal, db, metrics) = (self.journal.clone(), self.db.clone(), self.metrics.clone());
        tokio::spawn(async move {
            if let Some(head) = audit::log_head(&db, "at start-up").await {
                journal.remember(head);
            }
            journal.chain_continuously(&db, &metrics).await
        })
    }

    /// Links every journal event recorded or observed so far into the chain,
    /// so a read of the journal shows them. A failure is logged: the events
    /// wait for the next round.
    pub async fn flush_journal(&self) {
        if let Err(e) = self.journal.chain_pending(&self.db, &self.metrics).await {
            audit::log_unlinked(&e);
        }
    }

    /// Starts the layer's background work — the retention reaper (and
    /// approval expiry), the attempt writer, the journal's chainer, the
    /// database clock's measure and the metrics' upkeep — until
    /// [`Background::stop`].
    pub fn spawn_background(&self) -> Background {
        Background {
            idempotency: self.clone(),
            tasks: vec![
                self.spawn_reaper(),
                self.spawn_attempt_writer(),
                self.spawn_journal_chainer(),
                self.spawn_metrics_upkeep(),
                self.spawn_clock_sync(),
            ],
        }
    }

    /// Measures the database's clock again and again: clocks drift apart,
    /// and leases and retention are measured on it (see [`platform::time`]).
    fn spawn_clock_sync(&self) -> tokio::task::JoinHandle<()> {
        const EVERY: Duration = Duration::from_secs(60);
        let db = self.db.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(EVERY).await;
                if let Err(e) = db.sync_clock().await {
                    tracing::warn!(error = %e, "could not read the database's clock; keeping the last offset");
                }
            }
        })
    }

    /// Drains the histograms between scrapes, so that their buffers stay small.
    fn spawn_metrics_upkeep(&self) -> tokio::task::JoinHandle<()> {
        const EVERY: Duration = Duration::from_secs(5);
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(EVERY).await;
                metrics.run_upkeep();
            }
        })
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    pub fn config(&self) -> &IdempotencyConfig {
        &self.config
    }
}

/// The background tasks of one service's idempotency layer.
#[derive(Debug)]
pub struct Background {
    idempotency: Idempotency,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Background {
    /// Adds a task of the service's own (its outbox, say), stopped with the rest.
    pub fn with(mut self, task: tokio::task::JoinHandle<()>) -> Self {
        self.tasks.push(task);
        self
    }

    /// Stops the tasks, then writes what they had not written yet: the
    /// attempt counts and the journal's waiting events. Then it logs the
    /// chain's head, the last entry this process linked included.
    pub async fn stop(self) {
        for task in &self.tasks {
            task.abort();
        }
        self.idempotency.flush_attempts().await;
        self.idempotency.flush_journal().await;
        audit::log_head(&self.idempotency.db, "on shutdown").await;
    }
}

//! One service's layer ([`Idempotency`]), its background work, and the extension point for what
//! an extension shows and keeps beside the write ([`Extension`]; docs/design.md §1).

use std::sync::Arc;

use futures_core::future::BoxFuture;
use platform::{Db, Timestamp, metrics::Metrics};

use crate::{
    attempts,
    config::IdempotencyConfig,
    gate::Gate,
    operation::OperationRecord,
    replay_cache,
    status::{NeedsAPerson, OperationView},
    transitions::Sink,
};

/// The idempotency layer of one service: its database and its settings.
#[derive(Debug, Clone)]
pub struct Idempotency {
    pub(crate) db: Db,
    pub(crate) config: IdempotencyConfig,
    pub(crate) attempts: attempts::AttemptCounter,
    pub(crate) replay_cache: Arc<replay_cache::ReplayCache>,
    pub(crate) transitions: Arc<dyn Sink>,
    /// Wakes what takes handed-on work in this process (the outbox's worker) once an effect commits it.
    pub(crate) work_handed_on: Arc<tokio::sync::Notify>,
    pub(crate) extensions: Arc<Vec<Arc<dyn Extension>>>,
    pub(crate) gate: Option<Arc<dyn Gate>>,
    pub(crate) metrics: Metrics,
    pub(crate) gauges_read: Arc<tokio::sync::Mutex<Option<std::time::Instant>>>,
}

impl Idempotency {
    pub fn new(db: Db, config: IdempotencyConfig) -> Self {
        let lifetime = config.retention.saturating_sub(config.reap_every * 2);
        let replay_cache = replay_cache::ReplayCache::new(config.replay_cache_entries, lifetime, db.outages().clone());
        Idempotency {
            db,
            config,
            attempts: Default::default(),
            replay_cache: Arc::new(replay_cache),
            transitions: Arc::new(crate::transitions::Unrecorded),
            work_handed_on: Default::default(),
            extensions: Default::default(),
            gate: None,
            metrics: Metrics::new("unnamed"),
            gauges_read: Default::default(),
        }
    }

    /// The layer of the service called `service`, which labels its metrics.
    pub fn for_service(mut self, service: &'static str) -> Self {
        self.metrics = Metrics::new(service);
        self
    }

    /// The layer reporting its transitions to `sink` (the journal); without one they are not kept.
    pub fn with_sink(mut self, sink: impl Sink) -> Self {
        self.transitions = Arc::new(sink);
        self
    }

    /// Where an extension reports its own transitions, in the transaction that makes them.
    pub fn transitions(&self) -> &dyn Sink {
        self.transitions.as_ref()
    }

    /// The sink transitions are reported to, if it is a `T`.
    pub fn sink<T: Sink>(&self) -> Option<&T> {
        let sink: &dyn std::any::Any = &*self.transitions;
        sink.downcast_ref()
    }

    /// The layer with `extension` added: its part of every operation's status, its gauges, its work.
    pub fn with_extension(mut self, extension: impl Extension) -> Self {
        Arc::make_mut(&mut self.extensions).push(Arc::new(extension));
        self
    }

    /// The extension that is a `T`, if the service added one: how its routes find their state.
    pub fn extension<T: Extension>(&self) -> Option<&T> {
        self.extensions.iter().find_map(|extension| {
            let extension: &dyn std::any::Any = extension.as_ref();
            extension.downcast_ref()
        })
    }

    pub(crate) fn extensions(&self) -> impl Iterator<Item = &dyn Extension> {
        self.extensions.iter().map(|extension| extension.as_ref())
    }

    /// The layer with `gate` consulted before the effects a route's policy sends to it; an extension too.
    pub fn with_gate(mut self, gate: impl Gate + Extension) -> Self {
        let gate = Arc::new(gate);
        Arc::make_mut(&mut self.extensions).push(gate.clone());
        self.gate = Some(gate);
        self
    }

    pub(crate) fn gate(&self) -> Result<&dyn Gate, platform::ApiError> {
        self.gate.as_deref().ok_or_else(|| {
            platform::ApiError::internal("the route asks for an approval, and the service's layer has no gate")
        })
    }

    /// The service's metrics registry, for its routes' middleware and `/metrics`.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Begins a transaction, timing its wait for a connection (on SQLite, for the one writer).
    pub async fn begin(&self) -> Result<platform::Tx, sqlx::Error> {
        let started = std::time::Instant::now();
        let tx = self.db.begin().await;
        self.metrics
            .observe(platform::metrics::names::DB_ACQUIRE, &[], started.elapsed());
        tx
    }

    /// Writes every attempt counted so far; a failure is logged and the counts kept for the next round.
    pub async fn flush_attempts(&self) {
        if let Err(e) = self.attempts.flush(&self.db).await {
            tracing::warn!(error = %e, "could not write attempt counts; they are kept for the next round");
        }
    }

    /// Makes what was reported until now readable (the journal links it into its chain).
    pub async fn flush_journal(&self) {
        self.transitions.flush(&self.db, &self.metrics).await;
    }

    /// Starts the layer's background work, the sink's and each extension's too, until [`Background::stop`].
    pub fn spawn_background(&self) -> Background {
        let mut tasks = vec![
            self.spawn_reaper(),
            tokio::spawn(self.attempts.clone().write_continuously(self.db.clone())),
            tokio::spawn(self.metrics.clone().run_upkeep_forever()),
            tokio::spawn(self.db.clone().keep_clock_synced()),
        ];
        tasks.extend(
            self.transitions
                .keep(self.db.clone(), self.metrics.clone())
                .map(tokio::spawn),
        );
        tasks.extend(
            self.extensions()
                .filter_map(|extension| extension.keep(self))
                .map(tokio::spawn),
        );
        Background {
            idempotency: self.clone(),
            tasks,
        }
    }

    /// Notified each time an effect that handed work on commits: what takes that work waits on it.
    pub fn work_handed_on(&self) -> Arc<tokio::sync::Notify> {
        self.work_handed_on.clone()
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

    /// Stops the tasks, then writes what they had not: the attempt counts and what the sink holds.
    pub async fn stop(self) {
        for task in &self.tasks {
            task.abort();
        }
        self.idempotency.flush_attempts().await;
        let layer = &self.idempotency;
        layer.transitions.stop(&layer.db, &layer.metrics).await;
    }
}

/// An operation's id after its number in an extension's own order, for a page of them.
pub type OperationNumbered = (i64, String);

/// What an extension adds beside the idempotent write ([`Idempotency::with_extension`]).
pub trait Extension: std::any::Any + std::fmt::Debug + Send + Sync + 'static {
    /// Fills in this extension's part of `view`, the status of `operation`.
    fn describe<'a>(
        &'a self,
        db: &'a Db,
        operation: &'a OperationRecord,
        view: &'a mut OperationView,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// Sets this extension's gauges from the database, at a scrape of `/metrics`.
    fn read_gauges<'a>(
        &'a self,
        db: &'a Db,
        metrics: &'a Metrics,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// A page of the account's operations that need a person, in this extension's numbering; `None` if none.
    fn needing_a_person<'a>(
        &'a self,
        _db: &'a Db,
        _account_id: &'a str,
        _which: NeedsAPerson,
        _after_seq: i64,
        _limit: i64,
    ) -> Option<BoxFuture<'a, Result<Vec<OperationNumbered>, sqlx::Error>>> {
        None
    }

    /// Work kept running with the layer's background tasks, until they stop.
    fn keep(&self, _idempotency: &Idempotency) -> Option<BoxFuture<'static, ()>> {
        None
    }
}

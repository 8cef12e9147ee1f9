//! How claims are made, and how long leases, stored answers and approvals
//! last: the layer's settings, and how they are read from the environment.

use std::time::Duration;

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
    /// replays with no query (0: none). See [`crate::replay_cache`].
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
        // 0 is a size like any other here: no answer is kept in memory
        if let Ok(entries) = std::env::var("RETRYSAFE_REPLAY_CACHE")
            && !entries.trim().is_empty()
        {
            config.replay_cache_entries = entries
                .trim()
                .parse()
                .map_err(|_| format!("RETRYSAFE_REPLAY_CACHE `{entries}` is not a number of answers (0 for none)"))?;
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

/// The positive number the environment variable `name` holds, if it holds
/// one; an extension reads its own settings with it, as the core does.
pub fn number(name: &str) -> Result<Option<f64>, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<f64>() {
            Ok(n) if n.is_finite() && n > 0.0 => Ok(Some(n)),
            _ => Err(format!("{name} `{v}` is not a positive number")),
        },
        _ => Ok(None),
    }
}

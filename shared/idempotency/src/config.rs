//! The layer's settings, and reading them from the environment.

use std::time::Duration;

use platform::config::duration;

/// When a first attempt's claim commits (docs/design.md §2, §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    /// Claim, effect and answer commit in one transaction: a crash leaves nothing.
    InTransaction,
    /// The claim commits first, under a lease; duplicates see `request_in_progress`.
    Leased,
}

/// How claims are made, and how long leases and stored answers last.
#[derive(Debug, Clone)]
pub struct IdempotencyConfig {
    pub claim: ClaimMode,
    /// How long a leased claim is held before another attempt may take it over;
    /// in the default mode, the longest an effect's transaction runs before it
    /// is rolled back.
    pub lease: Duration,
    /// How long finished operations are kept for replay (at least 24 h by the contract).
    pub retention: Duration,
    /// How often the reaper looks for operations past their retention.
    pub reap_every: Duration,
    /// Finished answers each process keeps for replays ([`crate::replay_cache`]; 0: none).
    pub replay_cache_entries: usize,
    /// How long an approval waits for a decision, and an approved run for its retry.
    pub approval_ttl: Duration,
    /// `false` only to measure what idempotency costs: no claim, no answer, no
    /// replay. It breaks the contract; never for real traffic.
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
    /// The settings in `RETRYSAFE_*` variables (docs/configuration.md).
    pub fn from_env() -> Result<Self, String> {
        let mut config = IdempotencyConfig::default();
        let (second, hour) = (Duration::from_secs(1), Duration::from_secs(3600));
        for (name, unit, setting) in [
            ("RETRYSAFE_LEASE_SECONDS", second, &mut config.lease),
            ("RETRYSAFE_RETENTION_HOURS", hour, &mut config.retention),
            ("RETRYSAFE_REAP_EVERY_SECONDS", second, &mut config.reap_every),
            ("RETRYSAFE_APPROVAL_TTL_SECONDS", second, &mut config.approval_ttl),
        ] {
            *setting = duration(name, unit)?.unwrap_or(*setting);
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

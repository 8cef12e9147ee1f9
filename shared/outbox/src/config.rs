//! How the worker and the reconciler pace themselves, and the wait before an
//! event is tried again.

use std::time::Duration;

/// How the worker and the reconciler pace themselves.
#[derive(Debug, Clone)]
pub struct OutboxConfig {
    /// How often they look for due events when nothing woke them.
    pub poll: Duration,
    /// How long a delivery (or a lookup) waits for an answer before calling it lost.
    pub delivery_timeout: Duration,
    /// How long a worker or the reconciler holds an event; one that dies
    /// holding it is replaced after this. Longer than `delivery_timeout`, so a
    /// live holder usually settles first; when it does not (its settling
    /// transaction waited too long), the compare-and-set on the lease leaves
    /// the event to the new holder.
    pub lease: Duration,
    /// How long after a lost answer the reconciler asks (the external system
    /// may still be working on it).
    pub reconcile_after: Duration,
    /// The wait before sending again what was not accepted; it doubles with
    /// each delivery (with jitter) up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Events taken at a time, delivered concurrently.
    pub batch: i64,
    /// How many deliveries or lookups that come to nothing known (not
    /// accepted, answer lost, the external system not reachable) and failed
    /// settlements make an event `dead`: no longer tried until an admin sends
    /// it again.
    pub max_failures: i32,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            poll: Duration::from_millis(250),
            delivery_timeout: Duration::from_secs(10),
            lease: Duration::from_secs(30),
            reconcile_after: Duration::from_secs(2),
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            batch: 16,
            max_failures: 10,
        }
    }
}

impl OutboxConfig {
    /// `RETRYSAFE_OUTBOX_TIMEOUT_SECONDS` (10), `RETRYSAFE_OUTBOX_LEASE_SECONDS`
    /// (30), `RETRYSAFE_RECONCILE_AFTER_SECONDS` (2), `RETRYSAFE_OUTBOX_BACKOFF_SECONDS` (1),
    /// `RETRYSAFE_OUTBOX_MAX_FAILURES` (10).
    pub fn from_env() -> Result<Self, String> {
        let mut config = OutboxConfig::default();
        let second = Duration::from_secs(1);
        for (name, setting) in [
            ("RETRYSAFE_OUTBOX_TIMEOUT_SECONDS", &mut config.delivery_timeout),
            ("RETRYSAFE_OUTBOX_LEASE_SECONDS", &mut config.lease),
            ("RETRYSAFE_RECONCILE_AFTER_SECONDS", &mut config.reconcile_after),
            ("RETRYSAFE_OUTBOX_BACKOFF_SECONDS", &mut config.backoff),
        ] {
            *setting = platform::config::duration(name, second)?.unwrap_or(*setting);
        }
        if let Some(n) = platform::config::number("RETRYSAFE_OUTBOX_MAX_FAILURES")? {
            if n.fract() != 0.0 || n > f64::from(i32::MAX) {
                return Err(format!(
                    "RETRYSAFE_OUTBOX_MAX_FAILURES `{n}` is not a whole number of failures"
                ));
            }
            config.max_failures = n as i32;
        }
        if config.lease <= config.delivery_timeout {
            return Err(format!(
                "RETRYSAFE_OUTBOX_LEASE_SECONDS ({:?}) must be longer than RETRYSAFE_OUTBOX_TIMEOUT_SECONDS ({:?}): \
                 a live worker must finish before another may take its event",
                config.lease, config.delivery_timeout
            ));
        }
        Ok(config)
    }

    /// The wait before the next delivery of an event sent `deliveries` times:
    /// doubling, capped, and jittered so that many events that failed
    /// together do not come back together.
    pub(crate) fn backoff_after(&self, deliveries: i32) -> Duration {
        let doublings = u32::try_from(deliveries.saturating_sub(1)).unwrap_or(0).min(16);
        let wait = self.backoff.saturating_mul(1 << doublings).min(self.max_backoff);
        wait.mul_f64(0.5 + fastrand::f64() / 2.0)
    }
}

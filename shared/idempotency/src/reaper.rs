//! The retention reaper (docs/design.md §4).

use platform::Timestamp;

use crate::{layer::Idempotency, store};

impl Idempotency {
    /// Deletes the finished operations last touched before `now - retention`.
    pub async fn reap_once(&self) -> Result<u64, sqlx::Error> {
        let cutoff = Timestamp::now().minus(self.config.retention);
        store::reap(&self.db, cutoff).await
    }

    /// Reaps every `reap_every`, until the returned task is aborted.
    pub fn spawn_reaper(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(this.config.reap_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match this.reap_once().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(reaped = n, "removed finished operations past their retention"),
                    Err(e) => tracing::warn!(error = %e, "reaper failed; trying again next round"),
                }
            }
        })
    }
}

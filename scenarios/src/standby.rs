//! The services' databases on a PostgreSQL primary with a streaming standby
//! (docs/design.md §12), for a story that fails the database over: the
//! standby falls behind when its replication is cut, the primary dies, the
//! standby is promoted, and the address the services reach their databases
//! by moves to it, as a virtual IP does. The pair is made from the machine's
//! PostgreSQL programs; it stops when the world that holds it is dropped.

use std::sync::Arc;

use platform::testing::{
    TcpForwarder,
    standby::{ReplicatedPair, Replication},
};
use serde::Deserialize;

/// How the primary waits for its standby before it answers a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StandbyKind {
    /// A commit is answered once the standby has it.
    Synchronous,
    /// A commit is answered at once; the standby follows when it can.
    Asynchronous,
}

/// The PostgreSQL programs a pair is made with.
const PROGRAMS: [&str; 5] = ["initdb", "pg_ctl", "pg_basebackup", "psql", "postgres"];

/// Why no pair can be made here, if it cannot: `pg_config` or a program it
/// names is missing.
pub fn programs_missing() -> Option<String> {
    let out = match std::process::Command::new("pg_config").arg("--bindir").output() {
        Ok(out) if out.status.success() => out,
        _ => return Some("`pg_config` is not on the PATH: PostgreSQL's programs are not installed".into()),
    };
    let bin = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    PROGRAMS
        .iter()
        .find(|program| !bin.join(program).is_file())
        .map(|program| format!("PostgreSQL's `{program}` is not in {}", bin.display()))
}

/// A primary, its standby, and the services' address in front of them.
pub struct Replicated {
    // the pair's helpers panic on what they cannot do: each runs in a task of its own
    pair: Arc<ReplicatedPair>,
    /// Where the services reach their databases: the primary, until a failover.
    address: TcpForwarder,
}

impl Replicated {
    /// Starts a primary holding `databases` and its streaming standby, and
    /// the address in front of the primary.
    pub async fn start(kind: StandbyKind, databases: &'static [&'static str]) -> Result<Replicated, String> {
        let replication = match kind {
            StandbyKind::Synchronous => Replication::Synchronous,
            StandbyKind::Asynchronous => Replication::Asynchronous,
        };
        let pair = tokio::spawn(ReplicatedPair::start(replication, databases))
            .await
            .map_err(|e| format!("the PostgreSQL primary and standby could not be made: {e}"))?;
        let address = TcpForwarder::start(pair.primary).await;
        Ok(Replicated {
            pair: Arc::new(pair),
            address,
        })
    }

    /// The URL of `database` through the services' address.
    pub fn url(&self, database: &str) -> String {
        ReplicatedPair::url(self.address.addr, database)
    }

    /// Once the standby has everything the primary has written, its
    /// replication is cut: what is written from now on is on the primary alone.
    pub async fn fall_behind(&self) -> Result<(), String> {
        let pair = self.pair.clone();
        tokio::spawn(async move {
            pair.wait_until_caught_up().await;
            pair.replication.cut().await;
        })
        .await
        .map_err(|e| format!("the standby could not be made to fall behind: {e}"))
    }

    /// SIGKILL to the primary; the standby is promoted and the services'
    /// address moves to it (the connections open to the dead primary stay
    /// dead; new ones reach the standby).
    pub async fn fail_over(&self) -> Result<(), String> {
        let pair = self.pair.clone();
        tokio::task::spawn_blocking(move || pair.kill_primary())
            .await
            .map_err(|e| format!("the primary could not be killed: {e}"))?;
        let pair = self.pair.clone();
        tokio::spawn(async move { pair.promote_standby().await })
            .await
            .map_err(|e| format!("the standby could not be promoted: {e}"))?;
        self.address.point_at(self.pair.standby);
        Ok(())
    }
}

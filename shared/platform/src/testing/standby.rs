//! A PostgreSQL primary and its streaming standby, made for one test from the
//! machine's PostgreSQL binaries: what a failover test kills and promotes
//! (docs/design.md §12). The standby replicates through a [`TcpForwarder`],
//! so that a test can hold its replication back as a slow network does.
//!
//! Both servers live in a temporary directory and listen on loopback only;
//! they are stopped when the pair is dropped. As root, every PostgreSQL
//! command runs as the `postgres` user, since `initdb` refuses root.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
};

use super::TcpForwarder;

/// How the primary waits for its standby before it answers a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// A commit returns once the standby has the WAL on disk
    /// (`synchronous_commit = on` with the standby named in
    /// `synchronous_standby_names`): a promoted standby has every
    /// acknowledged commit.
    Synchronous,
    /// A commit returns once the primary has it; the standby follows when it
    /// can: a promoted standby may lack what was acknowledged.
    Asynchronous,
}

/// A primary and its standby, each a `postgres` process of this test's own.
pub struct ReplicatedPair {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// Where the primary listens.
    pub primary: SocketAddr,
    /// Where the standby listens (read-only until promoted).
    pub standby: SocketAddr,
    /// The standby's path to the primary: cut it and the standby falls behind.
    pub replication: TcpForwarder,
}

impl ReplicatedPair {
    /// Whether a pair can start here: PostgreSQL is reachable and its
    /// programs are installed (`pg_config` finds them). Outside CI a test
    /// without them is skipped, saying why; under `CI=true` it fails.
    pub async fn can_start() -> bool {
        if !super::backend_available(super::Backend::Postgres).await {
            return false;
        }
        match Command::new("pg_config").arg("--bindir").output() {
            Ok(out) if out.status.success() => true,
            found if super::in_ci() => panic!("PostgreSQL's programs are not installed under CI=true: {found:?}"),
            _ => {
                eprintln!("skipped: PostgreSQL's programs (pg_config, initdb, pg_ctl) are not installed here");
                false
            }
        }
    }

    /// Starts a primary holding `databases` (empty), with `replication`
    /// toward a standby made from its base backup, and waits until the
    /// standby streams.
    pub async fn start(replication: Replication, databases: &[&str]) -> ReplicatedPair {
        let dir = tempfile::Builder::new()
            .prefix("retrysafe-pg-")
            .tempdir()
            .expect("a temporary directory");
        let bin = bin_dir();
        give_to_postgres(dir.path());
        let (primary_dir, standby_dir) = (dir.path().join("primary"), dir.path().join("standby"));
        let (primary, standby) = (free_port(), free_port());

        run_as_postgres(
            Command::new(bin.join("initdb"))
                .args([
                    "--auth=trust",
                    "--username=postgres",
                    "--encoding=UTF8",
                    "--no-sync",
                    "-D",
                ])
                .arg(&primary_dir),
        );
        append_settings(
            &primary_dir,
            &[
                ("listen_addresses", "127.0.0.1".to_owned()),
                ("port", primary.port().to_string()),
                ("unix_socket_directories", format!("{}", dir.path().display())),
                ("wal_level", "replica".to_owned()),
                ("max_wal_senders", "4".to_owned()),
                ("synchronous_commit", "on".to_owned()),
                // a killed process, not a lost machine: the page cache survives, so skip the flushes
                ("fsync", "off".to_owned()),
                ("max_connections", "200".to_owned()),
            ],
        );
        start_server(&bin, &primary_dir);
        for database in databases {
            psql(&bin, primary, "postgres", &format!("CREATE DATABASE {database}"));
        }

        let forwarder = TcpForwarder::start(primary).await;
        let from = forwarder.addr;
        let standby_bin = bin.clone();
        let (backup_dir, conninfo) = (
            standby_dir.clone(),
            format!(
                "host=127.0.0.1 port={} user=postgres application_name=standby",
                from.port()
            ),
        );
        // pg_basebackup streams through the forwarder, which runs on this runtime
        tokio::task::spawn_blocking(move || {
            run_as_postgres(
                Command::new(standby_bin.join("pg_basebackup"))
                    .args([
                        "--write-recovery-conf",
                        "--wal-method=stream",
                        "--checkpoint=fast",
                        "-d",
                    ])
                    .arg(&conninfo)
                    .arg("-D")
                    .arg(&backup_dir),
            )
        })
        .await
        .expect("pg_basebackup ran");
        append_settings(
            &standby_dir,
            &[
                ("port", standby.port().to_string()),
                (
                    "primary_conninfo",
                    format!(
                        "'host=127.0.0.1 port={} user=postgres application_name=standby'",
                        from.port()
                    ),
                ),
                // the standby is this pair's only one: nothing to wait for once promoted
                ("synchronous_standby_names", "''".to_owned()),
            ],
        );
        start_server(&bin, &standby_dir);
        let pair = ReplicatedPair {
            dir,
            bin,
            primary,
            standby,
            replication: forwarder,
        };
        pair.wait_until_streaming().await;
        if replication == Replication::Synchronous {
            // only now: a primary waiting for a standby that is not there yet commits nothing
            psql(
                &pair.bin,
                primary,
                "postgres",
                "ALTER SYSTEM SET synchronous_standby_names = 'standby'",
            );
            psql(&pair.bin, primary, "postgres", "SELECT pg_reload_conf()");
        }
        pair
    }

    /// The URL of `database` on `at` (the primary, the standby, or a
    /// forwarder in front of either).
    pub fn url(at: SocketAddr, database: &str) -> String {
        format!("postgres://postgres@{at}/{database}")
    }

    /// SIGKILL to the primary's postmaster: no shutdown checkpoint, no
    /// goodbye to clients; its backends exit when they notice.
    pub fn kill_primary(&self) {
        let pid =
            std::fs::read_to_string(self.dir.path().join("primary/postmaster.pid")).expect("the primary's pid file");
        let pid = pid.lines().next().expect("a pid").trim().to_owned();
        let killed = Command::new("kill").args(["-KILL", &pid]).status().expect("kill runs");
        assert!(killed.success(), "the primary's postmaster {pid} was killed");
    }

    /// Promotes the standby and waits until it takes writes.
    pub async fn promote_standby(&self) {
        let (bin, dir) = (self.bin.clone(), self.dir.path().join("standby"));
        tokio::task::spawn_blocking(move || {
            run_as_postgres(Command::new(bin.join("pg_ctl")).args(["-w", "promote", "-D"]).arg(&dir))
        })
        .await
        .expect("pg_ctl promote ran");
    }

    /// Waits until the standby has replayed everything the primary has written.
    pub async fn wait_until_caught_up(&self) {
        for _ in 0..200 {
            let behind = psql(
                &self.bin,
                self.primary,
                "postgres",
                "SELECT count(*) FROM pg_stat_replication WHERE replay_lsn < pg_current_wal_lsn()",
            );
            if behind.trim() == "0" {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("the standby never caught up with the primary");
    }

    /// Waits until the primary sees its standby streaming.
    async fn wait_until_streaming(&self) {
        for _ in 0..200 {
            let streaming = psql(
                &self.bin,
                self.primary,
                "postgres",
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
            );
            if streaming.trim() == "1" {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("the standby never streamed from the primary");
    }
}

impl Drop for ReplicatedPair {
    fn drop(&mut self) {
        for server in ["primary", "standby"] {
            let data = self.dir.path().join(server);
            let mut stop = Command::new(self.bin.join("pg_ctl"));
            stop.args(["-m", "immediate", "-w", "stop", "-D"]).arg(&data);
            // a server already killed has nothing to stop
            let _ = as_postgres(&mut stop).output();
        }
    }
}

/// The directory of the machine's PostgreSQL programs.
fn bin_dir() -> PathBuf {
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .expect("pg_config is installed with PostgreSQL");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().unwrap()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// `command` as the `postgres` user when this process is root.
fn as_postgres(command: &mut Command) -> Command {
    if !is_root() {
        let mut same = Command::new(command.get_program());
        same.args(command.get_args());
        return same;
    }
    let mut wrapped = Command::new("runuser");
    wrapped
        .args(["-u", "postgres", "--"])
        .arg(command.get_program())
        .args(command.get_args());
    wrapped
}

fn run_as_postgres(command: &mut Command) -> String {
    let out = as_postgres(command).output().expect("a PostgreSQL program runs");
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        command.get_program(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn give_to_postgres(dir: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .arg("postgres:")
            .arg(dir)
            .status()
            .expect("chown runs");
        assert!(status.success(), "the test's directory is given to postgres");
    }
}

fn append_settings(data: &Path, settings: &[(&str, String)]) {
    use std::io::Write;
    let lines: String = settings
        .iter()
        .map(|(name, value)| format!("{name} = {}\n", quoted(value)))
        .collect();
    let conf = data.join("postgresql.auto.conf");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&conf)
        .expect("postgresql.auto.conf");
    file.write_all(lines.as_bytes()).expect("settings written");
}

/// A setting's value as postgresql.conf reads it: numbers bare, the rest quoted.
fn quoted(value: &str) -> String {
    if value.starts_with('\'') || value.parse::<i64>().is_ok() {
        value.to_owned()
    } else {
        format!("'{value}'")
    }
}

fn start_server(bin: &Path, data: &Path) {
    let mut start = Command::new(bin.join("pg_ctl"));
    // a standby on a loaded machine can take longer than pg_ctl's 60 s to open for reads
    start
        .args(["-w", "-t", "300", "-l"])
        .arg(data.join("server.log"))
        .arg("-D")
        .arg(data)
        .arg("start");
    // the server outlives pg_ctl and would hold a captured output open: let nothing be captured
    let started = as_postgres(&mut start)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("pg_ctl runs");
    if !started.success() {
        let log = std::fs::read_to_string(data.join("server.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        panic!(
            "the server in {} did not start; the end of its server.log:\n{}",
            data.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

fn psql(bin: &Path, at: SocketAddr, database: &str, sql: &str) -> String {
    run_as_postgres(
        Command::new(bin.join("psql"))
            .args([
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
            ])
            .args(["-p", &at.port().to_string(), "-d", database, "-c", sql]),
    )
}

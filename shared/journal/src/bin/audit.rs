//! `audit`: export and verify a service's audit journal offline
//! (docs/contract.md §8).
//!
//! ```text
//! audit export  (--service NAME | --database-url URL)
//! audit verify  (--service NAME | --database-url URL | --file FILE) [--pin SEQ:HASH]
//! ```
//!
//! `--service tickets` finds the database the way the service does (its
//! `TICKETS_DATABASE_URL`, `DATABASE_URL`, or `./.sandbox/tickets.db`).
//! `verify` checks every link, prints the head to pin, and with `--pin`
//! refuses a journal whose tail was cut below (or rewritten up to) that head.
//! It names the first broken entry (or, in a file, the first line that is not
//! an entry, or carries a member no hash covers) and exits with status 1.

use std::process::ExitCode;

use journal::{self as audit, AuditEntry, Head};
use platform::{Db, config::ServiceConfig};

type Error = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "usage: audit export (--service NAME | --database-url URL)\n       \
                     audit verify (--service NAME | --database-url URL | --file FILE) [--pin SEQ:HASH]";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("audit: {e}");
            ExitCode::from(2)
        }
    }
}

/// Where the journal comes from.
enum Source {
    Database(String),
    File(String),
}

async fn run(args: Vec<String>) -> Result<ExitCode, Error> {
    let (command, options) = args.split_first().ok_or(USAGE)?;
    let (mut source, mut pin) = (None, None);
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let mut value = || {
            options
                .next()
                .cloned()
                .ok_or_else(|| format!("{option} needs a value\n{USAGE}"))
        };
        match option.as_str() {
            "--database-url" => source = Some(Source::Database(value()?)),
            "--service" => {
                let name: &'static str = match value()?.as_str() {
                    "tickets" => "tickets",
                    "payments" => "payments",
                    "deployments" => "deployments",
                    other => return Err(format!("unknown service `{other}` (tickets, payments, deployments)").into()),
                };
                source = Some(Source::Database(ServiceConfig::from_env(name, 0, false)?.database_url));
            }
            "--file" => source = Some(Source::File(value()?)),
            "--pin" => pin = Some(value()?.parse::<Head>()?),
            other => return Err(format!("unknown option `{other}`\n{USAGE}").into()),
        }
    }
    let source = source.ok_or(USAGE)?;
    match command.as_str() {
        "export" => {
            let Source::Database(url) = source else {
                return Err("export reads a database: --service or --database-url".into());
            };
            print!("{}", audit::to_json_lines(&read_database(&url).await?));
            Ok(ExitCode::SUCCESS)
        }
        "verify" => {
            let entries = match source {
                Source::Database(url) => read_database(&url).await?,
                Source::File(path) => match audit::from_json_lines(&std::fs::read_to_string(&path)?) {
                    Ok(entries) => entries,
                    Err(unreadable) => {
                        println!("the journal does not verify: {unreadable}");
                        return Ok(ExitCode::FAILURE);
                    }
                },
            };
            match audit::verify(&entries, pin.as_ref()) {
                Ok(verified) => {
                    println!("the audit chain holds: {} entries verified", verified.entries);
                    match verified.head {
                        Some(head) => println!("head {head}\n(pin it: audit verify … --pin {head})"),
                        None => println!("the journal is empty"),
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(broken) => {
                    println!("{broken}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        _ => Err(USAGE.into()),
    }
}

async fn read_database(url: &str) -> Result<Vec<AuditEntry>, Error> {
    if let Some(path) = url.strip_prefix("sqlite:").map(|p| p.trim_start_matches("//"))
        && !std::path::Path::new(path.split('?').next().unwrap_or(path)).exists()
    {
        return Err(format!("no database at `{path}`").into());
    }
    let db = Db::connect(url, 1).await?;
    let entries = audit::all_entries(&db).await?;
    db.close().await;
    Ok(entries)
}

//! `cargo run -p tickets`: the tickets service alone.
//!
//! `tickets` serves (configuration from the environment: see `platform::config`);
//! `tickets create-api-key <account> <principal> <role>` stores a new key's
//! hash and prints the key once; `tickets export-audit` prints the audit
//! journal as JSON lines; `tickets verify-audit [FILE]` verifies the journal's
//! hash chain (the database's, or an exported file's) and names the first
//! broken entry.

use idempotency::IdempotencyConfig;
use platform::{Authenticator, Db, Principal, config::ServiceConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    platform::telemetry::init();

    let config = ServiceConfig::from_env("tickets", tickets::DEFAULT_PORT, false)?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] | ["serve"] => {
            let idempotency = IdempotencyConfig::from_env()?;
            tickets::serve(config, idempotency, None, platform::shutdown_signal()).await
        }
        ["create-api-key", account_id, principal_id, role] => {
            let db = open(&config).await?;
            let principal = Principal {
                account_id: account_id.to_string(),
                principal_id: principal_id.to_string(),
                role: role.parse()?,
            };
            let key = Authenticator::new(db, false).create_key(&principal).await?;
            println!("{}", key.expose());
            Ok(())
        }
        ["export-audit"] => {
            let db = open(&config).await?;
            let entries = idempotency::audit::entries(&db, 0, i64::MAX).await?;
            print!("{}", idempotency::audit::to_json_lines(&entries));
            Ok(())
        }
        ["verify-audit", rest @ ..] => {
            let verdict = match rest {
                [] => idempotency::audit::verify_database(&open(&config).await?).await?,
                [file] => {
                    idempotency::audit::verify(&idempotency::audit::from_json_lines(&std::fs::read_to_string(file)?)?)
                }
                _ => return Err("usage: tickets verify-audit [FILE]".into()),
            };
            match verdict {
                Ok(checked) => {
                    println!("the audit chain holds: {checked} entries verified");
                    Ok(())
                }
                Err(broken) => Err(broken.to_string().into()),
            }
        }
        _ => Err(
            "usage: tickets [serve] | tickets create-api-key <account> <principal> <agent|approver|admin> \
                  | tickets export-audit | tickets verify-audit [FILE]"
                .into(),
        ),
    }
}

/// The service's database, made and migrated if it is new.
async fn open(config: &ServiceConfig) -> Result<Db, Box<dyn std::error::Error + Send + Sync>> {
    platform::prepare_sqlite_dir(&config.database_url)?;
    let db = Db::connect(&config.database_url, 1).await?;
    tickets::migrate(&db).await?;
    Ok(db)
}

//! `cargo run -p tickets`: the tickets service alone.
//!
//! `tickets` serves (configuration from the environment: see `platform::config`);
//! `tickets create-api-key <account> <principal> <role>` stores a new key's
//! hash and prints the key once. The audit journal is exported and verified
//! by the `audit` tool of the idempotency crate (`cargo run -p idempotency
//! --bin audit -- verify --service tickets`).

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
            let policy = tickets::domain::TicketsPolicy::from_env()?;
            tickets::serve(config, idempotency, policy, None, platform::shutdown_signal()).await
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
        _ => Err("usage: tickets [serve] | tickets create-api-key <account> <principal> <agent|approver|admin>".into()),
    }
}

/// The service's database, made and migrated if it is new.
async fn open(config: &ServiceConfig) -> Result<Db, Box<dyn std::error::Error + Send + Sync>> {
    platform::prepare_sqlite_dir(&config.database_url)?;
    let db = Db::connect(&config.database_url, 1).await?;
    tickets::migrate(&db).await?;
    Ok(db)
}

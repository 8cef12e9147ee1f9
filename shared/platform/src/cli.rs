//! The command line every Retrysafe binary shares: with no command it serves,
//! `--help` says what it does and how it is configured, and each service's
//! `create-api-key` makes a key outside sandbox mode.

use clap::{Parser, Subcommand};

use crate::{Authenticator, Db, Principal, Role, config::ServiceConfig};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A service's command line.
#[derive(Debug, Parser)]
pub struct ServiceCli {
    #[command(subcommand)]
    pub command: Option<ServiceCommand>,
}

#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Serve the API (what it does with no command).
    Serve,
    /// Store a new API key's hash in this service's database (made and
    /// migrated if it is new) and print the key, once.
    CreateApiKey(NewKey),
}

#[derive(Debug, clap::Args)]
pub struct NewKey {
    /// The account (tenant) the key acts for, e.g. `acme`.
    pub account: String,
    /// Who holds the key, as the journal will name them, e.g. `alice`.
    pub principal: String,
    /// `agent`, `approver` or `admin`.
    pub role: Role,
}

impl ServiceCli {
    /// Parses the process's arguments for the binary `name`, whose help says
    /// `about`; `--help` prints and exits 0, a wrong argument prints usage and exits 2.
    pub fn parse_for(name: &'static str, about: &'static str) -> ServiceCommand {
        parse_for::<ServiceCli>(name, about)
            .command
            .unwrap_or(ServiceCommand::Serve)
    }
}

/// Parses the process's arguments into `T`, as the binary `name` that does `about`.
pub fn parse_for<T: Parser>(name: &'static str, about: &'static str) -> T {
    let matches = T::command().name(name).bin_name(name).about(about).get_matches();
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// `create-api-key`: opens the service's database (migrating it with
/// `migrate`), stores the key's hash, and prints the key.
pub async fn create_api_key<E>(
    config: &ServiceConfig,
    migrate: impl AsyncFnOnce(&Db) -> Result<(), E>,
    key: NewKey,
) -> Result<(), Error>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let db = crate::service::connect(&config.database_url, 1, migrate).await?;
    let principal = Principal {
        account_id: key.account,
        principal_id: key.principal,
        role: key.role,
    };
    let created = Authenticator::new(db.clone(), false).create_key(&principal).await?;
    db.close().await;
    println!("{}", created.expose());
    Ok(())
}

//! The deployments tables, on both backends. Handlers never see SQL; the
//! environment lock is a partial unique index, and every state change is a
//! compare-and-set on the state it changes from.

use axum::http::StatusCode;
use idempotency::OperationIdentity;
use outbox::Settlement;
use platform::{
    ApiError, Db, Timestamp, Tx, on_pool, on_tx,
    page::{Page, PageRequest},
};
use sqlx::{FromRow, Row};

use crate::domain::{
    ArtifactDigest, CommitSha, Deployment, DeploymentKind, DeploymentState, Environment, LockHolder, StateChange,
    deployment_url, new_id,
};

macro_rules! columns {
    () => {
        "seq, id, kind, service, environment, artifact_digest, commit_sha, state, replaces, restores, reason, \
         operation_id, controller_idempotency_key, controller_rollout_id, created_at, updated_at"
    };
}

/// The states in which a deployment holds its environment's lock: it may be
/// changing the environment.
const HOLDS_THE_LOCK: &str = "('queued', 'running', 'unknown')";

/// What a new deployment or rollback is.
#[derive(Debug)]
pub struct NewDeployment<'a> {
    pub kind: DeploymentKind,
    pub service: &'a str,
    pub environment: &'a str,
    pub artifact_digest: &'a ArtifactDigest,
    pub commit_sha: Option<&'a CommitSha>,
    /// A rollback's target.
    pub restores: Option<&'a str>,
    pub reason: Option<&'a str>,
    /// The release the caller believes is current, if it said.
    pub expected_current: Option<&'a str>,
    /// What it may replace: whatever is current, or what its approval promised.
    pub replacing: Replacing<'a>,
}

/// The release a new deployment or rollback may replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replacing<'a> {
    /// Whatever is current when it takes the lock: nobody was promised anything.
    Current,
    /// Exactly this release (`None`: nothing), which its approver was told it
    /// replaces; another one is 409 `approval_stale` (docs/contract.md §6).
    AsApproved(Option<&'a str>),
}

/// Creates a deployment or a rollback, `queued`, in the effect's transaction,
/// taking the environment's lock: the insert does nothing when another one
/// holds it (PostgreSQL waits for a concurrent holder to commit; SQLite has one
/// writer), and the holder is named in the 409. The current release is read
/// only once the lock is taken — no other deployment can change it then — so
/// `replaces` is exact, a stale `expected_current_deployment_id` is always
/// 409 `version_mismatch`, and a release other than the one an approver was
/// told it replaces is always 409 `approval_stale`, on both backends: what the
/// request read before its claim may be old by now.
pub async fn create(
    tx: &mut Tx,
    operation: &OperationIdentity<'_>,
    new: &NewDeployment<'_>,
) -> Result<Deployment, ApiError> {
    let (account_id, operation_id) = (operation.account_id, operation.operation_id);
    const INSERT: &str = concat!(
        "INSERT INTO deployments (id, account_id, kind, service, environment, artifact_digest, commit_sha, state, \
         restores, reason, operation_id, controller_idempotency_key, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'queued', $8, $9, $10, $11, $12, $12) \
         ON CONFLICT (account_id, service, environment) WHERE state IN ('queued', 'running', 'unknown') DO NOTHING \
         RETURNING ",
        columns!()
    );
    // Bounded: the holder that made the insert do nothing can finish before it
    // is read; the environment is then free, so try again.
    for _ in 0..3 {
        let now = Timestamp::now();
        let created = on_tx!(tx, |conn| {
            sqlx::query(INSERT)
                .bind(new_id(new.kind))
                .bind(account_id)
                .bind(new.kind.as_str())
                .bind(new.service)
                .bind(new.environment)
                .bind(new.artifact_digest.as_str())
                .bind(new.commit_sha.map(CommitSha::as_str))
                .bind(new.restores)
                .bind(new.reason)
                .bind(operation_id)
                .bind(outbox::external_key(operation))
                .bind(now)
                .fetch_optional(conn)
                .await?
                .map(|row| Deployment::from_row(&row))
                .transpose()?
        });
        if let Some(mut deployment) = created {
            // a statement of its own: on PostgreSQL it sees what the lock's last holder committed
            let current = current_release(tx, account_id, new.service, new.environment).await?;
            if let Replacing::AsApproved(promised) = new.replacing
                && current.as_deref() != promised
            {
                return Err(approvals::stale(format!(
                    "the approver was told it replaces {}, but the current release is {}",
                    promised.map_or("nothing".to_owned(), |p| format!("`{p}`")),
                    current.as_deref().map_or("none".to_owned(), |c| format!("`{c}`"))
                )));
            }
            if let Some(expected) = new.expected_current
                && current.as_deref() != Some(expected)
            {
                return Err(version_mismatch(expected, current.as_deref()));
            }
            on_tx!(tx, |conn| {
                sqlx::query("UPDATE deployments SET replaces = $3 WHERE account_id = $1 AND id = $2")
                    .bind(account_id)
                    .bind(&deployment.id)
                    .bind(current.as_deref())
                    .execute(conn)
                    .await?;
            });
            deployment.replaces = current;
            let note = format!("asked for by {operation_id}");
            record_state(tx, account_id, &deployment.id, DeploymentState::Queued, &note, now).await?;
            deployment.history = Some(vec![StateChange {
                state: DeploymentState::Queued,
                note,
                at: now,
            }]);
            return Ok(deployment);
        }
        if let Some(holder) = lock_holder(tx, account_id, new.service, new.environment).await? {
            return Err(environment_locked(new.service, new.environment, holder));
        }
    }
    Err(ApiError::internal(
        "the environment's lock kept changing hands while this deployment was made",
    ))
}

fn version_mismatch(expected: &str, current: Option<&str>) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "version_mismatch",
        "Version mismatch",
        format!(
            "`expected_current_deployment_id` is `{expected}`, but the current release is {}; read the environment again",
            current.map_or("none".to_owned(), |c| format!("`{c}`"))
        ),
    )
    .with("expected_current_deployment_id", expected)
    .with("current_deployment_id", current)
}

/// 409: another deployment may be changing the environment; it is named, with
/// the operation that asked for it, so the caller can poll it or cancel it.
fn environment_locked(service: &str, environment: &str, holder: LockHolder) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "environment_locked",
        "Environment locked",
        format!(
            "{} ({}) holds {service} in {environment}: poll it, or cancel it; once it has ended, deploy with a new key",
            holder.deployment_id,
            holder.state.as_str()
        ),
    )
    .with("deployment_id", &holder.deployment_id)
    .with("operation_id", &holder.operation_id)
    .with("state", holder.state)
}

async fn current_release(
    tx: &mut Tx,
    account_id: &str,
    service: &str,
    environment: &str,
) -> Result<Option<String>, sqlx::Error> {
    Ok(on_tx!(tx, |conn| {
        sqlx::query_scalar(
            "SELECT current_deployment_id FROM environments WHERE account_id = $1 AND service = $2 AND environment = $3",
        )
        .bind(account_id)
        .bind(service)
        .bind(environment)
        .fetch_optional(conn)
        .await?
    }))
}

async fn lock_holder(
    tx: &mut Tx,
    account_id: &str,
    service: &str,
    environment: &str,
) -> Result<Option<LockHolder>, sqlx::Error> {
    let sql = format!(
        "SELECT id, operation_id, state FROM deployments \
         WHERE account_id = $1 AND service = $2 AND environment = $3 AND state IN {HOLDS_THE_LOCK}"
    );
    let row: Option<(String, String, String)> = on_tx!(tx, |conn| {
        sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(service)
            .bind(environment)
            .fetch_optional(conn)
            .await?
    });
    Ok(row.and_then(|(deployment_id, operation_id, state)| {
        Some(LockHolder {
            deployment_id,
            operation_id,
            state: DeploymentState::parse(&state)?,
        })
    }))
}

async fn record_state(
    tx: &mut Tx,
    account_id: &str,
    deployment_id: &str,
    state: DeploymentState,
    note: &str,
    at: Timestamp,
) -> Result<(), sqlx::Error> {
    on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO deployment_history (deployment_id, state, note, at, account_id) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(deployment_id)
        .bind(state.as_str())
        .bind(note)
        .bind(at)
        .bind(account_id)
        .execute(conn)
        .await?;
    });
    Ok(())
}

/// Adds `note` to a deployment's history without changing its state.
pub async fn note(
    tx: &mut Tx,
    account_id: &str,
    deployment_id: &str,
    state: DeploymentState,
    note: &str,
) -> Result<(), sqlx::Error> {
    record_state(tx, account_id, deployment_id, state, note, Timestamp::now()).await
}

/// Moves a deployment from one of `from` to `to`, records why, and — when it
/// succeeded — makes it the environment's current release, all in `tx`.
/// `false`: it was in none of `from` (someone else moved it first).
pub async fn change_state(
    tx: &mut Tx,
    account_id: &str,
    deployment_id: &str,
    from: &[DeploymentState],
    to: DeploymentState,
    note: &str,
) -> Result<bool, sqlx::Error> {
    let from = from
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "UPDATE deployments SET state = $3, updated_at = $4 \
         WHERE account_id = $1 AND id = $2 AND state IN ({from}) RETURNING service, environment"
    );
    let now = Timestamp::now();
    let changed: Option<(String, String)> = on_tx!(tx, |conn| {
        sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(deployment_id)
            .bind(to.as_str())
            .bind(now)
            .fetch_optional(conn)
            .await?
    });
    let Some((service, environment)) = changed else {
        return Ok(false);
    };
    record_state(tx, account_id, deployment_id, to, note, now).await?;
    if to == DeploymentState::Succeeded {
        on_tx!(tx, |conn| {
            sqlx::query(
                "INSERT INTO environments (account_id, service, environment, current_deployment_id, updated_at) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (account_id, service, environment) \
                 DO UPDATE SET current_deployment_id = excluded.current_deployment_id, updated_at = excluded.updated_at",
            )
            .bind(account_id)
            .bind(&service)
            .bind(&environment)
            .bind(deployment_id)
            .bind(now)
            .execute(conn)
            .await?;
        });
    }
    Ok(true)
}

/// Records how handing a rollout to the controller ended: taken (with the
/// controller's id; an unknown deployment is queued again, the watcher follows
/// it from there), refused (failed, which frees the environment), or unknown
/// until the reconciler finds out (it keeps the lock: it may be running). A
/// person who found the release running with no rollout the controller
/// confirms (it is gone for good) ends it `succeeded` — the environment's
/// current release — with no rollout id: nothing follows it or cancels it there.
pub async fn settle_rollout(
    tx: &mut Tx,
    account_id: &str,
    deployment_id: &str,
    settlement: Settlement<'_>,
) -> Result<(), sqlx::Error> {
    let handing = [DeploymentState::Queued, DeploymentState::Unknown];
    match settlement {
        Settlement::Accepted { external_ref } => {
            let now = Timestamp::now();
            let taken = on_tx!(tx, |conn| {
                sqlx::query(
                    "UPDATE deployments SET controller_rollout_id = $3, state = 'queued', updated_at = $4 \
                     WHERE account_id = $1 AND id = $2 AND state IN ('queued', 'unknown')",
                )
                .bind(account_id)
                .bind(deployment_id)
                .bind(external_ref)
                .bind(now)
                .execute(conn)
                .await?
                .rows_affected()
            });
            if taken == 1 {
                let note = format!("the controller took it as {external_ref}");
                record_state(tx, account_id, deployment_id, DeploymentState::Queued, &note, now).await?;
            }
        }
        Settlement::CompletedByHand => {
            let note = "a person found it rolled out, with no rollout the controller confirms: nothing follows it";
            change_state(
                tx,
                account_id,
                deployment_id,
                &handing,
                DeploymentState::Succeeded,
                note,
            )
            .await?;
        }
        Settlement::FailedByHand => {
            let note = "the controller holds no rollout for it: a person settled it as failed";
            change_state(tx, account_id, deployment_id, &handing, DeploymentState::Failed, note).await?;
        }
        Settlement::Refused { reason } => {
            let note = format!("the controller refused it: {reason}");
            change_state(tx, account_id, deployment_id, &handing, DeploymentState::Failed, &note).await?;
        }
        Settlement::Unknown => {
            let note = "the controller's answer was lost: the reconciler asks it";
            change_state(tx, account_id, deployment_id, &handing, DeploymentState::Unknown, note).await?;
        }
    }
    Ok(())
}

pub async fn get(db: &Db, account_id: &str, deployment_id: &str) -> Result<Option<Deployment>, ApiError> {
    const SQL: &str = concat!(
        "SELECT ",
        columns!(),
        " FROM deployments WHERE account_id = $1 AND id = $2"
    );
    let Some(mut deployment) = platform::rows::get::<Deployment>(db, SQL, account_id, &[deployment_id]).await? else {
        return Ok(None);
    };
    deployment.history = Some(history(db, account_id, &deployment.id).await?);
    Ok(Some(deployment))
}

/// A deployment with its history, read inside `tx` (so it shows what `tx`
/// changed), the row locked for the rest of it on PostgreSQL.
pub async fn get_in(tx: &mut Tx, account_id: &str, deployment_id: &str) -> Result<Option<Deployment>, ApiError> {
    let lock = if matches!(tx, Tx::Postgres(_)) {
        " FOR UPDATE"
    } else {
        ""
    };
    let sql = format!(
        "SELECT {} FROM deployments WHERE account_id = $1 AND id = $2{lock}",
        columns!()
    );
    let deployment = on_tx!(tx, |conn| {
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(deployment_id)
            .fetch_optional(conn)
            .await?
            .map(|row| Deployment::from_row(&row))
            .transpose()?
    });
    let Some(mut deployment) = deployment else {
        return Ok(None);
    };
    let rows: Vec<(String, String, Timestamp)> = on_tx!(tx, |conn| {
        sqlx::query_as(HISTORY)
            .bind(account_id)
            .bind(&deployment.id)
            .fetch_all(conn)
            .await?
    });
    deployment.history = Some(decode_history(rows)?);
    Ok(Some(deployment))
}

const HISTORY: &str =
    "SELECT state, note, at FROM deployment_history WHERE account_id = $1 AND deployment_id = $2 ORDER BY seq";

async fn history(db: &Db, account_id: &str, deployment_id: &str) -> Result<Vec<StateChange>, sqlx::Error> {
    let rows: Vec<(String, String, Timestamp)> = on_pool!(db.read(), |pool| {
        sqlx::query_as(HISTORY)
            .bind(account_id)
            .bind(deployment_id)
            .fetch_all(pool)
            .await?
    });
    decode_history(rows)
}

fn decode_history(rows: Vec<(String, String, Timestamp)>) -> Result<Vec<StateChange>, sqlx::Error> {
    rows.into_iter()
        .map(|(state, note, at)| {
            let state = DeploymentState::parse(&state)
                .ok_or_else(|| sqlx::Error::Decode("deployment_history: unknown state".into()))?;
            Ok(StateChange { state, note, at })
        })
        .collect()
}

/// One page of the account's deployments and rollbacks in creation order,
/// for one service and environment if given (without their history).
pub async fn list(
    db: &Db,
    account_id: &str,
    service: Option<&str>,
    environment: Option<&str>,
    page: PageRequest,
) -> Result<Page<Deployment>, ApiError> {
    const SQL: &str = concat!(
        "SELECT list_seq, ",
        columns!(),
        " FROM deployments WHERE account_id = $1 AND ($2 IS NULL OR service = $2) \
         AND ($3 IS NULL OR environment = $3) AND list_seq > $4 ORDER BY list_seq LIMIT $5"
    );
    platform::rows::list(db, "deployments", SQL, account_id, &[service, environment], page).await
}

/// An environment: its current release (with its history) and its lock holder.
pub async fn environment(db: &Db, account_id: &str, service: &str, environment: &str) -> Result<Environment, ApiError> {
    let sql = format!(
        "SELECT (SELECT current_deployment_id FROM environments \
                 WHERE account_id = $1 AND service = $2 AND environment = $3) AS current_id, \
                h.id AS holder_id, h.operation_id AS holder_operation_id, h.state AS holder_state \
         FROM (SELECT 1) AS one LEFT JOIN deployments h \
           ON h.account_id = $1 AND h.service = $2 AND h.environment = $3 AND h.state IN {HOLDS_THE_LOCK}"
    );
    type Row = (Option<String>, Option<String>, Option<String>, Option<String>);
    let (current_id, holder_id, holder_operation, holder_state): Row = on_pool!(db.read(), |pool| {
        sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(service)
            .bind(environment)
            .fetch_one(pool)
            .await?
    });
    let current = match current_id {
        Some(id) => get(db, account_id, &id).await?,
        None => None,
    };
    let locked_by = match (
        holder_id,
        holder_operation,
        holder_state.as_deref().and_then(DeploymentState::parse),
    ) {
        (Some(deployment_id), Some(operation_id), Some(state)) => Some(LockHolder {
            deployment_id,
            operation_id,
            state,
        }),
        _ => None,
    };
    Ok(Environment {
        service: service.to_owned(),
        environment: environment.to_owned(),
        current,
        locked_by,
    })
}

/// A rollout the controller has and that has not finished: what the watcher follows.
#[derive(Debug, Clone)]
pub struct Watched {
    pub account_id: String,
    pub deployment_id: String,
    pub operation_id: String,
    pub rollout_id: String,
    pub state: DeploymentState,
}

/// The rollouts to follow, every account's. The lock bounds them: at most one
/// per environment.
pub async fn watched(db: &Db) -> Result<Vec<Watched>, sqlx::Error> {
    let rows: Vec<(String, String, String, String, String)> = on_pool!(db.read(), |pool| {
        sqlx::query_as(
            "SELECT account_id, id, operation_id, controller_rollout_id, state FROM deployments \
             WHERE state IN ('queued', 'running') AND controller_rollout_id IS NOT NULL ORDER BY updated_at",
        )
        .fetch_all(pool)
        .await?
    });
    Ok(rows
        .into_iter()
        .filter_map(|(account_id, deployment_id, operation_id, rollout_id, state)| {
            Some(Watched {
                account_id,
                deployment_id,
                operation_id,
                rollout_id,
                state: DeploymentState::parse(&state)?,
            })
        })
        .collect())
}

impl<'a, R> FromRow<'a, R> for Deployment
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'a R) -> Result<Self, sqlx::Error> {
        let corrupt = |what: &str| sqlx::Error::Decode(format!("deployments: {what}").into());
        let id: String = row.try_get("id")?;
        let kind = match row.try_get::<String, _>("kind")?.as_str() {
            "deployment" => DeploymentKind::Deployment,
            "rollback" => DeploymentKind::Rollback,
            _ => return Err(corrupt("unknown kind")),
        };
        let state: String = row.try_get("state")?;
        Ok(Deployment {
            status_url: deployment_url(&id),
            id,
            kind,
            service: row.try_get("service")?,
            environment: row.try_get("environment")?,
            artifact_digest: ArtifactDigest::from_stored(row.try_get("artifact_digest")?),
            commit_sha: row
                .try_get::<Option<String>, _>("commit_sha")?
                .map(CommitSha::from_stored),
            state: DeploymentState::parse(&state).ok_or_else(|| corrupt("unknown state"))?,
            replaces: row.try_get("replaces")?,
            restores: row.try_get("restores")?,
            reason: row.try_get("reason")?,
            operation_id: row.try_get("operation_id")?,
            controller_idempotency_key: row.try_get("controller_idempotency_key")?,
            controller_rollout_id: row.try_get("controller_rollout_id")?,
            history: None,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

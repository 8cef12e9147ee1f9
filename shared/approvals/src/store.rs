//! The approvals table, on both backends: insert, find, list and count,
//! the decision and the expiry as compare-and-set writes, and the check the
//! running attempt makes inside its effect's transaction (docs/contract.md §6),
//! and the ending of an operation whose wait was rejected or expired.

use platform::{Db, Timestamp, Tx, on_pool, on_tx};

use idempotency::{Fingerprint, gate::ApprovalState, store::Completion};

use crate::{ApprovalRecord, ApprovalSummary};

/// Whether an approval still allows its operation to run, checked by the
/// attempt that runs it inside the effect's transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExecutionCheck {
    Allowed,
    /// Not approved: rejected, still pending, or for another operation or fingerprint.
    Refused,
    Expired,
    /// Approved, but the summary the policy writes for this attempt is not
    /// the one approved: what the approver was promised no longer holds
    /// (what changed, in words).
    Stale(String),
}

/// Every column but the row's number: `seq` in most reads, a list's place
/// (`list_seq AS seq`) in a list.
macro_rules! fields {
    () => {
        "approval_id, account_id, operation_id, idempotency_key, route, fingerprint, summary, \
         requested_by, created_at, expires_at, decision, decided_by, decided_at"
    };
}

const COLUMNS: &str = concat!("seq, ", fields!());
const LISTED_COLUMNS: &str = concat!("list_seq AS seq, ", fields!());

pub(crate) async fn insert(tx: &mut Tx, approval: &ApprovalRecord) -> Result<(), sqlx::Error> {
    let summary = serde_json::to_string(&approval.summary).map_err(|e| sqlx::Error::Encode(e.into()))?;
    on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO idempotency_approvals (approval_id, account_id, operation_id, idempotency_key, route, \
             fingerprint, summary, requested_by, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&approval.approval_id)
        .bind(&approval.account_id)
        .bind(&approval.operation_id)
        .bind(&approval.idempotency_key)
        .bind(&approval.route)
        .bind(approval.fingerprint.as_str())
        .bind(&summary)
        .bind(&approval.requested_by)
        .bind(approval.created_at)
        .bind(approval.expires_at)
        .execute(conn)
        .await?;
    });
    Ok(())
}

/// One of the account's approvals; another account's is `None`.
pub async fn find(db: &Db, account_id: &str, approval_id: &str) -> Result<Option<ApprovalRecord>, sqlx::Error> {
    let sql = format!("SELECT {COLUMNS} FROM idempotency_approvals WHERE account_id = $1 AND approval_id = $2");
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query_as::<_, ApprovalRow>(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(approval_id)
            .fetch_optional(pool)
            .await?
            .map(ApprovalRecord::try_from)
            .transpose()?
    }))
}

/// [`find`], read in `tx`: what a transaction about to change the approval reads.
pub(crate) async fn find_in(
    tx: &mut Tx,
    account_id: &str,
    approval_id: &str,
) -> Result<Option<ApprovalRecord>, sqlx::Error> {
    let sql = format!("SELECT {COLUMNS} FROM idempotency_approvals WHERE account_id = $1 AND approval_id = $2");
    Ok(on_tx!(tx, |conn| {
        sqlx::query_as::<_, ApprovalRow>(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(approval_id)
            .fetch_optional(conn)
            .await?
            .map(ApprovalRecord::try_from)
            .transpose()?
    }))
}

/// The SQL condition for approvals in `state` as of the time bound to `$now`.
fn in_state(state: Option<ApprovalState>, now: &str) -> String {
    match state {
        None => "TRUE".to_owned(),
        Some(ApprovalState::Pending) => format!("decision IS NULL AND expires_at > {now}"),
        Some(ApprovalState::Expired) => {
            format!("(decision = 'expired' OR (decision IS NULL AND expires_at <= {now}))")
        }
        Some(ApprovalState::Approved) => "decision = 'approved'".to_owned(),
        Some(ApprovalState::Rejected) => "decision = 'rejected'".to_owned(),
    }
}

/// How many approvals, of every account, are in each state as of `now`:
/// `(state, count)`, each state read as [`in_state`] reads it.
pub(crate) async fn count_by_state(db: &Db, now: Timestamp) -> Result<Vec<(String, i64)>, sqlx::Error> {
    const SQL: &str = "SELECT CASE WHEN decision IS NOT NULL THEN decision \
                                   WHEN expires_at <= $1 THEN 'expired' ELSE 'pending' END AS state, COUNT(*) \
                       FROM idempotency_approvals GROUP BY 1";
    Ok(on_pool!(db.read(), |pool| sqlx::query_as(SQL)
        .bind(now)
        .fetch_all(pool)
        .await?))
}

/// The account's approvals after `after_seq` in creation order, in `state`
/// if given (as of `now`); each record's `seq` is its place in the list
/// (see [`platform::page`]).
pub async fn list(
    db: &Db,
    account_id: &str,
    state: Option<ApprovalState>,
    now: Timestamp,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<ApprovalRecord>, sqlx::Error> {
    platform::page::number_new_rows(db, "idempotency_approvals", account_id).await?;
    let condition = in_state(state, "$4");
    // `$4 IS NOT NULL` keeps the parameter bound in every variant
    let sql = format!(
        "SELECT {LISTED_COLUMNS} FROM idempotency_approvals \
         WHERE account_id = $1 AND list_seq > $2 AND {condition} AND $4 IS NOT NULL ORDER BY list_seq LIMIT $3"
    );
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query_as::<_, ApprovalRow>(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(after_seq)
            .bind(limit)
            .bind(now)
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(ApprovalRecord::try_from)
            .collect::<Result<Vec<_>, _>>()?
    }))
}

/// How many of the account's approvals are in `state` (all of them if `None`) as of `now`.
pub async fn count(
    db: &Db,
    account_id: &str,
    state: Option<ApprovalState>,
    now: Timestamp,
) -> Result<i64, sqlx::Error> {
    let condition = in_state(state, "$2");
    let sql =
        format!("SELECT COUNT(*) FROM idempotency_approvals WHERE account_id = $1 AND {condition} AND $2 IS NOT NULL");
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(now)
            .fetch_one(pool)
            .await?
    }))
}

/// Approvals past their expiry whose operation still waits, of every
/// account: pending ones nobody decided, and approved ones no retry ran in
/// time. The reaper's work.
pub(crate) async fn due(db: &Db, now: Timestamp, limit: i64) -> Result<Vec<ApprovalRecord>, sqlx::Error> {
    let columns = COLUMNS.replace(", ", ", a.");
    let sql = format!(
        "SELECT a.{columns} FROM idempotency_approvals a \
         JOIN idempotency_operations o ON o.account_id = a.account_id AND o.operation_id = a.operation_id \
         WHERE o.state = 'awaiting_approval' AND a.expires_at <= $1 \
           AND (a.decision IS NULL OR a.decision = 'approved') \
         ORDER BY a.seq LIMIT $2"
    );
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query_as::<_, ApprovalRow>(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(now)
            .bind(limit)
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(ApprovalRecord::try_from)
            .collect::<Result<Vec<_>, _>>()?
    }))
}

/// Records a decision: compare-and-set on a pending, unexpired approval
/// whose fingerprint is the one the approver saw and whose requester is not
/// the approver. `false`: one of those did not hold, and nothing changed.
pub(crate) async fn record_decision(
    tx: &mut Tx,
    approval: &ApprovalRecord,
    decision: ApprovalState,
    decided_by: &str,
    echoed: &str,
    now: Timestamp,
) -> Result<bool, sqlx::Error> {
    let changed = on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE idempotency_approvals SET decision = $3, decided_by = $4, decided_at = $5 \
             WHERE account_id = $1 AND approval_id = $2 AND decision IS NULL AND expires_at > $5 \
               AND fingerprint = $6 AND requested_by <> $4",
        )
        .bind(&approval.account_id)
        .bind(&approval.approval_id)
        .bind(decision.into_str())
        .bind(decided_by)
        .bind(now)
        .bind(echoed)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(changed == 1)
}

/// Marks a pending approval past its expiry as expired. `false`: it was
/// decided (or expired) meanwhile.
pub(crate) async fn record_expiry(tx: &mut Tx, approval: &ApprovalRecord, now: Timestamp) -> Result<bool, sqlx::Error> {
    let changed = on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE idempotency_approvals SET decision = 'expired', decided_at = $2 \
             WHERE account_id = $3 AND approval_id = $1 AND decision IS NULL AND expires_at <= $2",
        )
        .bind(&approval.approval_id)
        .bind(now)
        .bind(&approval.account_id)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(changed == 1)
}

/// The execution-time check (docs/contract.md §6), inside the effect's
/// transaction. A decision never changes once made, so what this reads holds to
/// the commit. `summary` is what the route's policy writes for this attempt's
/// request now: it must be the summary approved. It was read before the claim,
/// so what can change after that read (the release a deployment replaces)
/// the effect holds in this same transaction.
pub(crate) async fn check_for_execution(
    tx: &mut Tx,
    account_id: &str,
    approval_id: &str,
    operation_id: &str,
    fingerprint: &Fingerprint,
    summary: Option<&ApprovalSummary>,
    now: Timestamp,
) -> Result<ExecutionCheck, sqlx::Error> {
    let row: Option<(String, String, String, Option<String>, Timestamp)> = on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT operation_id, fingerprint, summary, decision, expires_at FROM idempotency_approvals \
             WHERE account_id = $1 AND approval_id = $2",
        )
        .bind(account_id)
        .bind(approval_id)
        .fetch_optional(conn)
        .await?
    });
    Ok(match row {
        Some((op, fp, approved, Some(decision), expires_at))
            if op == operation_id && fp == fingerprint.as_str() && decision == "approved" =>
        {
            if expires_at <= now {
                return Ok(ExecutionCheck::Expired);
            }
            let approved: ApprovalSummary = serde_json::from_str(&approved)
                .map_err(|_| sqlx::Error::Decode("idempotency_approvals: summary is not JSON".into()))?;
            match ApprovalSummary::changes(&approved, summary) {
                None => ExecutionCheck::Allowed,
                Some(what) => ExecutionCheck::Stale(what),
            }
        }
        Some((_, _, _, None, expires_at)) if expires_at <= now => ExecutionCheck::Expired,
        Some((_, _, _, Some(decision), _)) if decision == "expired" => ExecutionCheck::Expired,
        _ => ExecutionCheck::Refused,
    })
}

/// A row of `idempotency_approvals`, as the database has it.
#[derive(Debug, sqlx::FromRow)]
struct ApprovalRow {
    seq: i64,
    approval_id: String,
    account_id: String,
    operation_id: String,
    idempotency_key: String,
    route: String,
    fingerprint: String,
    summary: String,
    requested_by: String,
    created_at: Timestamp,
    expires_at: Timestamp,
    decision: Option<String>,
    decided_by: Option<String>,
    decided_at: Option<Timestamp>,
}

impl TryFrom<ApprovalRow> for ApprovalRecord {
    type Error = sqlx::Error;

    fn try_from(row: ApprovalRow) -> Result<Self, sqlx::Error> {
        let corrupt = |what: &str| sqlx::Error::Decode(format!("idempotency_approvals: {what}").into());
        let decision = match row.decision.as_deref() {
            None => None,
            Some("approved") => Some(ApprovalState::Approved),
            Some("rejected") => Some(ApprovalState::Rejected),
            Some("expired") => Some(ApprovalState::Expired),
            Some(_) => return Err(corrupt("unknown decision")),
        };
        Ok(ApprovalRecord {
            seq: row.seq,
            approval_id: row.approval_id,
            account_id: row.account_id,
            operation_id: row.operation_id,
            idempotency_key: row.idempotency_key,
            route: row.route,
            fingerprint: Fingerprint::from_stored(row.fingerprint),
            summary: serde_json::from_str(&row.summary).map_err(|_| corrupt("summary is not JSON"))?,
            requested_by: row.requested_by,
            created_at: row.created_at,
            expires_at: row.expires_at,
            decision,
            decided_by: row.decided_by,
            decided_at: row.decided_at,
        })
    }
}

/// Ends an operation awaiting approval (rejected, expired); `false` if it was not.
pub(crate) async fn settle_awaiting(
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    completion: &Completion<'_>,
) -> Result<bool, sqlx::Error> {
    let done = on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE idempotency_operations SET state = $3, response_status = $4, response_content_type = $5, \
             response_location = $6, response_body = $7, updated_at = $8 \
             WHERE account_id = $1 AND operation_id = $2 AND state = 'awaiting_approval'",
        )
        .bind(account_id)
        .bind(operation_id)
        .bind(completion.state.into_str())
        .bind(i32::from(completion.response.status.as_u16()))
        .bind(&completion.response.content_type)
        .bind(completion.response.location.as_deref())
        .bind(&completion.response.body)
        .bind(completion.now)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(done == 1)
}

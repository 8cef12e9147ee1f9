//! Approvals bound to the exact operation (docs/contract.md §6).
//!
//! A route's policy decides, from the validated command, that a human must
//! look first, and says what the human judges ([`ApprovalSummary`]). Such an
//! attempt claims the key *as* `awaiting_approval` with an approval record,
//! and answers 202 with the approval request; matching retries get that 202
//! back. An approver of the same account — never the requester — decides,
//! echoing the fingerprint they saw.
//!
//! **An approved operation runs on the next matching retry**, not at once:
//! the service keeps no request bodies, so only a retry carries the command
//! again — and its fingerprint must still be the approved one (a changed
//! body is another fingerprint, so another operation with its own approval).
//! The attempt that runs it re-checks, inside the transaction of the effect,
//! that the approval is this operation's, for this fingerprint, approved and
//! not expired. A rejection, or an approval that expires (pending, or approved
//! but not run in time), leaves the operation `rejected` with 409
//! `approval_rejected` / `approval_expired` as its stored answer.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use platform::{ApiError, Db, Principal, Role, Timestamp, Tx, on_pool, on_tx};
use serde::{Deserialize, Serialize};
use sqlx::Row;

use crate::{
    Idempotency,
    audit::{self, AuditEvent},
    execute::problem_response,
    fingerprint::Fingerprint,
    operation::{OperationState, status_url},
    store::{self, Completion},
};

/// What a human needs to judge one operation: what it does, to what, what
/// follows from it, and the identifiers to check it by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApprovalSummary {
    #[schema(example = "create an urgent ticket")]
    pub action: String,
    #[schema(example = "project payments-api")]
    pub target: String,
    #[schema(example = "pages the on-call engineer of the project at once")]
    pub consequences: String,
    /// Named values to check the request by (project, title; amount, payee; digest, environment…).
    pub identifiers: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Waiting for a decision, and not yet past `expires_at`.
    Pending,
    Approved,
    Rejected,
    /// Nobody decided before `expires_at`.
    Expired,
}

impl ApprovalState {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Rejected => "rejected",
            ApprovalState::Expired => "expired",
        }
    }
}

/// What an approver decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approve,
    Reject,
}

impl Decision {
    fn state(self) -> ApprovalState {
        match self {
            Decision::Approve => ApprovalState::Approved,
            Decision::Reject => ApprovalState::Rejected,
        }
    }
}

/// One row of `idempotency_approvals`.
#[derive(Debug, Clone)]
pub struct ApprovalRecord {
    pub seq: i64,
    pub approval_id: String,
    pub account_id: String,
    pub operation_id: String,
    pub idempotency_key: String,
    pub route: String,
    pub fingerprint: Fingerprint,
    pub summary: ApprovalSummary,
    pub requested_by: String,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
    /// `None` while pending.
    pub decision: Option<ApprovalState>,
    pub decided_by: Option<String>,
    pub decided_at: Option<Timestamp>,
}

impl ApprovalRecord {
    /// The state as of `now`: a pending approval past its expiry is expired
    /// even before anything has marked it so.
    pub fn state(&self, now: Timestamp) -> ApprovalState {
        match self.decision {
            Some(decided) => decided,
            None if self.expires_at <= now => ApprovalState::Expired,
            None => ApprovalState::Pending,
        }
    }

    pub fn url(&self) -> String {
        approval_url(&self.approval_id)
    }
}

pub fn approval_url(approval_id: &str) -> String {
    format!("/v1/approvals/{approval_id}")
}

/// A new public approval id: `apr_` and a time-ordered UUID.
pub fn new_approval_id() -> String {
    format!("apr_{}", uuid::Uuid::now_v7().simple())
}

/// A summary field as a human may safely read it: every character that
/// does not show as itself written out as a visible escape (`\u202E`), so
/// that `Acme GmbH \u{202E}liveD` cannot pass for `Acme GmbH Devil`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revealed {
    pub text: String,
    /// Whether anything was escaped: the field deserves a mark.
    pub escaped: bool,
}

impl Revealed {
    pub fn of(text: &str) -> Self {
        let mut revealed = Revealed {
            text: String::with_capacity(text.len()),
            escaped: false,
        };
        for c in text.chars() {
            if is_hidden(c) {
                revealed.escaped = true;
                revealed.text.push_str(&escape_char(c));
            } else {
                revealed.text.push(c);
            }
        }
        revealed
    }
}

/// `\u202E`; beyond the Basic Multilingual Plane `\u{E0041}`, so the digits cannot run into the text.
fn escape_char(c: char) -> String {
    match u32::from(c) {
        code @ 0..=0xFFFF => format!("\\u{code:04X}"),
        code => format!("\\u{{{code:X}}}"),
    }
}

/// Characters that show as nothing, or as something else: controls (Cc),
/// bidirectional controls that reorder what follows them, and zero-width
/// and other invisible characters.
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(c,
            // bidirectional: marks, embeddings and overrides, isolates
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
            // zero-width and invisible: spaces, joiners, word joiner and invisible operators, BOM
            | '\u{00AD}' | '\u{034F}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}' | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200D}' | '\u{2060}'..='\u{2064}' | '\u{206A}'..='\u{206F}' | '\u{3164}'
            | '\u{FEFF}' | '\u{FFA0}' | '\u{FFF9}'..='\u{FFFB}' | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            // line and paragraph separators, and tags, which can smuggle text no one sees
            | '\u{2028}' | '\u{2029}' | '\u{E0000}'..='\u{E007F}')
}

/// The 202 answer of an operation that waits for a human: stored, and
/// replayed unchanged to every matching retry while it waits.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApprovalRequested {
    pub approval_id: String,
    pub operation_id: String,
    pub idempotency_key: String,
    /// The fingerprint an approver must echo with the decision.
    pub fingerprint: String,
    /// `awaiting_approval`
    pub state: OperationState,
    pub summary: ApprovalSummary,
    pub expires_at: Timestamp,
    /// The operation: poll it to learn the decision, then retry with the same key and body.
    pub status_url: String,
    pub approval_url: String,
}

/// The 202 of an operation that the policy may give to a human: the accepted
/// resource, or the approval request. It names the two shapes for the OpenAPI
/// document; handlers build either one directly.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum AcceptedOrAwaitingApproval<T: utoipa::ToSchema> {
    Accepted(T),
    AwaitingApproval(Box<ApprovalRequested>),
}

/// An approval as approvers (and the operation status) see it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApprovalView {
    #[schema(example = "apr_0193a1b2c3d4e5f60718293a4b5c6d7e")]
    pub id: String,
    pub approval_id: String,
    pub operation_id: String,
    pub idempotency_key: String,
    pub route: String,
    pub fingerprint: String,
    pub summary: ApprovalSummary,
    pub requested_by: String,
    pub state: ApprovalState,
    pub expires_at: Timestamp,
    pub decided_by: Option<String>,
    pub decided_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub url: String,
    pub status_url: String,
}

impl ApprovalView {
    pub fn of(record: ApprovalRecord, now: Timestamp) -> Self {
        ApprovalView {
            id: record.approval_id.clone(),
            state: record.state(now),
            url: record.url(),
            status_url: status_url(&record.operation_id),
            updated_at: record.decided_at.unwrap_or(record.created_at),
            approval_id: record.approval_id,
            operation_id: record.operation_id,
            idempotency_key: record.idempotency_key,
            route: record.route,
            fingerprint: record.fingerprint.as_str().to_owned(),
            summary: record.summary,
            requested_by: record.requested_by,
            expires_at: record.expires_at,
            decided_by: record.decided_by,
            decided_at: record.decided_at,
            created_at: record.created_at,
        }
    }
}

/// The answer stored for an operation whose approval was refused or ran out.
pub fn refusal(state: ApprovalState, operation_id: &str, approval_id: &str) -> ApiError {
    let error = match state {
        ApprovalState::Rejected => ApiError::new(
            StatusCode::CONFLICT,
            "approval_rejected",
            "Approval rejected",
            "a human rejected this operation; it will never run. A new intention needs a new key",
        ),
        _ => ApiError::new(
            StatusCode::CONFLICT,
            "approval_expired",
            "Approval expired",
            "this operation was not approved and run before its approval expired; it will never run. A new attempt needs a new key",
        ),
    };
    error
        .with("operation_id", operation_id)
        .with("approval_id", approval_id)
        .with("state", OperationState::Rejected)
        .with("status_url", status_url(operation_id))
}

/// Whether an approval still allows its operation to run, checked by the
/// attempt that runs it inside the effect's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionCheck {
    Allowed,
    /// Not approved: rejected, still pending, or for another operation or fingerprint.
    Refused,
    Expired,
}

// ---- the approvals table -------------------------------------------------

const COLUMNS: &str = "seq, approval_id, account_id, operation_id, idempotency_key, route, fingerprint, summary, \
     requested_by, created_at, expires_at, decision, decided_by, decided_at";

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
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(approval_id)
            .fetch_optional(pool)
            .await?
            .map(|row| decode(&row))
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

/// The account's approvals after `after_seq` in creation order, in `state` if given (as of `now`).
pub async fn list(
    db: &Db,
    account_id: &str,
    state: Option<ApprovalState>,
    now: Timestamp,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<ApprovalRecord>, sqlx::Error> {
    let condition = in_state(state, "$4");
    // `$4 IS NOT NULL` keeps the parameter bound in every variant
    let sql = format!(
        "SELECT {COLUMNS} FROM idempotency_approvals \
         WHERE account_id = $1 AND seq > $2 AND {condition} AND $4 IS NOT NULL ORDER BY seq LIMIT $3"
    );
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(after_seq)
            .bind(limit)
            .bind(now)
            .fetch_all(pool)
            .await?
            .iter()
            .map(decode)
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
async fn due(db: &Db, now: Timestamp, limit: i64) -> Result<Vec<ApprovalRecord>, sqlx::Error> {
    let columns = COLUMNS.replace(", ", ", a.");
    let sql = format!(
        "SELECT a.{columns} FROM idempotency_approvals a \
         JOIN idempotency_operations o ON o.operation_id = a.operation_id \
         WHERE o.state = 'awaiting_approval' AND a.expires_at <= $1 \
           AND (a.decision IS NULL OR a.decision = 'approved') \
         ORDER BY a.seq LIMIT $2"
    );
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(now)
            .bind(limit)
            .fetch_all(pool)
            .await?
            .iter()
            .map(decode)
            .collect::<Result<Vec<_>, _>>()?
    }))
}

/// Records a decision: compare-and-set on a pending, unexpired approval
/// whose fingerprint is the one the approver saw and whose requester is not
/// the approver. `false`: one of those did not hold, and nothing changed.
async fn record_decision(
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
        .bind(decision.as_str())
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
async fn record_expiry(tx: &mut Tx, approval: &ApprovalRecord, now: Timestamp) -> Result<bool, sqlx::Error> {
    let changed = on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE idempotency_approvals SET decision = 'expired', decided_at = $2 \
             WHERE approval_id = $1 AND decision IS NULL AND expires_at <= $2",
        )
        .bind(&approval.approval_id)
        .bind(now)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(changed == 1)
}

/// The execution-time check (docs/contract.md §6), inside the effect's
/// transaction. A decision never changes once made, so what this reads holds to
/// the commit.
pub(crate) async fn check_for_execution(
    tx: &mut Tx,
    approval_id: &str,
    operation_id: &str,
    fingerprint: &Fingerprint,
    now: Timestamp,
) -> Result<ExecutionCheck, sqlx::Error> {
    let row: Option<(String, String, Option<String>, Timestamp)> = on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT operation_id, fingerprint, decision, expires_at FROM idempotency_approvals WHERE approval_id = $1",
        )
        .bind(approval_id)
        .fetch_optional(conn)
        .await?
    });
    Ok(match row {
        Some((op, fp, Some(decision), expires_at))
            if op == operation_id && fp == fingerprint.as_str() && decision == "approved" =>
        {
            if expires_at > now {
                ExecutionCheck::Allowed
            } else {
                ExecutionCheck::Expired
            }
        }
        Some((_, _, None, expires_at)) if expires_at <= now => ExecutionCheck::Expired,
        Some((_, _, Some(decision), _)) if decision == "expired" => ExecutionCheck::Expired,
        _ => ExecutionCheck::Refused,
    })
}

fn decode<R>(row: &R) -> Result<ApprovalRecord, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<Timestamp>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let corrupt = |what: &str| sqlx::Error::Decode(format!("idempotency_approvals: {what}").into());
    let summary: String = row.try_get("summary")?;
    let decision = match row.try_get::<Option<String>, _>("decision")?.as_deref() {
        None => None,
        Some("approved") => Some(ApprovalState::Approved),
        Some("rejected") => Some(ApprovalState::Rejected),
        Some("expired") => Some(ApprovalState::Expired),
        Some(_) => return Err(corrupt("unknown decision")),
    };
    Ok(ApprovalRecord {
        seq: row.try_get("seq")?,
        approval_id: row.try_get("approval_id")?,
        account_id: row.try_get("account_id")?,
        operation_id: row.try_get("operation_id")?,
        idempotency_key: row.try_get("idempotency_key")?,
        route: row.try_get("route")?,
        fingerprint: Fingerprint::from_stored(row.try_get("fingerprint")?),
        summary: serde_json::from_str(&summary).map_err(|_| corrupt("summary is not JSON"))?,
        requested_by: row.try_get("requested_by")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        decision,
        decided_by: row.try_get("decided_by")?,
        decided_at: row.try_get("decided_at")?,
    })
}

// ---- deciding --------------------------------------------------------------

/// Who records an expiry in the journal: nobody decided.
const EXPIRY_PRINCIPAL: &str = "retrysafe:expiry";

impl Idempotency {
    /// `POST /v1/approvals/{id}/decision`: an approver's decision, bound to
    /// the fingerprint they saw. Repeating the decision already made by the
    /// same approver answers it again (a lost response is retried safely);
    /// any other decision on a decided approval is 409 `invalid_state`.
    pub async fn decide_approval(
        &self,
        principal: &Principal,
        approval_id: &str,
        decision: Decision,
        echoed_fingerprint: &str,
    ) -> Result<ApprovalView, ApiError> {
        may_decide(principal)?;
        let not_found = || ApiError::not_found(format!("approval `{approval_id}`"));
        let approval = find(&self.db, &principal.account_id, approval_id)
            .await?
            .ok_or_else(not_found)?;
        if approval.requested_by == principal.principal_id {
            return Err(ApiError::forbidden(
                "the principal that requested an operation may not approve it; another approver must decide",
            ));
        }
        if approval.state(Timestamp::now()) != ApprovalState::Pending {
            return self.answer_decided(approval, principal, decision).await;
        }
        if echoed_fingerprint != approval.fingerprint.as_str() {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "approval_fingerprint_mismatch",
                "Fingerprint mismatch",
                "the fingerprint sent is not the operation's: the decision must be about the exact request waiting. Nothing was decided",
            )
            .with("approval_id", &approval.approval_id)
            .with("fingerprint", approval.fingerprint.as_str()));
        }

        let mut tx = self.db.begin().await?;
        // the time of the decision is taken once the write lock is held
        let now = Timestamp::now();
        if !record_decision(
            &mut tx,
            &approval,
            decision.state(),
            &principal.principal_id,
            echoed_fingerprint,
            now,
        )
        .await?
        {
            // decided (by this very decision sent twice at once, too) or expired between the read and the write
            let _ = tx.rollback().await;
            let current = find(&self.db, &principal.account_id, approval_id)
                .await?
                .ok_or_else(not_found)?;
            return self.answer_decided(current, principal, decision).await;
        }
        let event = match decision {
            Decision::Approve => AuditEvent::Approved,
            Decision::Reject => AuditEvent::Rejected,
        };
        if decision == Decision::Reject {
            // the operation ends here: its answer from now on is the refusal
            self.settle(&mut tx, &approval, ApprovalState::Rejected, now).await?;
        }
        audit::record(&mut tx, &[approval.audit(event, &principal.principal_id, now)]).await?;
        tx.commit().await?;
        let decided = find(&self.db, &principal.account_id, approval_id)
            .await?
            .ok_or_else(not_found)?;
        Ok(ApprovalView::of(decided, Timestamp::now()))
    }

    /// The answer to a decision on an approval that is no longer pending. The
    /// same approver repeating the decision made gets it again, however the
    /// repeats interleave (a lost response retried, a request sent twice at
    /// once); any other decision is 409 `invalid_state`, and one on an
    /// approval past its expiry is the `approval_expired` refusal.
    async fn answer_decided(
        &self,
        approval: ApprovalRecord,
        principal: &Principal,
        decision: Decision,
    ) -> Result<ApprovalView, ApiError> {
        let now = Timestamp::now();
        match approval.state(now) {
            ApprovalState::Expired => {
                self.expire(&approval).await?;
                Err(refusal(
                    ApprovalState::Expired,
                    &approval.operation_id,
                    &approval.approval_id,
                ))
            }
            decided
                if decided == decision.state() && approval.decided_by.as_deref() == Some(&principal.principal_id) =>
            {
                Ok(ApprovalView::of(approval, now))
            }
            state => Err(ApiError::invalid_state(format!(
                "this approval is {}; a decision is made once",
                state.as_str()
            ))
            .with("approval_id", &approval.approval_id)
            .with("state", state)),
        }
    }

    /// Ends an operation whose approval ran out: a pending approval is
    /// marked expired; the operation, if it still waits (an approved one no
    /// retry ran in time, too), becomes `rejected` with the `approval_expired`
    /// answer. Nothing if it was decided, or started, meanwhile.
    pub(crate) async fn expire(&self, approval: &ApprovalRecord) -> Result<(), sqlx::Error> {
        let mut tx = self.db.begin().await?;
        let now = Timestamp::now();
        if approval.expires_at > now {
            return tx.rollback().await;
        }
        let pending = approval.decision.is_none();
        if pending && !record_expiry(&mut tx, approval, now).await? {
            // decided between the read and now: the decision stands
            return tx.rollback().await;
        }
        // compare-and-set on `awaiting_approval`: an approved operation a retry just started is left to run
        let settled = self.settle(&mut tx, approval, ApprovalState::Expired, now).await?;
        if !pending && !settled {
            return tx.rollback().await;
        }
        audit::record(&mut tx, &[approval.audit(AuditEvent::Expired, EXPIRY_PRINCIPAL, now)]).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Expires every pending approval past its time (run by the reaper).
    pub async fn expire_due_approvals(&self) -> Result<usize, sqlx::Error> {
        let due = due(&self.db, Timestamp::now(), 500).await?;
        for approval in &due {
            self.expire(approval).await?;
        }
        Ok(due.len())
    }

    /// Ends an operation waiting for its approval with the refusal as its
    /// answer. `false`: it was not waiting any more.
    async fn settle(
        &self,
        tx: &mut Tx,
        approval: &ApprovalRecord,
        state: ApprovalState,
        now: Timestamp,
    ) -> Result<bool, sqlx::Error> {
        let response = problem_response(&refusal(state, &approval.operation_id, &approval.approval_id));
        let completion = Completion {
            state: OperationState::Rejected,
            response: &response,
            resource: None,
            external_ref: None,
            now,
        };
        store::settle_awaiting(tx, &approval.account_id, &approval.operation_id, &completion).await
    }
}

impl ApprovalRecord {
    fn audit(&self, event: AuditEvent, principal_id: &str, at: Timestamp) -> audit::Record {
        audit::Record {
            account_id: self.account_id.clone(),
            principal_id: principal_id.to_owned(),
            operation_id: Some(self.operation_id.clone()),
            idempotency_key: Some(self.idempotency_key.clone()),
            fingerprint: Some(self.fingerprint.as_str().to_owned()),
            route: Some(self.route.clone()),
            event,
            external_ref: None,
            at,
            change: None,
        }
    }
}

/// Only an approver decides (docs/contract.md §6): anyone else is refused
/// before anything is looked up or claimed.
pub fn may_decide(principal: &Principal) -> Result<(), ApiError> {
    if principal.role == Role::Approver {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "only a principal with the role `approver` may decide on an approval",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_shown_as_it_is_and_unmarked() {
        let shown = Revealed::of("Acme GmbH — Zürich, 1 000 € «ok» 東京 👍");
        assert_eq!(shown.text, "Acme GmbH — Zürich, 1 000 € «ok» 東京 👍");
        assert!(!shown.escaped);
    }

    #[test]
    fn control_characters_are_shown_as_escapes() {
        let shown = Revealed::of("a\u{0}b\tc\nd\re\u{1B}[31mf\u{7F}g\u{85}h\u{9F}");
        assert_eq!(
            shown.text,
            r"a\u0000b\u0009c\u000Ad\u000De\u001B[31mf\u007Fg\u0085h\u009F"
        );
        assert!(shown.escaped);
    }

    #[test]
    fn bidirectional_controls_are_shown_as_escapes() {
        let shown = Revealed::of("Acme GmbH \u{202E}liveD\u{202C}");
        assert_eq!(shown.text, r"Acme GmbH \u202EliveD\u202C");
        assert!(shown.escaped);
        for c in [
            '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202D}', '\u{2066}', '\u{2067}', '\u{2068}',
            '\u{2069}',
        ] {
            assert_eq!(Revealed::of(&c.to_string()).text, format!("\\u{:04X}", u32::from(c)));
        }
    }

    #[test]
    fn zero_width_and_invisible_characters_are_shown_as_escapes() {
        let shown = Revealed::of("pay\u{200B}pal\u{FEFF}");
        assert_eq!(shown.text, r"pay\u200Bpal\uFEFF");
        assert!(shown.escaped);
        for c in [
            '\u{00AD}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{2063}', '\u{3164}', '\u{2028}', '\u{2029}',
        ] {
            assert!(Revealed::of(&c.to_string()).escaped, "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn characters_beyond_the_basic_plane_are_escaped_with_braces() {
        // a tag character spells text no one sees
        let shown = Revealed::of("ok\u{E0041}");
        assert_eq!(shown.text, r"ok\u{E0041}");
        assert!(shown.escaped);
    }
}

//! SQLite only: a claim that finishes in its own transaction keeps its
//! journal records in its operation row (`attempted_at`, `claimed_state`);
//! the chainer makes the entries from there, in claim order (`seq`).

use platform::Timestamp;
use sqlx::Row;

use crate::operation::OperationState;

use super::chain::{AuditEvent, Record};

/// The records of a claim that finished in its own transaction (the create's
/// hot path): the attempt, at `attempted_at`; the claim; and, if the answer
/// the claim stored is final, the outcome — completed or failed (none while
/// the outbox works on it). `record` makes one record of the operation.
///
/// PostgreSQL records them in the inbox, in the claim's own statement. SQLite
/// keeps them in the operation row (`attempted_at`, `claimed_state`), and the
/// chain round makes them from it: SQLite writes every page a transaction
/// changed into its log at commit, and the journal's pages (the table and its
/// two indexes) were as many as the claim's own; a round links hundreds of
/// claims in a few pages.
pub fn finished_claim(
    record: impl Fn(AuditEvent, Timestamp) -> Record,
    attempted_at: Timestamp,
    claimed_at: Timestamp,
    claimed_state: OperationState,
) -> Vec<Record> {
    let outcome = match claimed_state {
        OperationState::Completed => Some(AuditEvent::Completed),
        OperationState::Failed => Some(AuditEvent::Failed),
        _ => None,
    };
    [(AuditEvent::Attempted, attempted_at), (AuditEvent::Claimed, claimed_at)]
        .into_iter()
        .chain(outcome.map(|event| (event, claimed_at)))
        .map(|(event, at)| record(event, at))
        .collect()
}

/// SQLite: the records of the claims above the mark (`audit_progress`), and
/// the highest `seq` read (every operation up to it has been looked at; only
/// some carry a claim to link).
pub(super) struct Claims {
    pub(super) after: i64,
    pub(super) upto: i64,
    pub(super) records: Vec<Record>,
}

/// Every claim `seq` at or below it is linked.
pub(super) const CLAIMS_MARK: &str = "SELECT operations_seq FROM audit_progress";

/// The claims above the mark, in `seq` order, each row with the mark and the
/// highest `seq` there is (a row with no claim when there is none above the
/// mark). One statement, so one moment: `seq` is AUTOINCREMENT and SQLite has
/// one writer, so an operation that commits later always has a higher `seq`
/// than `upto`, and the mark can move there. Operations journaled otherwise
/// (a lease, an approval, a bulk import) are passed over in the database.
pub(super) async fn unlinked_claims(conn: &mut sqlx::SqliteConnection) -> Result<Claims, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT p.operations_seq AS mark, (SELECT max(seq) FROM idempotency_operations) AS upto, \
                o.account_id, o.principal_id, o.operation_id, o.idempotency_key, o.fingerprint, o.route, \
                o.attempted_at, o.created_at, o.claimed_state \
         FROM audit_progress p LEFT JOIN idempotency_operations o \
              ON o.seq > p.operations_seq AND o.claimed_state IS NOT NULL \
         ORDER BY o.seq",
    )
    .fetch_all(conn)
    .await?;
    let Some(first) = rows.first() else {
        return Err(sqlx::Error::Protocol("audit_progress has no row".into()));
    };
    let after: i64 = first.try_get("mark")?;
    let upto: Option<i64> = first.try_get("upto")?;
    let mut claims = Claims {
        after,
        upto: upto.unwrap_or(after).max(after),
        records: Vec::new(),
    };
    for row in &rows {
        let (Some(claimed_state), Some(attempted_at)) = (
            row.try_get::<Option<String>, _>("claimed_state")?,
            row.try_get("attempted_at")?,
        ) else {
            continue; // the mark's own row: no claim above it
        };
        let claimed_state = OperationState::parse(&claimed_state)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown claimed_state `{claimed_state}`").into()))?;
        let claim = Record {
            account_id: row.try_get("account_id")?,
            principal_id: row.try_get("principal_id")?,
            operation_id: Some(row.try_get("operation_id")?),
            idempotency_key: Some(row.try_get("idempotency_key")?),
            fingerprint: Some(row.try_get("fingerprint")?),
            route: Some(row.try_get("route")?),
            event: AuditEvent::Claimed,
            external_ref: None,
            at: attempted_at,
            change: None,
        };
        let record = |event, at| Record {
            event,
            at,
            ..claim.clone()
        };
        claims.records.extend(finished_claim(
            record,
            attempted_at,
            row.try_get("created_at")?,
            claimed_state,
        ));
    }
    Ok(claims)
}

//! What the outbox shows of an operation's delivery, and which operations
//! wait for a person: the reads behind the operation status, the lists of
//! unknown operations and dead events, and the tests' and tools' look at an
//! event.

use idempotency::status::{EventState, NeedsAPerson};
use platform::Timestamp;

/// The state of an operation's event and how many times it was sent (for
/// tests and tools).
pub async fn event_of(
    db: &platform::Db,
    account_id: &str,
    operation_id: &str,
) -> Result<Option<(EventState, i32)>, sqlx::Error> {
    let row: Option<(String, i32)> = platform::on_pool!(db.read(), |pool| {
        sqlx::query_as("SELECT state, deliveries FROM idempotency_outbox WHERE account_id = $1 AND operation_id = $2")
            .bind(account_id)
            .bind(operation_id)
            .fetch_optional(pool)
            .await?
    });
    Ok(row.and_then(|(state, deliveries)| Some((state.parse().ok()?, deliveries))))
}

/// An operation's delivery as its status shows it: the event's state, why
/// its last try came to nothing (if it did), the external reference, and
/// until when a worker or the reconciler holds it (if one does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryStatus {
    pub state: EventState,
    pub last_error: Option<String>,
    pub external_ref: Option<String>,
    pub held_until: Option<Timestamp>,
}

pub(crate) async fn delivery_of(
    db: &platform::Db,
    account_id: &str,
    operation_id: &str,
) -> Result<Option<DeliveryStatus>, sqlx::Error> {
    type Row = (String, Option<String>, Option<String>, Option<String>, Timestamp);
    let row: Option<Row> = platform::on_pool!(db.read(), |pool| {
        sqlx::query_as(
            "SELECT state, last_error, external_ref, lease_token, next_attempt_at FROM idempotency_outbox \
             WHERE account_id = $1 AND operation_id = $2",
        )
        .bind(account_id)
        .bind(operation_id)
        .fetch_optional(pool)
        .await?
    });
    Ok(
        row.and_then(|(state, last_error, external_ref, lease_token, next_attempt_at)| {
            Some(DeliveryStatus {
                state: state.parse().ok()?,
                last_error,
                external_ref,
                held_until: lease_token.map(|_| next_attempt_at),
            })
        }),
    )
}

/// A page of the account's operations that need a person, by their event's
/// number (every such operation has an event): `(seq, operation_id)`.
pub(crate) async fn needing_a_person(
    db: &platform::Db,
    account_id: &str,
    which: NeedsAPerson,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<(i64, String)>, sqlx::Error> {
    let condition = match (which.unknown, which.dead) {
        (false, false) => "(op.state = 'unknown' OR o.state = 'dead')",
        (true, false) => "op.state = 'unknown'",
        (false, true) => "o.state = 'dead'",
        (true, true) => "op.state = 'unknown' AND o.state = 'dead'",
    };
    // an unknown operation's event is never delivered or failed: the index's condition
    let sql = format!(
        "SELECT o.seq, o.operation_id FROM idempotency_outbox o \
         JOIN idempotency_operations op ON op.account_id = o.account_id AND op.operation_id = o.operation_id \
         WHERE o.account_id = $1 AND o.seq > $2 AND o.state NOT IN ('delivered', 'failed') AND {condition} \
         ORDER BY o.seq LIMIT $3"
    );
    Ok(platform::on_pool!(db.read(), |pool| {
        sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(account_id)
            .bind(after_seq)
            .bind(limit)
            .fetch_all(pool)
            .await?
    }))
}

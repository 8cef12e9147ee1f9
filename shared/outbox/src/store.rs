//! The outbox's SQL: one function per statement, each written once for both
//! backends (docs/design.md §9). Every write to a held event is a
//! compare-and-set on its lease token (docs/design.md §5); the two endings of
//! an operation the outbox settles (`settle_external`, `settle_unknown`) are
//! compare-and-sets on the operation's state.

use idempotency::{BoxFuture, OperationIdentity, OperationState, handoff::Handoff, status::EventState};
use platform::{Timestamp, Tx, on_tx};

use crate::event::{Event, OutboxEvent, external_key};

/// An event is written as the effect's handed-on work, in its transaction.
impl Handoff for Event {
    fn write<'a>(
        &'a self,
        tx: &'a mut Tx,
        of: OperationIdentity<'a>,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(enqueue(tx, of, self, now))
    }
}

/// Writes `event` as a pending event of its operation, inside the
/// transaction of the effect that made it: the event exists if and only if
/// the effect and the operation's answer do.
async fn enqueue(tx: &mut Tx, of: OperationIdentity<'_>, event: &Event, now: Timestamp) -> Result<(), sqlx::Error> {
    let payload = event
        .payload
        .as_ref()
        .map_err(|e| sqlx::Error::Protocol(format!("the `{}` event's payload does not serialise: {e}", event.kind)))?;
    on_tx!(tx, |conn| {
        sqlx::query(
            "INSERT INTO idempotency_outbox \
             (event_id, account_id, operation_id, idempotency_key, fingerprint, route, kind, payload, external_key, \
              state, next_attempt_at, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', $10, $10, $10)",
        )
        .bind(format!("evt_{}", uuid::Uuid::now_v7().simple()))
        .bind(of.account_id)
        .bind(of.operation_id)
        .bind(of.idempotency_key)
        .bind(of.fingerprint)
        .bind(of.route)
        .bind(event.kind)
        .bind(payload.to_string())
        .bind(external_key(&of))
        .bind(now)
        .execute(conn)
        .await?;
    });
    Ok(())
}

macro_rules! event_columns {
    () => {
        "event_id, account_id, operation_id, idempotency_key, fingerprint, route, kind, payload, external_key, \
         state, deliveries, failures, lease_token"
    };
}

/// [`take_due`]'s statement, for PostgreSQL or SQLite.
fn take_due_sql(states: &[EventState], send: bool, postgres: bool) -> String {
    let states = states
        .iter()
        .map(|s| format!("'{}'", s.into_str()))
        .collect::<Vec<_>>()
        .join(", ");
    let set = if send {
        "state = 'sending', deliveries = deliveries + 1,"
    } else {
        ""
    };
    let skip_locked = if postgres { "FOR UPDATE SKIP LOCKED" } else { "" };
    // the condition twice: the inner one picks the events, the outer one is
    // checked again on each row as it is written, so an event another worker
    // took in between is left alone
    let due = format!("state IN ({states}) AND next_attempt_at <= $3");
    // the due index's own WHERE, as SQLite's migration spells it: SQLite reads
    // a partial index only for a query whose WHERE holds that very term
    let unsettled = "(state = 'pending' OR state = 'sending' OR state = 'unknown')";
    format!(
        "UPDATE idempotency_outbox SET {set} lease_token = $1, next_attempt_at = $2, updated_at = $3 \
         WHERE {due} AND (account_id, seq) IN (SELECT account_id, seq FROM idempotency_outbox \
                                                WHERE {due} AND {unsettled} \
                                                ORDER BY next_attempt_at LIMIT $4 {skip_locked}) \
         RETURNING {}",
        event_columns!()
    )
}

/// Takes due events in `states` under a new lease (until `until`): one
/// statement, so two workers never take the same event (PostgreSQL skips rows
/// another transaction holds; SQLite has one writer). `send`: they are being
/// sent now — `sending`, and one more delivery counted.
pub(crate) async fn take_due(
    tx: &mut Tx,
    states: &[EventState],
    send: bool,
    token: &str,
    until: Timestamp,
    now: Timestamp,
    batch: i64,
) -> Result<Vec<OutboxEvent>, sqlx::Error> {
    let sql = take_due_sql(states, send, matches!(tx, Tx::Postgres(_)));
    let taken = on_tx!(tx, |conn| {
        sqlx::query_as::<_, EventRow>(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(token)
            .bind(until)
            .bind(now)
            .bind(batch)
            .fetch_all(conn)
            .await?
            .into_iter()
            .map(OutboxEvent::try_from)
            .collect::<Result<Vec<_>, _>>()?
    });
    Ok(taken)
}

/// What an event is let go as: its new state, failures, when it is due, and
/// what it keeps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LetGo<'a> {
    pub state: EventState,
    pub failures: i32,
    pub next_attempt_at: Timestamp,
    pub external_ref: Option<&'a str>,
    pub last_error: Option<&'a str>,
}

/// Lets go of an event this holder took, in its new state: compare-and-set on
/// the lease token. `false`: the lease ran out and another holder has it.
pub(crate) async fn let_go(
    tx: &mut Tx,
    event: &OutboxEvent,
    to: LetGo<'_>,
    now: Timestamp,
) -> Result<bool, sqlx::Error> {
    let released = on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE idempotency_outbox SET state = $3, failures = $4, lease_token = NULL, next_attempt_at = $5, \
             external_ref = COALESCE($6, external_ref), last_error = $7, updated_at = $8 \
             WHERE account_id = $9 AND event_id = $1 AND lease_token = $2",
        )
        .bind(&event.event_id)
        .bind(&event.lease_token)
        .bind(to.state.into_str())
        .bind(to.failures)
        .bind(to.next_attempt_at)
        .bind(to.external_ref)
        .bind(to.last_error)
        .bind(now)
        .bind(&event.account_id)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(released == 1)
}

/// Counts a settlement of a held event that could not be written, under the
/// same compare-and-set on its lease: the holder keeps it (it is taken again
/// when the lease ends) until it reaches `max_failures`, and then it is
/// `dead`. `Some(dead)`: counted; `None`: the lease ran out.
pub(crate) async fn count_failed_settlement(
    tx: &mut Tx,
    event: &OutboxEvent,
    last_error: &str,
    max_failures: i32,
    now: Timestamp,
) -> Result<Option<bool>, sqlx::Error> {
    let counted: Option<String> = on_tx!(tx, |conn| {
        sqlx::query_scalar(
            "UPDATE idempotency_outbox SET failures = failures + 1, last_error = $3, updated_at = $4, \
             state = CASE WHEN failures + 1 >= $5 THEN 'dead' ELSE state END, \
             lease_token = CASE WHEN failures + 1 >= $5 THEN NULL ELSE lease_token END \
             WHERE account_id = $6 AND event_id = $1 AND lease_token = $2 RETURNING state",
        )
        .bind(&event.event_id)
        .bind(&event.lease_token)
        .bind(last_error)
        .bind(now)
        .bind(max_failures)
        .bind(&event.account_id)
        .fetch_optional(conn)
        .await?
    });
    Ok(counted.map(|state| state == EventState::Dead.into_str()))
}

/// An event a person may settle by hand, as of `$now`: from any state but a
/// final one, provided no worker or reconciler holds it under a live lease
/// (one that may be hearing from the external system right now).
macro_rules! settleable_by_hand {
    ($now:literal) => {
        concat!(
            "state IN ('pending', 'sending', 'unknown', 'dead') AND (lease_token IS NULL OR next_attempt_at <= ",
            $now,
            ")"
        )
    };
}

/// The event of an `unknown` operation that a person may settle now (see
/// [`settle_by_hand`]), read to ask the external system about it before the
/// settling transaction. `None`: the operation is not `unknown`, has no
/// event, or its event is held.
pub(crate) async fn settleable_event(
    db: &platform::Db,
    account_id: &str,
    operation_id: &str,
    now: Timestamp,
) -> Result<Option<OutboxEvent>, sqlx::Error> {
    const SQL: &str = concat!(
        "SELECT ",
        event_columns!(),
        " FROM idempotency_outbox o WHERE account_id = $1 AND operation_id = $2 AND ",
        settleable_by_hand!("$3"),
        " AND EXISTS (SELECT 1 FROM idempotency_operations op \
           WHERE op.account_id = o.account_id AND op.operation_id = o.operation_id AND op.state = 'unknown')"
    );
    let found = platform::on_pool!(db.read(), |pool| {
        sqlx::query_as::<_, EventRow>(SQL)
            .bind(account_id)
            .bind(operation_id)
            .bind(now)
            .fetch_optional(pool)
            .await?
            .map(OutboxEvent::try_from)
            .transpose()?
    });
    Ok(found)
}

/// What a person's settlement writes on the event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ByHand<'a> {
    pub state: EventState,
    pub external_ref: Option<&'a str>,
    pub last_error: Option<&'a str>,
}

/// Settles the event of an operation a person settled by hand, as `to`
/// says, if it may be ([`settleable_by_hand`]) and was handed to the
/// external system `deliveries` times, as when the person's evidence was
/// checked. `None`: the operation has no event, it is held, it was settled
/// already, or it was sent again since.
pub(crate) async fn settle_by_hand(
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    deliveries: i32,
    to: ByHand<'_>,
    now: Timestamp,
) -> Result<Option<OutboxEvent>, sqlx::Error> {
    const SQL: &str = concat!(
        "UPDATE idempotency_outbox SET state = $3, lease_token = NULL, external_ref = COALESCE($4, external_ref), \
         last_error = $5, updated_at = $6 \
         WHERE account_id = $1 AND operation_id = $2 AND deliveries = $7 AND ",
        settleable_by_hand!("$6"),
        " RETURNING ",
        event_columns!()
    );
    let settled = on_tx!(tx, |conn| {
        sqlx::query_as::<_, EventRow>(SQL)
            .bind(account_id)
            .bind(operation_id)
            .bind(to.state.into_str())
            .bind(to.external_ref)
            .bind(to.last_error)
            .bind(now)
            .bind(deliveries)
            .fetch_optional(conn)
            .await?
            .map(OutboxEvent::try_from)
            .transpose()?
    });
    Ok(settled)
}

/// Gives a dead event back to the reconciler, its failures forgiven: it asks
/// the external system first, and sends it again with the same key only if
/// there is no trace of it. `None`: the operation has no dead event.
pub(crate) async fn revive(
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    now: Timestamp,
) -> Result<Option<Identity>, sqlx::Error> {
    let revived = on_tx!(tx, |conn| {
        sqlx::query_as(
            "UPDATE idempotency_outbox SET state = 'unknown', failures = 0, next_attempt_at = $3, updated_at = $3 \
             WHERE account_id = $1 AND operation_id = $2 AND state = 'dead' \
             RETURNING idempotency_key, fingerprint, route",
        )
        .bind(account_id)
        .bind(operation_id)
        .bind(now)
        .fetch_optional(conn)
        .await?
    });
    Ok(revived)
}

/// The journal identity of an operation whose event is ended by the service:
/// its idempotency key, fingerprint and route.
pub(crate) type Identity = (String, String, String);

/// Fails an operation's event if it was never handed to the external system:
/// a compare-and-set on `pending` with no delivery yet. `None`: a worker has
/// it, or it was sent at least once.
pub(crate) async fn withdraw_unsent(
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    reason: &str,
    now: Timestamp,
) -> Result<Option<Identity>, sqlx::Error> {
    let withdrawn = on_tx!(tx, |conn| {
        sqlx::query_as(
            "UPDATE idempotency_outbox SET state = 'failed', last_error = $3, updated_at = $4 \
             WHERE account_id = $1 AND operation_id = $2 AND state = 'pending' AND deliveries = 0 \
             RETURNING idempotency_key, fingerprint, route",
        )
        .bind(account_id)
        .bind(operation_id)
        .bind(reason)
        .bind(now)
        .fetch_optional(conn)
        .await?
    });
    Ok(withdrawn)
}

/// An operation's event that was delivered while the operation is still in
/// progress (work that goes on at the external system), with the external
/// reference. `None`: there is no such event, or the operation has ended.
pub(crate) async fn delivered_in_progress(
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
) -> Result<Option<(Identity, Option<String>)>, sqlx::Error> {
    let found: Option<(String, String, String, Option<String>)> = on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT o.idempotency_key, o.fingerprint, o.route, o.external_ref FROM idempotency_outbox o \
             JOIN idempotency_operations op ON op.account_id = o.account_id AND op.operation_id = o.operation_id \
             WHERE o.account_id = $1 AND o.operation_id = $2 AND o.state = 'delivered' AND op.state = 'in_progress'",
        )
        .bind(account_id)
        .bind(operation_id)
        .fetch_optional(conn)
        .await?
    });
    Ok(found.map(|(key, fingerprint, route, external_ref)| ((key, fingerprint, route), external_ref)))
}

/// A row of `idempotency_outbox`, as the database has it.
#[derive(Debug, sqlx::FromRow)]
struct EventRow {
    event_id: String,
    account_id: String,
    operation_id: String,
    idempotency_key: String,
    fingerprint: String,
    route: String,
    kind: String,
    payload: String,
    external_key: String,
    state: String,
    deliveries: i32,
    failures: i32,
    lease_token: Option<String>,
}

impl TryFrom<EventRow> for OutboxEvent {
    type Error = sqlx::Error;

    fn try_from(row: EventRow) -> Result<Self, sqlx::Error> {
        let corrupt = |what: &str| sqlx::Error::Decode(format!("idempotency_outbox: {what}").into());
        Ok(OutboxEvent {
            event_id: row.event_id,
            account_id: row.account_id,
            operation_id: row.operation_id,
            idempotency_key: row.idempotency_key,
            fingerprint: row.fingerprint,
            route: row.route,
            kind: row.kind,
            payload: serde_json::from_str(&row.payload).map_err(|_| corrupt("payload is not JSON"))?,
            external_key: row.external_key,
            state: row.state.parse().map_err(|_| corrupt("unknown state"))?,
            deliveries: row.deliveries,
            failures: row.failures,
            // an event settled by hand is returned with its lease already ended
            lease_token: row.lease_token.unwrap_or_default(),
        })
    }
}

/// Settles an operation whose work was handed on ([`idempotency::handoff`]) as that
/// work ended; its answer stays the first. `false`: it was not waiting.
pub(crate) async fn settle_external(
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    state: OperationState,
    external_ref: Option<&str>,
    now: Timestamp,
) -> Result<bool, sqlx::Error> {
    let done = on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE idempotency_operations SET state = $3, external_ref = COALESCE($4, external_ref), updated_at = $5 \
             WHERE account_id = $1 AND operation_id = $2 AND lease_token IS NULL \
               AND response_status IS NOT NULL AND state IN ('in_progress', 'unknown')",
        )
        .bind(account_id)
        .bind(operation_id)
        .bind(state.into_str())
        .bind(external_ref)
        .bind(now)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(done == 1)
}

/// Settles an `unknown` operation as a person found it; its answer stays.
/// `Some`: its key, fingerprint and route, for the journal; `None`: it is no
/// longer `unknown`, or not there.
pub(crate) async fn settle_unknown(
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    state: OperationState,
    external_ref: Option<&str>,
    now: Timestamp,
) -> Result<Option<(String, String, String)>, sqlx::Error> {
    let settled = on_tx!(tx, |conn| {
        sqlx::query_as(
            "UPDATE idempotency_operations SET state = $3, external_ref = COALESCE($4, external_ref), updated_at = $5 \
             WHERE account_id = $1 AND operation_id = $2 AND state = 'unknown' \
             RETURNING idempotency_key, fingerprint, route",
        )
        .bind(account_id)
        .bind(operation_id)
        .bind(state.into_str())
        .bind(external_ref)
        .bind(now)
        .fetch_optional(conn)
        .await?
    });
    Ok(settled)
}

#[cfg(test)]
mod tests {
    use platform::{Backend, on_pool, testing::TestDb};

    use super::*;

    /// SQLite only: PostgreSQL proves the index usable from any subset of its states, and picks by cost.
    #[tokio::test]
    async fn the_scans_for_due_events_read_the_due_index_on_sqlite_not_the_whole_table() {
        let db = TestDb::new(Backend::Sqlite).await;
        db.db
            .migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS])
            .await
            .unwrap();
        let worker = take_due_sql(&[EventState::Pending], true, false);
        let reconciler = take_due_sql(&[EventState::Sending, EventState::Unknown], false, false);
        for sql in [worker, reconciler] {
            let plan: Vec<(i64, i64, i64, String)> = on_pool!(db.db.read(), |pool| {
                sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                    .fetch_all(pool)
                    .await
                    .unwrap()
            });
            let plan: Vec<String> = plan.into_iter().map(|(_, _, _, step)| step).collect();
            assert!(
                plan.iter()
                    .any(|step| step.contains("USING INDEX idempotency_outbox_due"))
                    && !plan.iter().any(|step| step.starts_with("SCAN idempotency_outbox")),
                "{plan:#?}"
            );
        }
    }
}

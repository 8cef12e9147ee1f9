//! Work that leaves the process (docs/contract.md §5): a payment provider's
//! charge, a deployment controller's rollout. A database transaction cannot
//! take back a charge once it has left, so an effect never calls the external
//! system itself. It hands the work to the outbox
//! ([`Effect::with_outbox`](crate::Effect::with_outbox)): an **event** written in
//! the same transaction as the business rows and the operation's first answer
//! (a 202). The operation then stays `in_progress`, its answer replayed to every
//! retry, until the outbox settles it.
//!
//! A **worker** ([`Outbox::deliver_due`]) sends each event through the service's
//! [`Destination`] with an external idempotency key derived from the operation
//! id ([`external_key`]) — the same on every delivery and after every restart —
//! and settles the event, the operation and the service's business rows in one
//! transaction with what the external system said:
//!
//! | the external system… | event | operation | journal |
//! |---|---|---|---|
//! | accepted it | `delivered` | `completed`, with its `external_ref` | `dispatched`, `accepted`, `completed` |
//! | refused it, finally | `failed` | `failed` | `dispatched`, `failed` |
//! | cannot have taken it (unreachable, 408, a bare 429, 401/403) | `pending` again, later, same key | unchanged | `dispatched` |
//! | may have taken it or still be at it (answer lost, 409, 425, 429 with a reason, 5xx) | `unknown` | `unknown` | `dispatched`, `unknown` |
//!
//! The **reconciler** ([`Outbox::reconcile_due`]) takes every event whose fate
//! nobody knows — an answer lost, or a worker that died holding the event — and
//! *asks* the external system, by the key or by the service's own reference:
//! found, it is settled as accepted and journaled `reconciled`; not there, it is
//! sent again with the **same** key, which the external system's own
//! idempotency makes safe. It never guesses, never sends a second, different
//! request for the same operation, and never drops an event because a worker
//! timed out.
//!
//! Events are held under a lease (a token and the time it ends) while a worker
//! or the reconciler handles them, and every settlement is a compare-and-set on
//! that token: two processes on one database never settle one event twice, and
//! a holder that dies is replaced when its lease ends.

use std::{future::Future, sync::Arc, time::Duration};

use platform::{Timestamp, Tx, on_tx};
use serde::Serialize;
use sqlx::Row;

use crate::{
    Idempotency,
    audit::{self, AuditEvent, Record},
    execute::fail_point,
    operation::OperationState,
    store,
};

/// The principal the journal names for what the worker does.
pub const WORKER: &str = "system:outbox-worker";
/// The principal the journal names for what the reconciler does.
pub const RECONCILER: &str = "system:reconciler";

/// The external idempotency key of an operation's event: derived from the
/// operation id, so every delivery of it — after any retry or restart — is
/// the same request to the external system.
pub fn external_key(operation_id: &str) -> String {
    format!("retrysafe-{operation_id}")
}

/// What an effect hands to the outbox: the kind of work, in the service's
/// words, and what the [`Destination`] needs to send it. A payload that would
/// not serialise is kept as its error: the effect then fails with a server
/// error and nothing commits, rather than an event that says nothing.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    pub kind: &'static str,
    pub payload: Result<serde_json::Value, String>,
}

impl Message {
    pub fn new(kind: &'static str, payload: &impl Serialize) -> Self {
        Message {
            kind,
            payload: serde_json::to_value(payload).map_err(|e| e.to_string()),
        }
    }
}

/// Where an event is in its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventState {
    /// To be sent (first, or again).
    Pending,
    /// A worker holds it and may have sent it.
    Sending,
    /// Sent, and the answer was lost: the reconciler asks.
    Unknown,
    Delivered,
    Failed,
}

impl EventState {
    pub fn as_str(self) -> &'static str {
        match self {
            EventState::Pending => "pending",
            EventState::Sending => "sending",
            EventState::Unknown => "unknown",
            EventState::Delivered => "delivered",
            EventState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => EventState::Pending,
            "sending" => EventState::Sending,
            "unknown" => EventState::Unknown,
            "delivered" => EventState::Delivered,
            "failed" => EventState::Failed,
            _ => return None,
        })
    }
}

/// One event, as a worker or the reconciler holds it.
#[derive(Debug, Clone)]
pub struct OutboxEvent {
    pub event_id: String,
    pub account_id: String,
    pub operation_id: String,
    pub idempotency_key: String,
    pub fingerprint: String,
    pub route: String,
    /// What to deliver, in the service's words (`capture`, `refund`, `rollout`…).
    pub kind: String,
    pub payload: serde_json::Value,
    /// The external system's idempotency key: the same on every delivery.
    pub external_key: String,
    /// Where it was when it was taken: `Sending` means a worker died holding it.
    pub state: EventState,
    /// How many times it was handed to the external system, this time included.
    pub deliveries: i32,
    lease_token: String,
}

impl OutboxEvent {
    /// A journal record of what happened to this event's operation.
    fn audit(&self, event: AuditEvent, by: &str, external_ref: Option<&str>, at: Timestamp) -> Record {
        Record {
            account_id: self.account_id.clone(),
            principal_id: by.to_owned(),
            operation_id: Some(self.operation_id.clone()),
            idempotency_key: Some(self.idempotency_key.clone()),
            fingerprint: Some(self.fingerprint.clone()),
            route: Some(self.route.clone()),
            event,
            external_ref: external_ref.map(str::to_owned),
            at,
            change: None,
        }
    }
}

/// What sending an event came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The external system took it; `external_ref` is its id for what it made.
    Accepted { external_ref: String },
    /// The external system refused it, finally; nothing happened (a business
    /// refusal: sending it again would be refused again).
    Refused { reason: String },
    /// Nothing happened, and it may work later: a connection that never
    /// opened, a refusal at the door. Sent again later, with the same key.
    NotAccepted { reason: String },
    /// It was sent and no answer came back, or one that may mean it is still
    /// in flight: it may or may not have happened.
    AnswerLost { reason: String },
}

impl Delivery {
    /// What an answer that is not 2xx means for the request, read from its
    /// status and its problem body (RFC 9457, whose `code` it looks at); the
    /// one place a client decides it. Only an answer that says "not done,
    /// and never will be" is final: a 4xx business refusal, or a 409 whose
    /// code is one of `final_conflicts` (the external system's business
    /// refusals that come as 409, such as a refund past its charge).
    ///
    /// Whatever may mean the request is still in flight or was taken after
    /// all leaves it unknown, for the reconciler to ask about before anything
    /// is sent again: any other 409 (a request with the key is being
    /// processed), a reused key (what holds it may be ours, sent before in
    /// another shape: the lookup tells), 425, a 429 that says why, and every
    /// 5xx — a 503 too, since a gateway says it when its upstream took the
    /// request and then timed out.
    ///
    /// Only what cannot have reached the work is sent again as it is, with
    /// the same key: a bare 429 (rate limited at the door), 408 (the request
    /// never arrived whole), and a refusal of who we are (401, 403).
    pub fn from_refusal(status: u16, body: &str, final_conflicts: &[&str]) -> Delivery {
        let code = serde_json::from_str::<ProblemCode>(body).ok().and_then(|p| p.code);
        let reason = format!("{status}: {}", body.chars().take(500).collect::<String>());
        match (status, code.as_deref()) {
            (401 | 403 | 408, _) => Delivery::NotAccepted { reason },
            (429, _) if body.trim().is_empty() => Delivery::NotAccepted { reason },
            (_, Some(KEY_REUSED)) => Delivery::AnswerLost { reason },
            (409, Some(code)) if final_conflicts.contains(&code) => Delivery::Refused { reason },
            (409 | 425 | 429 | 500..=599, _) => Delivery::AnswerLost { reason },
            // a decline, an invalid request, an unknown charge: the same request would be refused again
            _ => Delivery::Refused { reason },
        }
    }
}

/// The code with which an external system refuses a key it holds for another request.
const KEY_REUSED: &str = "idempotency_key_reused";

/// A problem body's `code`, when it has one.
#[derive(serde::Deserialize)]
struct ProblemCode {
    code: Option<String>,
}

/// What the external system knows of an event, asked by its key or reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found { external_ref: String },
    Absent,
}

/// How an event ended, for the service's business rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement<'a> {
    Accepted {
        external_ref: &'a str,
    },
    Refused {
        reason: &'a str,
    },
    /// Sent, and nobody knows yet whether it took effect.
    Unknown,
}

/// The external system a service's events go to.
pub trait Destination: Send + Sync + 'static {
    /// Sends `event`, with `event.external_key` as the external system's
    /// idempotency key. The outbox bounds it by its delivery timeout: a
    /// delivery that runs out of time is [`Delivery::AnswerLost`].
    fn deliver(&self, event: &OutboxEvent) -> impl Future<Output = Delivery> + Send;

    /// Asks the external system what became of `event`, by its key or by the
    /// service's own reference. `Err`: it could not be asked.
    fn look_up(&self, event: &OutboxEvent) -> impl Future<Output = Result<Lookup, String>> + Send;

    /// Whether the external system's acceptance ends the operation: `true`
    /// for a charge (accepted is done), `false` for work that goes on there
    /// (a rollout): the operation then stays `in_progress`, with the external
    /// reference, until the service ends it with [`finish`].
    fn completes_on_acceptance(&self, _event: &OutboxEvent) -> bool {
        true
    }

    /// The service's business writes for how `event` ended (a capture
    /// succeeded, a refund failed…), in the transaction that settles the event
    /// and its operation.
    fn settle(
        &self,
        tx: &mut Tx,
        event: &OutboxEvent,
        settlement: Settlement<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// How the worker and the reconciler pace themselves.
#[derive(Debug, Clone)]
pub struct OutboxConfig {
    /// How often they look for due events when nothing woke them.
    pub poll: Duration,
    /// How long a delivery (or a lookup) waits for an answer before calling it lost.
    pub delivery_timeout: Duration,
    /// How long a worker or the reconciler holds an event; one that dies
    /// holding it is replaced after this. Longer than `delivery_timeout`, so a
    /// live holder usually settles first; when it does not (its settling
    /// transaction waited too long), the compare-and-set on the lease leaves
    /// the event to the new holder.
    pub lease: Duration,
    /// How long after a lost answer the reconciler asks (the external system
    /// may still be working on it).
    pub reconcile_after: Duration,
    /// The wait before sending again what was not accepted; it doubles with
    /// each delivery (with jitter) up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Events taken at a time, delivered concurrently.
    pub batch: i64,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            poll: Duration::from_millis(250),
            delivery_timeout: Duration::from_secs(10),
            lease: Duration::from_secs(30),
            reconcile_after: Duration::from_secs(2),
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            batch: 16,
        }
    }
}

impl OutboxConfig {
    /// `RETRYSAFE_OUTBOX_TIMEOUT_SECONDS` (10), `RETRYSAFE_OUTBOX_LEASE_SECONDS`
    /// (30), `RETRYSAFE_RECONCILE_AFTER_SECONDS` (2), `RETRYSAFE_OUTBOX_BACKOFF_SECONDS` (1).
    pub fn from_env() -> Result<Self, String> {
        let mut config = OutboxConfig::default();
        if let Some(seconds) = crate::number("RETRYSAFE_OUTBOX_TIMEOUT_SECONDS")? {
            config.delivery_timeout = Duration::from_secs_f64(seconds);
        }
        if let Some(seconds) = crate::number("RETRYSAFE_OUTBOX_LEASE_SECONDS")? {
            config.lease = Duration::from_secs_f64(seconds);
        }
        if let Some(seconds) = crate::number("RETRYSAFE_RECONCILE_AFTER_SECONDS")? {
            config.reconcile_after = Duration::from_secs_f64(seconds);
        }
        if let Some(seconds) = crate::number("RETRYSAFE_OUTBOX_BACKOFF_SECONDS")? {
            config.backoff = Duration::from_secs_f64(seconds);
        }
        if config.lease <= config.delivery_timeout {
            return Err(format!(
                "RETRYSAFE_OUTBOX_LEASE_SECONDS ({:?}) must be longer than RETRYSAFE_OUTBOX_TIMEOUT_SECONDS ({:?}): \
                 a live worker must finish before another may take its event",
                config.lease, config.delivery_timeout
            ));
        }
        Ok(config)
    }

    /// The wait before the next delivery of an event sent `deliveries` times:
    /// doubling, capped, and jittered so that many events that failed
    /// together do not come back together.
    fn backoff_after(&self, deliveries: i32) -> Duration {
        let doublings = u32::try_from(deliveries.saturating_sub(1)).unwrap_or(0).min(16);
        let wait = self.backoff.saturating_mul(1 << doublings).min(self.max_backoff);
        wait.mul_f64(0.5 + fastrand::f64() / 2.0)
    }
}

/// The identity of the operation an event belongs to, as the effect claimed it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventOf<'a> {
    pub account_id: &'a str,
    pub operation_id: &'a str,
    pub idempotency_key: &'a str,
    pub fingerprint: &'a str,
    pub route: &'a str,
}

/// Writes `message` as a pending event of its operation, inside the
/// transaction of the effect that made it: the event exists if and only if
/// the effect and the operation's answer do.
pub(crate) async fn enqueue(
    tx: &mut Tx,
    of: EventOf<'_>,
    message: &Message,
    now: Timestamp,
) -> Result<(), sqlx::Error> {
    let payload = message.payload.as_ref().map_err(|e| {
        sqlx::Error::Protocol(format!(
            "the `{}` event's payload does not serialise: {e}",
            message.kind
        ))
    })?;
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
        .bind(message.kind)
        .bind(payload.to_string())
        .bind(external_key(of.operation_id))
        .bind(now)
        .execute(conn)
        .await?;
    });
    Ok(())
}

/// Withdraws an operation's event that was never handed to the external
/// system — a cancel that came before the delivery — in `tx`: the event fails
/// with `reason`, and its operation with it (journaled `failed`, by `by`).
/// `false`: a worker has it, or it was sent at least once (even if it is due
/// to be sent again, the external system may have it): it must be cancelled
/// there.
pub async fn withdraw(
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    by: &str,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let now = Timestamp::now();
    let withdrawn: Option<(String, String, String)> = on_tx!(tx, |conn| {
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
    let Some((idempotency_key, fingerprint, route)) = withdrawn else {
        return Ok(false);
    };
    let operation = Ended {
        account_id,
        operation_id,
        idempotency_key,
        fingerprint,
        route,
        external_ref: None,
    };
    operation.end(tx, OperationState::Failed, by, now).await?;
    Ok(true)
}

/// Ends an operation whose work went on at the external system after it
/// accepted it ([`Destination::completes_on_acceptance`]): `completed` or
/// `failed`, journaled by `by`, in `tx` (the one that records how the work
/// ended in the service's own rows). `false`: it had ended already.
pub async fn finish(
    tx: &mut Tx,
    account_id: &str,
    operation_id: &str,
    ended: OperationState,
    by: &str,
) -> Result<bool, sqlx::Error> {
    let found: Option<(String, String, String, Option<String>)> = on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT o.idempotency_key, o.fingerprint, o.route, o.external_ref FROM idempotency_outbox o \
             JOIN idempotency_operations op ON op.operation_id = o.operation_id \
             WHERE o.account_id = $1 AND o.operation_id = $2 AND o.state = 'delivered' AND op.state = 'in_progress'",
        )
        .bind(account_id)
        .bind(operation_id)
        .fetch_optional(conn)
        .await?
    });
    let Some((idempotency_key, fingerprint, route, external_ref)) = found else {
        return Ok(false);
    };
    let operation = Ended {
        account_id,
        operation_id,
        idempotency_key,
        fingerprint,
        route,
        external_ref,
    };
    operation.end(tx, ended, by, Timestamp::now()).await?;
    Ok(true)
}

/// An operation whose outbox work is being ended by the service (withdrawn,
/// or finished at the external system).
struct Ended<'a> {
    account_id: &'a str,
    operation_id: &'a str,
    idempotency_key: String,
    fingerprint: String,
    route: String,
    external_ref: Option<String>,
}

impl Ended<'_> {
    async fn end(self, tx: &mut Tx, state: OperationState, by: &str, now: Timestamp) -> Result<(), sqlx::Error> {
        if !store::settle_external(tx, self.account_id, self.operation_id, state, None, now).await? {
            return Err(sqlx::Error::Protocol(format!(
                "operation {} is not waiting for its outbox work",
                self.operation_id
            )));
        }
        let event = if state == OperationState::Completed {
            AuditEvent::Completed
        } else {
            AuditEvent::Failed
        };
        let ended = Record {
            account_id: self.account_id.to_owned(),
            principal_id: by.to_owned(),
            operation_id: Some(self.operation_id.to_owned()),
            idempotency_key: Some(self.idempotency_key),
            fingerprint: Some(self.fingerprint),
            route: Some(self.route),
            event,
            external_ref: self.external_ref,
            at: now,
            change: None,
        };
        audit::record(tx, &[ended]).await
    }
}

macro_rules! event_columns {
    () => {
        "event_id, account_id, operation_id, idempotency_key, fingerprint, route, kind, payload, external_key, \
         state, deliveries, lease_token"
    };
}

/// Takes due events in `states` under a new lease (until `until`): one
/// statement, so two workers never take the same event (PostgreSQL skips rows
/// another transaction holds; SQLite has one writer). `send`: they are being
/// sent now — `sending`, and one more delivery counted.
async fn take_due(
    tx: &mut Tx,
    states: &[EventState],
    send: bool,
    token: &str,
    until: Timestamp,
    now: Timestamp,
    batch: i64,
) -> Result<Vec<OutboxEvent>, sqlx::Error> {
    let states = states
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    let set = if send {
        "state = 'sending', deliveries = deliveries + 1,"
    } else {
        ""
    };
    let skip_locked = if matches!(tx, Tx::Postgres(_)) {
        "FOR UPDATE SKIP LOCKED"
    } else {
        ""
    };
    // the condition twice: the inner one picks the events, the outer one is
    // checked again on each row as it is written, so an event another worker
    // took in between is left alone
    let due = format!("state IN ({states}) AND next_attempt_at <= $3");
    let sql = format!(
        "UPDATE idempotency_outbox SET {set} lease_token = $1, next_attempt_at = $2, updated_at = $3 \
         WHERE {due} AND seq IN (SELECT seq FROM idempotency_outbox WHERE {due} \
                                 ORDER BY next_attempt_at LIMIT $4 {skip_locked}) \
         RETURNING {}",
        event_columns!()
    );
    let taken = on_tx!(tx, |conn| {
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(token)
            .bind(until)
            .bind(now)
            .bind(batch)
            .fetch_all(conn)
            .await?
            .iter()
            .map(decode_event)
            .collect::<Result<Vec<_>, _>>()?
    });
    Ok(taken)
}

/// Lets go of an event this holder took, in its new state: compare-and-set on
/// the lease token. `false`: the lease ran out and another holder has it.
#[allow(clippy::too_many_arguments)]
async fn release(
    tx: &mut Tx,
    event: &OutboxEvent,
    state: EventState,
    next_attempt_at: Timestamp,
    external_ref: Option<&str>,
    last_error: Option<&str>,
    now: Timestamp,
) -> Result<bool, sqlx::Error> {
    let released = on_tx!(tx, |conn| {
        sqlx::query(
            "UPDATE idempotency_outbox SET state = $3, lease_token = NULL, next_attempt_at = $4, \
             external_ref = COALESCE($5, external_ref), last_error = $6, updated_at = $7 \
             WHERE event_id = $1 AND lease_token = $2",
        )
        .bind(&event.event_id)
        .bind(&event.lease_token)
        .bind(state.as_str())
        .bind(next_attempt_at)
        .bind(external_ref)
        .bind(last_error)
        .bind(now)
        .execute(conn)
        .await?
        .rows_affected()
    });
    Ok(released == 1)
}

fn decode_event<R>(row: &R) -> Result<OutboxEvent, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let corrupt = |what: &str| sqlx::Error::Decode(format!("idempotency_outbox: {what}").into());
    let state: String = row.try_get("state")?;
    let payload: String = row.try_get("payload")?;
    Ok(OutboxEvent {
        event_id: row.try_get("event_id")?,
        account_id: row.try_get("account_id")?,
        operation_id: row.try_get("operation_id")?,
        idempotency_key: row.try_get("idempotency_key")?,
        fingerprint: row.try_get("fingerprint")?,
        route: row.try_get("route")?,
        kind: row.try_get("kind")?,
        payload: serde_json::from_str(&payload).map_err(|_| corrupt("payload is not JSON"))?,
        external_key: row.try_get("external_key")?,
        state: EventState::parse(&state).ok_or_else(|| corrupt("unknown state"))?,
        deliveries: row.try_get("deliveries")?,
        lease_token: row.try_get("lease_token")?,
    })
}

/// How an event ends: what the event, its operation and the journal become.
/// `reconciled`: the reconciler found it out, not the worker.
enum Outcome {
    Accepted { external_ref: String, reconciled: bool },
    Refused { reason: String },
    Unknown { reason: String, reconciled: bool },
}

/// The outbox of one service: its idempotency layer (database, journal), the
/// external system its events go to, and the pace.
#[derive(Debug)]
pub struct Outbox<D> {
    idempotency: Idempotency,
    destination: Arc<D>,
    config: OutboxConfig,
}

impl<D> Clone for Outbox<D> {
    fn clone(&self) -> Self {
        Outbox {
            idempotency: self.idempotency.clone(),
            destination: self.destination.clone(),
            config: self.config.clone(),
        }
    }
}

impl<D: Destination> Outbox<D> {
    /// A lease no longer than the delivery timeout is made twice the timeout:
    /// otherwise every slow delivery would be taken over while it runs.
    pub fn new(idempotency: Idempotency, destination: D, mut config: OutboxConfig) -> Self {
        if config.lease <= config.delivery_timeout {
            tracing::warn!(lease = ?config.lease, timeout = ?config.delivery_timeout,
                "the outbox lease must outlast a delivery; using twice the delivery timeout");
            config.lease = config.delivery_timeout * 2;
        }
        Outbox {
            idempotency,
            destination: Arc::new(destination),
            config,
        }
    }

    pub fn destination(&self) -> &D {
        &self.destination
    }

    /// The worker: sends every pending event that is due, concurrently, and
    /// settles each with its answer. Returns how many it took.
    pub async fn deliver_due(&self) -> Result<usize, sqlx::Error> {
        let now = Timestamp::now();
        let token = new_lease_token();
        let mut tx = self.idempotency.db.begin().await?;
        let events = take_due(
            &mut tx,
            &[EventState::Pending],
            true,
            &token,
            now.plus(self.config.lease),
            now,
            self.config.batch,
        )
        .await?;
        // journaled with the take, so a crash after it still shows the dispatch
        let dispatched: Vec<Record> = events
            .iter()
            .map(|e| e.audit(AuditEvent::Dispatched, WORKER, None, now))
            .collect();
        audit::record(&mut tx, &dispatched).await?;
        tx.commit().await?;
        let taken = events.len();
        futures::future::join_all(events.into_iter().map(|event| self.deliver(event))).await;
        Ok(taken)
    }

    /// The reconciler: asks the external system about every event whose fate
    /// is unknown — an answer lost, or a worker that died holding the event.
    /// Returns how many it took.
    pub async fn reconcile_due(&self) -> Result<usize, sqlx::Error> {
        let now = Timestamp::now();
        let token = new_lease_token();
        let mut tx = self.idempotency.db.begin().await?;
        let events = take_due(
            &mut tx,
            &[EventState::Sending, EventState::Unknown],
            false,
            &token,
            now.plus(self.config.lease),
            now,
            self.config.batch,
        )
        .await?;
        tx.commit().await?;
        let taken = events.len();
        futures::future::join_all(events.into_iter().map(|event| self.reconcile(event))).await;
        Ok(taken)
    }

    /// Runs the worker and the reconciler until the returned task is aborted,
    /// each in its own loop, so a slow delivery never holds up a lookup. The
    /// worker starts at once when an effect in this process wrote an event;
    /// otherwise both look every `poll`.
    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let wake = self.idempotency.outbox_wake.clone();
            let worker = async {
                loop {
                    let taken = self.deliver_due().await.unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "outbox: could not take events to deliver; trying again");
                        0
                    });
                    if taken == 0 {
                        tokio::select! {
                            () = wake.notified() => {}
                            () = tokio::time::sleep(self.config.poll) => {}
                        }
                    }
                }
            };
            let reconciler = async {
                loop {
                    let taken = self.reconcile_due().await.unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "reconciler: could not take events to reconcile; trying again");
                        0
                    });
                    if taken == 0 {
                        tokio::time::sleep(self.config.poll).await;
                    }
                }
            };
            tokio::join!(worker, reconciler);
        })
    }

    async fn deliver(&self, event: OutboxEvent) {
        fail_point("outbox::before_delivery").await;
        let delivery = tokio::time::timeout(self.config.delivery_timeout, self.destination.deliver(&event))
            .await
            .unwrap_or_else(|_| Delivery::AnswerLost {
                reason: format!("no answer within {:?}", self.config.delivery_timeout),
            });
        fail_point("outbox::after_delivery").await;
        let settled = match delivery {
            Delivery::Accepted { external_ref } => {
                self.settle(
                    &event,
                    Outcome::Accepted {
                        external_ref,
                        reconciled: false,
                    },
                )
                .await
            }
            Delivery::Refused { reason } => self.settle(&event, Outcome::Refused { reason }).await,
            Delivery::AnswerLost { reason } => {
                self.settle(
                    &event,
                    Outcome::Unknown {
                        reason,
                        reconciled: false,
                    },
                )
                .await
            }
            Delivery::NotAccepted { reason } => {
                tracing::warn!(event_id = %event.event_id, operation_id = %event.operation_id, %reason,
                    "not accepted; it is sent again later with the same key");
                let wait = self.config.backoff_after(event.deliveries);
                self.reschedule(&event, EventState::Pending, wait, &reason).await
            }
        };
        log_failure(&event, settled);
    }

    async fn reconcile(&self, event: OutboxEvent) {
        let found = tokio::time::timeout(self.config.delivery_timeout, self.destination.look_up(&event))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.config.delivery_timeout)));
        let settled = match found {
            Ok(Lookup::Found { external_ref }) => {
                self.settle(
                    &event,
                    Outcome::Accepted {
                        external_ref,
                        reconciled: true,
                    },
                )
                .await
            }
            Ok(Lookup::Absent) => {
                tracing::info!(event_id = %event.event_id, operation_id = %event.operation_id,
                    "reconciler: the external system has no trace of it; it is sent again with the same key");
                let sent_again = self
                    .reschedule(
                        &event,
                        EventState::Pending,
                        Duration::ZERO,
                        "not found by the reconciler",
                    )
                    .await;
                self.idempotency.outbox_wake.notify_one();
                sent_again
            }
            // a worker died holding it: whether it was sent, nobody knows until someone can ask
            Err(reason) if event.state == EventState::Sending => {
                self.settle(
                    &event,
                    Outcome::Unknown {
                        reason,
                        reconciled: true,
                    },
                )
                .await
            }
            Err(reason) => {
                tracing::warn!(event_id = %event.event_id, %reason, "reconciler: could not ask; asking again later");
                let wait = self.config.backoff_after(event.deliveries);
                self.reschedule(&event, EventState::Unknown, wait, &reason).await
            }
        };
        log_failure(&event, settled);
    }

    /// Gives an event back to be tried again after `wait`; its operation does
    /// not change.
    async fn reschedule(
        &self,
        event: &OutboxEvent,
        state: EventState,
        wait: Duration,
        reason: &str,
    ) -> Result<bool, sqlx::Error> {
        let now = Timestamp::now();
        let mut tx = self.idempotency.db.begin().await?;
        if !release(&mut tx, event, state, now.plus(wait), None, Some(reason), now).await? {
            tx.rollback().await?;
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Settles an event, its operation and the service's business rows in
    /// one transaction, and journals how it ended. `false`: the lease was
    /// lost, and whoever holds the event now settles it.
    async fn settle(&self, event: &OutboxEvent, outcome: Outcome) -> Result<bool, sqlx::Error> {
        let now = Timestamp::now();
        // work that goes on at the external system after it accepted keeps its operation in progress
        let completes = self.destination.completes_on_acceptance(event);
        let (event_state, operation_state, external_ref, last_error) = match &outcome {
            Outcome::Accepted { external_ref, .. } => (
                EventState::Delivered,
                if completes {
                    OperationState::Completed
                } else {
                    OperationState::InProgress
                },
                Some(external_ref.as_str()),
                None,
            ),
            Outcome::Refused { reason } => (EventState::Failed, OperationState::Failed, None, Some(reason.as_str())),
            Outcome::Unknown { reason, .. } => (
                EventState::Unknown,
                OperationState::Unknown,
                None,
                Some(reason.as_str()),
            ),
        };
        let (settlement, journaled) = match &outcome {
            Outcome::Accepted {
                external_ref,
                reconciled,
            } => {
                let (found, by) = if *reconciled {
                    (AuditEvent::Reconciled, RECONCILER)
                } else {
                    (AuditEvent::Accepted, WORKER)
                };
                let mut journaled = vec![event.audit(found, by, Some(external_ref), now)];
                if completes {
                    journaled.push(event.audit(AuditEvent::Completed, by, Some(external_ref), now));
                }
                (Settlement::Accepted { external_ref }, journaled)
            }
            Outcome::Refused { reason } => (
                Settlement::Refused { reason },
                vec![event.audit(AuditEvent::Failed, WORKER, None, now)],
            ),
            Outcome::Unknown { reconciled, .. } => (
                Settlement::Unknown,
                vec![event.audit(
                    AuditEvent::Unknown,
                    if *reconciled { RECONCILER } else { WORKER },
                    None,
                    now,
                )],
            ),
        };
        // an unknown outcome is asked about after a while; a settled one is never due again
        let next_attempt_at = now.plus(self.config.reconcile_after);

        let mut tx = self.idempotency.db.begin().await?;
        if !release(
            &mut tx,
            event,
            event_state,
            next_attempt_at,
            external_ref,
            last_error,
            now,
        )
        .await?
        {
            tx.rollback().await?;
            return Ok(false);
        }
        let settled = store::settle_external(
            &mut tx,
            &event.account_id,
            &event.operation_id,
            operation_state,
            external_ref,
            now,
        )
        .await?;
        if !settled {
            tx.rollback().await?;
            return Err(sqlx::Error::Protocol(format!(
                "operation {} of event {} is not waiting for its delivery",
                event.operation_id, event.event_id
            )));
        }
        self.destination.settle(&mut tx, event, settlement).await?;
        audit::record(&mut tx, &journaled).await?;
        tx.commit().await?;
        match &outcome {
            Outcome::Accepted {
                external_ref,
                reconciled,
            } => {
                tracing::info!(event_id = %event.event_id, operation_id = %event.operation_id, %external_ref,
                    reconciled, "delivered: the operation is completed")
            }
            Outcome::Refused { reason } => {
                tracing::warn!(event_id = %event.event_id, operation_id = %event.operation_id, %reason,
                    "refused by the external system: the operation failed")
            }
            Outcome::Unknown { reason, .. } => {
                tracing::warn!(event_id = %event.event_id, operation_id = %event.operation_id, %reason,
                    "the answer was lost: the operation is unknown until the reconciler asks")
            }
        }
        Ok(true)
    }
}

fn log_failure(event: &OutboxEvent, settled: Result<bool, sqlx::Error>) {
    match settled {
        Ok(true) => {}
        Ok(false) => tracing::warn!(event_id = %event.event_id, "the event's lease ran out; its new holder settles it"),
        Err(e) => tracing::error!(event_id = %event.event_id, error = %e,
            "could not record how the event ended; it is taken again when its lease ends"),
    }
}

fn new_lease_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

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
    Ok(row.and_then(|(state, deliveries)| Some((EventState::parse(&state)?, deliveries))))
}

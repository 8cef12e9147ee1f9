//! The payments tables, on both backends. Handlers never see SQL; every rule
//! a race could break is decided by the database here.

use axum::http::StatusCode;
use idempotency::OperationIdentity;
use platform::{
    ApiError, Db, Timestamp, Tx, on_tx,
    page::{Page, PageRequest},
};
use sqlx::{FromRow, Row};

use outbox::Settlement;

use crate::{
    domain::{
        Capture, CaptureIntent, CreateIntent, IntentState, PayeeBody, PaymentIntent, Refund, RefundPayment,
        TransferState, capture_url, new_id, refund_url,
    },
    money::Money,
};

/// An intent's own columns, and — NULL for the statements that write an
/// intent, which never has a capture yet — its capture's ids.
macro_rules! intent_columns {
    () => {
        "seq, id, order_id, amount_minor, currency, payee_name, payee_account, description, state, created_at, \
         updated_at, CAST(NULL AS TEXT) AS capture_id, CAST(NULL AS TEXT) AS provider_charge_id"
    };
}

/// An intent read with its capture's ids.
macro_rules! select_intent {
    () => {
        "SELECT i.seq, i.list_seq, i.id, i.order_id, i.amount_minor, i.currency, i.payee_name, i.payee_account, i.description, \
         i.state, i.created_at, i.updated_at, c.id AS capture_id, c.provider_charge_id \
         FROM payment_intents i LEFT JOIN payment_captures c ON c.account_id = i.account_id AND c.intent_id = i.id"
    };
}

/// Creates the intent, unless the order already has a live one.
///
/// The partial unique index `payment_intents_one_live_per_order` decides
/// under races: the insert does nothing when another transaction holds the
/// order (PostgreSQL waits for it to commit; SQLite's write lock orders
/// them), and the intent that won is named in the 409.
pub async fn create_intent(tx: &mut Tx, account_id: &str, command: &CreateIntent) -> Result<PaymentIntent, ApiError> {
    const INSERT: &str = concat!(
        "INSERT INTO payment_intents (id, account_id, order_id, amount_minor, currency, payee_name, payee_account, \
         description, state, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'requires_capture', $9, $9) \
         ON CONFLICT (account_id, order_id) WHERE state NOT IN ('cancelled', 'failed') DO NOTHING \
         RETURNING ",
        intent_columns!()
    );
    const LIVE: &str = "SELECT id FROM payment_intents \
         WHERE account_id = $1 AND order_id = $2 AND state NOT IN ('cancelled', 'failed')";
    // Bounded: on PostgreSQL the live intent that made the insert do nothing
    // can be cancelled before it is read; the order is then free, so try again.
    for _ in 0..3 {
        let now = Timestamp::now();
        let created = on_tx!(tx, |conn| {
            sqlx::query(INSERT)
                .bind(new_id("pi"))
                .bind(account_id)
                .bind(&command.order_id)
                .bind(command.amount.amount_minor)
                .bind(command.amount.currency_code())
                .bind(&command.payee.name)
                .bind(&command.payee.account)
                .bind(command.description.as_deref())
                .bind(now)
                .fetch_optional(conn)
                .await?
                .map(|row| PaymentIntent::from_row(&row))
                .transpose()?
        });
        if let Some(intent) = created {
            return Ok(intent);
        }
        let live: Option<String> = on_tx!(tx, |conn| {
            sqlx::query_scalar(LIVE)
                .bind(account_id)
                .bind(&command.order_id)
                .fetch_optional(conn)
                .await?
        });
        if let Some(live) = live {
            return Err(order_already_has_payment(&command.order_id, live));
        }
    }
    Err(ApiError::internal(
        "the order's live intent kept changing while this one was created",
    ))
}

/// 409: the order has a live intent, named so the caller can use or cancel it.
fn order_already_has_payment(order_id: &str, live: String) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "order_already_has_payment",
        "Order already has a payment",
        format!("order `{order_id}` already has the live payment intent `{live}`; cancel it first, or use it"),
    )
    .with("payment_intent_id", live)
}

/// Cancels an intent that is waiting for its capture. A cancel declares the end
/// state, so an intent already cancelled is answered as it is
/// (docs/contract.md §1). 404 when the account has no such intent; 409
/// `invalid_state` when it is past `requires_capture`. `true`: this call
/// cancelled it.
pub async fn cancel_intent(tx: &mut Tx, account_id: &str, intent_id: &str) -> Result<(PaymentIntent, bool), ApiError> {
    const CANCEL: &str = concat!(
        "UPDATE payment_intents SET state = 'cancelled', updated_at = $3 \
         WHERE account_id = $1 AND id = $2 AND state = 'requires_capture' RETURNING ",
        intent_columns!()
    );
    const CURRENT: &str = concat!(select_intent!(), " WHERE i.account_id = $1 AND i.id = $2");
    let cancelled = on_tx!(tx, |conn| {
        sqlx::query(CANCEL)
            .bind(account_id)
            .bind(intent_id)
            .bind(Timestamp::now())
            .fetch_optional(conn)
            .await?
            .map(|row| PaymentIntent::from_row(&row))
            .transpose()?
    });
    if let Some(intent) = cancelled {
        return Ok((intent, true));
    }
    let current = on_tx!(tx, |conn| {
        sqlx::query(CURRENT)
            .bind(account_id)
            .bind(intent_id)
            .fetch_optional(conn)
            .await?
            .map(|row| PaymentIntent::from_row(&row))
            .transpose()?
    });
    match current {
        None => Err(ApiError::not_found(format!("payment intent `{intent_id}`"))),
        Some(intent) if intent.state == IntentState::Cancelled => Ok((intent, false)),
        Some(intent) => Err(ApiError::invalid_state(format!(
            "the intent is `{}`; only an intent in `requires_capture` can be cancelled",
            intent.state.as_str()
        ))
        .with("state", intent.state)),
    }
}

pub async fn get_intent(db: &Db, account_id: &str, intent_id: &str) -> Result<Option<PaymentIntent>, ApiError> {
    const SQL: &str = concat!(select_intent!(), " WHERE i.account_id = $1 AND i.id = $2");
    platform::rows::get(db, SQL, account_id, &[intent_id]).await
}

/// One page of the account's intents in creation order, for one order if given.
pub async fn list_intents(
    db: &Db,
    account_id: &str,
    order_id: Option<&str>,
    page: PageRequest,
) -> Result<Page<PaymentIntent>, ApiError> {
    const SQL: &str = concat!(
        select_intent!(),
        " WHERE i.account_id = $1 AND ($2 IS NULL OR i.order_id = $2) AND i.list_seq > $3 ORDER BY i.list_seq LIMIT $4"
    );
    platform::rows::list(db, "payment_intents", SQL, account_id, &[order_id], page).await
}

macro_rules! capture_columns {
    () => {
        "seq, id, intent_id, amount_minor, currency, refunded_minor, state, provider_idempotency_key, \
         provider_charge_id, created_at, updated_at"
    };
}

macro_rules! refund_columns {
    () => {
        "seq, id, intent_id, capture_id, amount_minor, currency, reason, state, provider_idempotency_key, \
         provider_refund_id, created_at, updated_at"
    };
}

/// Starts the capture of an intent: the intent goes `requires_capture →
/// processing` (a compare-and-set on its state, so of two racing captures
/// exactly one starts) and the capture is written, `processing`, in the
/// effect's transaction, with the provider key derived from the request its
/// operation runs ([`outbox::external_key`]). The charge itself is the
/// outbox's to send.
pub async fn begin_capture(
    tx: &mut Tx,
    operation: &OperationIdentity<'_>,
    command: &CaptureIntent,
) -> Result<Capture, ApiError> {
    let account_id = operation.account_id;
    const START: &str = "UPDATE payment_intents SET state = 'processing', updated_at = $3 \
         WHERE account_id = $1 AND id = $2 AND state = 'requires_capture' RETURNING id";
    const INSERT: &str = concat!(
        "INSERT INTO payment_captures (id, account_id, intent_id, amount_minor, currency, state, \
         provider_idempotency_key, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, 'processing', $6, $7, $7) RETURNING ",
        capture_columns!()
    );
    let now = Timestamp::now();
    let started: Option<String> = on_tx!(tx, |conn| {
        sqlx::query_scalar(START)
            .bind(account_id)
            .bind(&command.intent_id)
            .bind(now)
            .fetch_optional(conn)
            .await?
    });
    if started.is_none() {
        return Err(match intent_state(tx, account_id, &command.intent_id).await? {
            None => ApiError::not_found(format!("payment intent `{}`", command.intent_id)),
            Some(state) => ApiError::invalid_state(format!(
                "the intent is `{}`; only an intent in `requires_capture` can be captured",
                state.as_str()
            ))
            .with("state", state),
        });
    }
    Ok(on_tx!(tx, |conn| {
        let row = sqlx::query(INSERT)
            .bind(new_id("cap"))
            .bind(account_id)
            .bind(&command.intent_id)
            .bind(command.amount.amount_minor)
            .bind(command.amount.currency_code())
            .bind(outbox::external_key(operation))
            .bind(now)
            .fetch_one(conn)
            .await?;
        Capture::from_row(&row)?
    }))
}

async fn intent_state(tx: &mut Tx, account_id: &str, intent_id: &str) -> Result<Option<IntentState>, sqlx::Error> {
    let state: Option<String> = on_tx!(tx, |conn| {
        sqlx::query_scalar("SELECT state FROM payment_intents WHERE account_id = $1 AND id = $2")
            .bind(account_id)
            .bind(intent_id)
            .fetch_optional(conn)
            .await?
    });
    Ok(state.as_deref().and_then(IntentState::parse))
}

/// Records how a capture's charge ended, on the capture and on its intent:
/// succeeded with the provider's charge id (or, settled by a person with no
/// reference, without one: then nothing here acts on a charge in its name,
/// see [`begin_refund`]), failed (which frees the order for a new intent), or
/// unknown until the reconciler finds out. A capture that has ended already
/// is left as it is.
pub async fn settle_capture(
    tx: &mut Tx,
    account_id: &str,
    capture_id: &str,
    settlement: Settlement<'_>,
) -> Result<(), sqlx::Error> {
    let (state, intent_state, charge_id) = match settlement {
        Settlement::Accepted { external_ref } => (TransferState::Succeeded, IntentState::Succeeded, Some(external_ref)),
        Settlement::CompletedByHand => (TransferState::Succeeded, IntentState::Succeeded, None),
        Settlement::Refused { .. } | Settlement::FailedByHand => (TransferState::Failed, IntentState::Failed, None),
        Settlement::Unknown => (TransferState::Unknown, IntentState::Unknown, None),
    };
    let now = Timestamp::now();
    on_tx!(tx, |conn| {
        let settled: Option<String> = sqlx::query_scalar(
            "UPDATE payment_captures SET state = $3, provider_charge_id = COALESCE($4, provider_charge_id), \
             updated_at = $5 WHERE account_id = $1 AND id = $2 AND state IN ('processing', 'unknown') \
             RETURNING intent_id",
        )
        .bind(account_id)
        .bind(capture_id)
        .bind(state.as_str())
        .bind(charge_id)
        .bind(now)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(intent_id) = settled {
            sqlx::query("UPDATE payment_intents SET state = $3, updated_at = $4 WHERE account_id = $1 AND id = $2")
                .bind(account_id)
                .bind(&intent_id)
                .bind(intent_state.as_str())
                .bind(now)
                .execute(&mut *conn)
                .await?;
        }
    });
    Ok(())
}

/// Starts a refund instruction: its amount is added to what the capture's
/// refunds hold, in **one** conditional update — only a succeeded capture, and
/// only while the sum stays within what was captured — so racing refunds can
/// never together pass it (PostgreSQL re-checks the condition on the row as the
/// previous refund left it; SQLite has one writer), and the table's CHECK
/// refuses it even if a statement forgot to ask. The provider's refund is the
/// outbox's to send, with a key derived from the request the refund's
/// operation runs; the charge it refunds is returned beside it. A capture a
/// person settled with no provider charge id has no charge to name: it is refused.
pub async fn begin_refund(
    tx: &mut Tx,
    operation: &OperationIdentity<'_>,
    command: &RefundPayment,
) -> Result<(Refund, String), ApiError> {
    let account_id = operation.account_id;
    // only a charge the provider confirmed is refunded through it
    const HOLD: &str = "UPDATE payment_captures SET refunded_minor = refunded_minor + $3, updated_at = $4 \
         WHERE account_id = $1 AND intent_id = $2 AND state = 'succeeded' AND provider_charge_id IS NOT NULL \
           AND $3 <= amount_minor - refunded_minor \
         RETURNING id, provider_charge_id";
    const INSERT: &str = concat!(
        "INSERT INTO payment_refunds (id, account_id, intent_id, capture_id, amount_minor, currency, reason, state, \
         provider_idempotency_key, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'processing', $8, $9, $9) RETURNING ",
        refund_columns!()
    );
    let now = Timestamp::now();
    let held: Option<(String, String)> = on_tx!(tx, |conn| {
        sqlx::query_as(HOLD)
            .bind(account_id)
            .bind(&command.intent_id)
            .bind(command.amount.amount_minor)
            .bind(now)
            .fetch_optional(conn)
            .await?
    });
    let Some((capture_id, charge_id)) = held else {
        return Err(why_no_refund(tx, account_id, command).await?);
    };
    let refund = on_tx!(tx, |conn| {
        let row = sqlx::query(INSERT)
            .bind(new_id("rf"))
            .bind(account_id)
            .bind(&command.intent_id)
            .bind(&capture_id)
            .bind(command.amount.amount_minor)
            .bind(command.amount.currency_code())
            .bind(command.reason.as_deref())
            .bind(outbox::external_key(operation))
            .bind(now)
            .fetch_one(conn)
            .await?;
        Refund::from_row(&row)?
    });
    Ok((refund, charge_id))
}

/// Why a refund could not hold its amount: no succeeded capture, or one with
/// no provider charge to refund (409 `invalid_state`), or not that much left
/// to refund (409 `refund_exceeds_captured`).
async fn why_no_refund(tx: &mut Tx, account_id: &str, command: &RefundPayment) -> Result<ApiError, sqlx::Error> {
    let capture: Option<(String, i64, i64, Option<String>)> = on_tx!(tx, |conn| {
        sqlx::query_as(
            "SELECT state, amount_minor, refunded_minor, provider_charge_id FROM payment_captures \
             WHERE account_id = $1 AND intent_id = $2",
        )
        .bind(account_id)
        .bind(&command.intent_id)
        .fetch_optional(conn)
        .await?
    });
    let currency = command.amount.currency_code();
    let in_currency = |minor: i64| {
        Money::from_minor(minor, currency)
            .map(|m| m.amount())
            .unwrap_or_default()
    };
    Ok(match capture {
        None => ApiError::invalid_state("the intent has no capture: there is nothing to refund"),
        Some((state, ..)) if state != TransferState::Succeeded.as_str() => ApiError::invalid_state(format!(
            "the capture is `{state}`; only a succeeded capture can be refunded"
        ))
        .with("state", state),
        Some((state, _, _, None)) => ApiError::invalid_state(
            "the capture was settled by hand with no charge the provider confirmed: there is no charge to refund \
             through this service; refund it at the provider",
        )
        .with("state", state),
        Some((_, captured, refunded, _)) => ApiError::new(
            StatusCode::CONFLICT,
            "refund_exceeds_captured",
            "Refund exceeds what was captured",
            format!(
                "{} {currency} were captured and {} {currency} are refunded or being refunded: at most {} {currency} is left",
                in_currency(captured),
                in_currency(refunded),
                in_currency(captured - refunded)
            ),
        )
        .with("amount_captured", in_currency(captured))
        .with("amount_refunded", in_currency(refunded))
        .with("amount_refundable", in_currency(captured - refunded)),
    })
}

/// Records how a refund ended: succeeded with the provider's refund id (none
/// when a person settled it without one), unknown until the reconciler finds
/// out, or failed — which gives its amount back to the capture, once.
pub async fn settle_refund(
    tx: &mut Tx,
    account_id: &str,
    refund_id: &str,
    settlement: Settlement<'_>,
) -> Result<(), sqlx::Error> {
    let (state, refund_ref) = match settlement {
        Settlement::Accepted { external_ref } => (TransferState::Succeeded, Some(external_ref)),
        Settlement::CompletedByHand => (TransferState::Succeeded, None),
        Settlement::Refused { .. } | Settlement::FailedByHand => (TransferState::Failed, None),
        Settlement::Unknown => (TransferState::Unknown, None),
    };
    let now = Timestamp::now();
    on_tx!(tx, |conn| {
        let settled: Option<(String, i64)> = sqlx::query_as(
            "UPDATE payment_refunds SET state = $3, provider_refund_id = COALESCE($4, provider_refund_id), \
             updated_at = $5 WHERE account_id = $1 AND id = $2 AND state IN ('processing', 'unknown') \
             RETURNING capture_id, amount_minor",
        )
        .bind(account_id)
        .bind(refund_id)
        .bind(state.as_str())
        .bind(refund_ref)
        .bind(now)
        .fetch_optional(&mut *conn)
        .await?;
        if let (Some((capture_id, amount_minor)), TransferState::Failed) = (settled, state) {
            sqlx::query(
                "UPDATE payment_captures SET refunded_minor = refunded_minor - $3, updated_at = $4 \
                 WHERE account_id = $1 AND id = $2",
            )
            .bind(account_id)
            .bind(&capture_id)
            .bind(amount_minor)
            .bind(now)
            .execute(&mut *conn)
            .await?;
        }
    });
    Ok(())
}

pub async fn get_capture(db: &Db, account_id: &str, capture_id: &str) -> Result<Option<Capture>, ApiError> {
    const SQL: &str = concat!(
        "SELECT ",
        capture_columns!(),
        " FROM payment_captures WHERE account_id = $1 AND id = $2"
    );
    platform::rows::get(db, SQL, account_id, &[capture_id]).await
}

/// One page of an intent's captures (it has at most one), in creation order.
pub async fn list_captures(
    db: &Db,
    account_id: &str,
    intent_id: &str,
    page: PageRequest,
) -> Result<Page<Capture>, ApiError> {
    const SQL: &str = concat!(
        "SELECT list_seq, ",
        capture_columns!(),
        " FROM payment_captures WHERE account_id = $1 AND intent_id = $2 AND list_seq > $3 ORDER BY list_seq LIMIT $4"
    );
    platform::rows::list(db, "payment_captures", SQL, account_id, &[Some(intent_id)], page).await
}

pub async fn get_refund(db: &Db, account_id: &str, refund_id: &str) -> Result<Option<Refund>, ApiError> {
    const SQL: &str = concat!(
        "SELECT ",
        refund_columns!(),
        " FROM payment_refunds WHERE account_id = $1 AND id = $2"
    );
    platform::rows::get(db, SQL, account_id, &[refund_id]).await
}

/// One page of an intent's refunds, in creation order.
pub async fn list_refunds(
    db: &Db,
    account_id: &str,
    intent_id: &str,
    page: PageRequest,
) -> Result<Page<Refund>, ApiError> {
    const SQL: &str = concat!(
        "SELECT list_seq, ",
        refund_columns!(),
        " FROM payment_refunds WHERE account_id = $1 AND intent_id = $2 AND list_seq > $3 ORDER BY list_seq LIMIT $4"
    );
    platform::rows::list(db, "payment_refunds", SQL, account_id, &[Some(intent_id)], page).await
}

impl<'a, R> FromRow<'a, R> for Capture
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'a R) -> Result<Self, sqlx::Error> {
        let corrupt = |what: &str| sqlx::Error::Decode(format!("payment_captures: {what}").into());
        let currency: String = row.try_get("currency")?;
        let money = |minor: i64| Money::from_minor(minor, &currency).map_err(|_| corrupt("unknown currency"));
        let amount = money(row.try_get("amount_minor")?)?;
        let refunded = money(row.try_get("refunded_minor")?)?;
        let state: String = row.try_get("state")?;
        let id: String = row.try_get("id")?;
        Ok(Capture {
            status_url: capture_url(&id),
            id,
            payment_intent_id: row.try_get("intent_id")?,
            amount: amount.amount(),
            amount_minor: amount.amount_minor,
            amount_refunded: refunded.amount(),
            amount_refunded_minor: refunded.amount_minor,
            currency,
            state: TransferState::parse(&state).ok_or_else(|| corrupt("unknown state"))?,
            provider_idempotency_key: row.try_get("provider_idempotency_key")?,
            provider_charge_id: row.try_get("provider_charge_id")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

impl<'a, R> FromRow<'a, R> for Refund
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'a R) -> Result<Self, sqlx::Error> {
        let corrupt = |what: &str| sqlx::Error::Decode(format!("payment_refunds: {what}").into());
        let currency: String = row.try_get("currency")?;
        let amount =
            Money::from_minor(row.try_get("amount_minor")?, &currency).map_err(|_| corrupt("unknown currency"))?;
        let state: String = row.try_get("state")?;
        let id: String = row.try_get("id")?;
        Ok(Refund {
            status_url: refund_url(&id),
            id,
            payment_intent_id: row.try_get("intent_id")?,
            capture_id: row.try_get("capture_id")?,
            amount: amount.amount(),
            amount_minor: amount.amount_minor,
            currency,
            reason: row.try_get("reason")?,
            state: TransferState::parse(&state).ok_or_else(|| corrupt("unknown state"))?,
            provider_idempotency_key: row.try_get("provider_idempotency_key")?,
            provider_refund_id: row.try_get("provider_refund_id")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

impl<'a, R> FromRow<'a, R> for PaymentIntent
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'a R) -> Result<Self, sqlx::Error> {
        let corrupt = |what: &str| sqlx::Error::Decode(format!("payment_intents: {what}").into());
        let state: String = row.try_get("state")?;
        let currency: String = row.try_get("currency")?;
        let money =
            Money::from_minor(row.try_get("amount_minor")?, &currency).map_err(|_| corrupt("unknown currency"))?;
        Ok(PaymentIntent {
            id: row.try_get("id")?,
            order_id: row.try_get("order_id")?,
            amount: money.amount(),
            amount_minor: money.amount_minor,
            currency,
            payee: PayeeBody {
                name: row.try_get("payee_name")?,
                account: row.try_get("payee_account")?,
            },
            description: row.try_get("description")?,
            state: IntentState::parse(&state).ok_or_else(|| corrupt("unknown state"))?,
            capture_id: row.try_get("capture_id")?,
            provider_charge_id: row.try_get("provider_charge_id")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

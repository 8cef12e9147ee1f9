//! The payments tables, on both backends. Handlers never see SQL; every rule
//! a race could break is decided by the database here.

use axum::http::StatusCode;
use platform::{ApiError, Db, Timestamp, Tx, on_pool, on_tx};
use sqlx::Row;

use crate::{
    domain::{CreateIntent, IntentState, PayeeBody, PaymentIntent, new_id},
    money::Money,
};

macro_rules! intent_columns {
    () => {
        "seq, id, order_id, amount_minor, currency, payee_name, payee_account, description, state, created_at, updated_at"
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
                .map(|row| decode_intent(&row))
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

/// Cancels an intent that is waiting for its capture. A cancel declares the
/// end state, so an intent already cancelled is answered as it is (CONTRACT
/// §1). 404 when the account has no such intent; 409 `invalid_state` when it
/// is past `requires_capture`.
pub async fn cancel_intent(tx: &mut Tx, account_id: &str, intent_id: &str) -> Result<PaymentIntent, ApiError> {
    const CANCEL: &str = concat!(
        "UPDATE payment_intents SET state = 'cancelled', updated_at = $3 \
         WHERE account_id = $1 AND id = $2 AND state = 'requires_capture' RETURNING ",
        intent_columns!()
    );
    const CURRENT: &str = concat!(
        "SELECT ",
        intent_columns!(),
        " FROM payment_intents WHERE account_id = $1 AND id = $2"
    );
    let cancelled = on_tx!(tx, |conn| {
        sqlx::query(CANCEL)
            .bind(account_id)
            .bind(intent_id)
            .bind(Timestamp::now())
            .fetch_optional(conn)
            .await?
            .map(|row| decode_intent(&row))
            .transpose()?
    });
    if let Some(intent) = cancelled {
        return Ok(intent);
    }
    let current = on_tx!(tx, |conn| {
        sqlx::query(CURRENT)
            .bind(account_id)
            .bind(intent_id)
            .fetch_optional(conn)
            .await?
            .map(|row| decode_intent(&row))
            .transpose()?
    });
    match current {
        None => Err(ApiError::not_found(format!("payment intent `{intent_id}`"))),
        Some(intent) if intent.state == IntentState::Cancelled => Ok(intent),
        Some(intent) => Err(ApiError::invalid_state(format!(
            "the intent is `{}`; only an intent in `requires_capture` can be cancelled",
            intent.state.as_str()
        ))
        .with("state", intent.state)),
    }
}

pub async fn get_intent(db: &Db, account_id: &str, intent_id: &str) -> Result<Option<PaymentIntent>, ApiError> {
    const SQL: &str = concat!(
        "SELECT ",
        intent_columns!(),
        " FROM payment_intents WHERE account_id = $1 AND id = $2"
    );
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query(SQL)
            .bind(account_id)
            .bind(intent_id)
            .fetch_optional(pool)
            .await?
            .map(|row| decode_intent(&row))
            .transpose()?
    }))
}

/// One page of the account's intents in creation order, for one order if given.
pub async fn list_intents(
    db: &Db,
    account_id: &str,
    order_id: Option<&str>,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<(i64, PaymentIntent)>, ApiError> {
    const SQL: &str = concat!(
        "SELECT ",
        intent_columns!(),
        " FROM payment_intents WHERE account_id = $1 AND seq > $2 AND ($3 IS NULL OR order_id = $3) \
         ORDER BY seq LIMIT $4"
    );
    Ok(on_pool!(db.read(), |pool| {
        sqlx::query(SQL)
            .bind(account_id)
            .bind(after_seq)
            .bind(order_id)
            .bind(limit)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| Ok::<_, sqlx::Error>((row.try_get("seq")?, decode_intent(row)?)))
            .collect::<Result<Vec<_>, _>>()?
    }))
}

fn decode_intent<R>(row: &R) -> Result<PaymentIntent, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let corrupt = |what: &str| sqlx::Error::Decode(format!("payment_intents: {what}").into());
    let state: String = row.try_get("state")?;
    let currency: String = row.try_get("currency")?;
    let money = Money::from_minor(row.try_get("amount_minor")?, &currency).map_err(|_| corrupt("unknown currency"))?;
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
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

//! The tickets tables, on both backends. Handlers never see SQL; every rule
//! that a race could break is decided by the database here.

use platform::{
    ApiError, Db, Timestamp, Tx, on_tx,
    page::{Page, PageRequest},
};
use sqlx::{FromRow, Row};

use crate::domain::{AddComment, Comment, CreateOutcome, CreateTicket, Priority, Ticket, TicketStatus, new_id};

macro_rules! ticket_columns {
    () => {
        "seq, id, project, title, description, priority, status, source_event_id, labels, version, created_at, updated_at"
    };
}

macro_rules! comment_columns {
    () => {
        "seq, id, ticket_id, body, author_id, created_at, updated_at"
    };
}

/// Creates the ticket, or finds the one its `source_event_id` already has.
///
/// The unique index `tickets_one_per_source_event` decides under races: the
/// insert does nothing when another transaction holds the event (PostgreSQL
/// waits for it to commit; SQLite's write lock orders them), and the ticket
/// that won is read back. A matched ticket is returned as it is: never
/// reopened, never commented.
pub async fn create_ticket(
    tx: &mut Tx,
    account_id: &str,
    command: &CreateTicket,
) -> Result<(Ticket, CreateOutcome), ApiError> {
    const INSERT: &str = concat!(
        "INSERT INTO tickets (id, account_id, project, title, description, priority, status, source_event_id, \
         labels, version, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, 'open', $7, $8, 1, $9, $9) \
         ON CONFLICT (account_id, project, source_event_id) DO NOTHING \
         RETURNING ",
        ticket_columns!()
    );
    const MATCH: &str = concat!(
        "SELECT ",
        ticket_columns!(),
        " FROM tickets WHERE account_id = $1 AND project = $2 AND source_event_id = $3"
    );
    let now = Timestamp::now();
    let labels = serde_json::to_string(&command.labels).map_err(ApiError::internal)?;
    let created = on_tx!(tx, |conn| {
        sqlx::query(INSERT)
            .bind(new_id("tkt"))
            .bind(account_id)
            .bind(&command.project)
            .bind(&command.title)
            .bind(command.description.as_deref())
            .bind(command.priority.as_str())
            .bind(command.source_event_id.as_deref())
            .bind(&labels)
            .bind(now)
            .fetch_optional(conn)
            .await?
            .map(|row| Ticket::from_row(&row))
            .transpose()?
    });
    if let Some(ticket) = created {
        return Ok((ticket, CreateOutcome::Created));
    }
    let existing = on_tx!(tx, |conn| {
        sqlx::query(MATCH)
            .bind(account_id)
            .bind(&command.project)
            .bind(command.source_event_id.as_deref())
            .fetch_optional(conn)
            .await?
            .map(|row| Ticket::from_row(&row))
            .transpose()?
    });
    existing
        .map(|ticket| (ticket, CreateOutcome::MatchedExisting))
        .ok_or_else(|| ApiError::internal("insert conflicted but no ticket holds the source event"))
}

pub async fn get_ticket(db: &Db, account_id: &str, ticket_id: &str) -> Result<Option<Ticket>, ApiError> {
    const SQL: &str = concat!(
        "SELECT ",
        ticket_columns!(),
        " FROM tickets WHERE account_id = $1 AND id = $2"
    );
    platform::rows::get(db, SQL, account_id, &[ticket_id]).await
}

/// Which tickets a list asks for.
#[derive(Debug, Default)]
pub struct TicketFilter<'a> {
    pub project: Option<&'a str>,
    pub source_event_id: Option<&'a str>,
    pub status: Option<TicketStatus>,
}

/// One page of the account's tickets in creation order (see [`platform::page`]).
pub async fn list_tickets(
    db: &Db,
    account_id: &str,
    filter: &TicketFilter<'_>,
    page: PageRequest,
) -> Result<Page<Ticket>, ApiError> {
    const SQL: &str = concat!(
        "SELECT list_seq, ",
        ticket_columns!(),
        " FROM tickets WHERE account_id = $1 \
           AND ($2 IS NULL OR project = $2) AND ($3 IS NULL OR source_event_id = $3) AND ($4 IS NULL OR status = $4) \
           AND list_seq > $5 ORDER BY list_seq LIMIT $6"
    );
    let filters = [
        filter.project,
        filter.source_event_id,
        filter.status.map(TicketStatus::as_str),
    ];
    platform::rows::list(db, "tickets", SQL, account_id, &filters, page).await
}

/// Adds a comment to one of the account's tickets; 404 when there is none.
pub async fn add_comment(
    tx: &mut Tx,
    account_id: &str,
    author_id: &str,
    command: &AddComment,
) -> Result<Comment, ApiError> {
    // The ticket's existence in this account is checked by the same statement
    // that inserts: no read in code before the write.
    const SQL: &str = concat!(
        "INSERT INTO ticket_comments (id, account_id, ticket_id, body, author_id, created_at, updated_at) \
         SELECT $1, account_id, id, $4, $5, $6, $6 FROM tickets WHERE account_id = $2 AND id = $3 \
         RETURNING ",
        comment_columns!()
    );
    let comment = on_tx!(tx, |conn| {
        sqlx::query(SQL)
            .bind(new_id("cmt"))
            .bind(account_id)
            .bind(&command.ticket_id)
            .bind(&command.body)
            .bind(author_id)
            .bind(Timestamp::now())
            .fetch_optional(conn)
            .await?
            .map(|row| Comment::from_row(&row))
            .transpose()?
    });
    comment.ok_or_else(|| ApiError::not_found(format!("ticket `{}`", command.ticket_id)))
}

pub async fn get_comment(
    db: &Db,
    account_id: &str,
    ticket_id: &str,
    comment_id: &str,
) -> Result<Option<Comment>, ApiError> {
    const SQL: &str = concat!(
        "SELECT ",
        comment_columns!(),
        " FROM ticket_comments WHERE account_id = $1 AND ticket_id = $2 AND id = $3"
    );
    platform::rows::get(db, SQL, account_id, &[ticket_id, comment_id]).await
}

pub async fn list_comments(
    db: &Db,
    account_id: &str,
    ticket_id: &str,
    page: PageRequest,
) -> Result<Page<Comment>, ApiError> {
    const SQL: &str = concat!(
        "SELECT list_seq, ",
        comment_columns!(),
        " FROM ticket_comments WHERE account_id = $1 AND ticket_id = $2 AND list_seq > $3 ORDER BY list_seq LIMIT $4"
    );
    platform::rows::list(db, "ticket_comments", SQL, account_id, &[Some(ticket_id)], page).await
}

/// Declares the ticket's status. One conditional update decides; only when it
/// changes nothing is the ticket read, to say why: already in that status
/// (200, unchanged), closed (409 `invalid_state`), or a stale version (409
/// `version_mismatch`). In `tx`, so the change commits with its journal entry.
pub async fn set_status(
    tx: &mut Tx,
    account_id: &str,
    ticket_id: &str,
    status: TicketStatus,
    expected_version: Option<i64>,
) -> Result<(Ticket, bool), ApiError> {
    const UPDATE: &str = concat!(
        "UPDATE tickets SET status = $3, version = version + 1, updated_at = $4 \
         WHERE account_id = $1 AND id = $2 AND status <> $3 AND status <> 'closed' \
           AND ($5 IS NULL OR version = $5) \
         RETURNING ",
        ticket_columns!()
    );
    const CURRENT: &str = concat!(
        "SELECT ",
        ticket_columns!(),
        " FROM tickets WHERE account_id = $1 AND id = $2"
    );
    let updated = on_tx!(tx, |conn| {
        sqlx::query(UPDATE)
            .bind(account_id)
            .bind(ticket_id)
            .bind(status.as_str())
            .bind(Timestamp::now())
            .bind(expected_version)
            .fetch_optional(conn)
            .await?
            .map(|row| Ticket::from_row(&row))
            .transpose()?
    });
    if let Some(ticket) = updated {
        return Ok((ticket, true));
    }
    let current = on_tx!(tx, |conn| {
        sqlx::query(CURRENT)
            .bind(account_id)
            .bind(ticket_id)
            .fetch_optional(conn)
            .await?
            .map(|row| Ticket::from_row(&row))
            .transpose()?
    })
    .ok_or_else(|| ApiError::not_found(format!("ticket `{ticket_id}`")))?;
    if current.status == status {
        Ok((current, false))
    } else if current.status == TicketStatus::Closed {
        Err(
            ApiError::invalid_state("the ticket is closed; a closed ticket does not change status")
                .with("ticket_status", current.status),
        )
    } else {
        Err(ApiError::version_mismatch(
            expected_version.unwrap_or_default(),
            current.version,
        ))
    }
}

impl<'a, R> FromRow<'a, R> for Ticket
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'a R) -> Result<Self, sqlx::Error> {
        let corrupt = |what: &str| sqlx::Error::Decode(format!("tickets: {what}").into());
        let priority: String = row.try_get("priority")?;
        let status: String = row.try_get("status")?;
        let labels: String = row.try_get("labels")?;
        Ok(Ticket {
            id: row.try_get("id")?,
            project: row.try_get("project")?,
            title: row.try_get("title")?,
            description: row.try_get("description")?,
            priority: Priority::parse(&priority).ok_or_else(|| corrupt("priority"))?,
            status: TicketStatus::parse(&status).ok_or_else(|| corrupt("status"))?,
            source_event_id: row.try_get("source_event_id")?,
            labels: serde_json::from_str(&labels).map_err(|_| corrupt("labels"))?,
            version: row.try_get("version")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

impl<'a, R> FromRow<'a, R> for Comment
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Timestamp: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'a R) -> Result<Self, sqlx::Error> {
        Ok(Comment {
            id: row.try_get("id")?,
            ticket_id: row.try_get("ticket_id")?,
            body: row.try_get("body")?,
            author_id: row.try_get("author_id")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

//! Tickets in the domain's own words: the request bodies as sent, the
//! validated commands they become (what the fingerprint hashes), and the
//! resources the API answers with.

use approvals::ApprovalSummary;
use platform::Timestamp;
use serde::{Deserialize, Serialize};
use validator::{Validate, ValidationError};

/// Ordered from least to most pressing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
    Urgent,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Urgent => "urgent",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "low" => Priority::Low,
            "normal" => Priority::Normal,
            "high" => Priority::High,
            "urgent" => Priority::Urgent,
            _ => return None,
        })
    }
}

/// A ticket's lifecycle. `closed` is final: nothing moves a ticket out of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TicketStatus {
    Open,
    Acknowledged,
    Resolved,
    Closed,
}

impl TicketStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TicketStatus::Open => "open",
            TicketStatus::Acknowledged => "acknowledged",
            TicketStatus::Resolved => "resolved",
            TicketStatus::Closed => "closed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "open" => TicketStatus::Open,
            "acknowledged" => TicketStatus::Acknowledged,
            "resolved" => TicketStatus::Resolved,
            "closed" => TicketStatus::Closed,
            _ => return None,
        })
    }
}

/// Empty or only white space. Strings are otherwise kept as given (no trimming).
fn not_blank(value: &str) -> Result<(), ValidationError> {
    if value.trim().is_empty() {
        return Err(ValidationError::new("blank").with_message("must not be blank".into()));
    }
    Ok(())
}

fn labels_are_short(labels: &[String]) -> Result<(), ValidationError> {
    if labels.iter().any(|l| l.trim().is_empty() || l.chars().count() > 50) {
        return Err(ValidationError::new("label").with_message("each label must be 1 to 50 characters".into()));
    }
    Ok(())
}

/// A label as the document describes it: 1 to 50 characters, not blank.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
#[schema(value_type = String, max_length = 50, pattern = r"^[^\u0000]*[^\u0000\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$")]
pub struct Label(String);

/// `POST /v1/tickets`, as sent.
#[derive(Debug, Deserialize, Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTicketBody {
    /// The project the ticket belongs to.
    #[validate(length(max = 64, message = "must be at most 64 characters"), custom(function = not_blank))]
    #[schema(
        example = "ops",
        max_length = 64,
        pattern = r"^[^\u0000]*[^\u0000\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$"
    )]
    pub project: String,
    #[validate(length(max = 200, message = "must be at most 200 characters"), custom(function = not_blank))]
    #[schema(
        example = "Rotate staging certificate",
        max_length = 200,
        pattern = r"^[^\u0000]*[^\u0000\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$"
    )]
    pub title: String,
    #[validate(length(max = 10000, message = "must be at most 10000 characters"))]
    #[schema(max_length = 10000)]
    pub description: Option<String>,
    /// Default `normal`.
    pub priority: Option<Priority>,
    /// The alert or event this ticket is about: at most one ticket per
    /// `(project, source_event_id)`, whatever key creates it.
    #[validate(length(min = 1, max = 255, message = "must be 1 to 255 characters"))]
    #[schema(example = "alert-7f3a", min_length = 1, max_length = 255)]
    pub source_event_id: Option<String>,
    #[validate(length(max = 20, message = "at most 20 labels"), custom(function = labels_are_short))]
    #[schema(value_type = Option<Vec<Label>>, max_items = 20)]
    pub labels: Option<Vec<String>>,
}

/// The validated create: defaults applied, so an omitted `priority` and
/// `"priority": "normal"` are one command with one fingerprint.
#[derive(Debug, Clone, Serialize)]
pub struct CreateTicket {
    pub project: String,
    pub title: String,
    pub description: Option<String>,
    pub priority: Priority,
    pub source_event_id: Option<String>,
    pub labels: Vec<String>,
}

impl From<CreateTicketBody> for CreateTicket {
    fn from(body: CreateTicketBody) -> Self {
        CreateTicket {
            project: body.project,
            title: body.title,
            description: body.description,
            priority: body.priority.unwrap_or_default(),
            source_event_id: body.source_event_id,
            labels: body.labels.unwrap_or_default(),
        }
    }
}

/// Which creates wait for a human (docs/contract.md §6): none by default. With
/// `TICKETS_APPROVAL_PRIORITY=urgent`, every urgent ticket does (with
/// `high`, high and urgent ones) — an urgent ticket pages people.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TicketsPolicy {
    /// Tickets at this priority or above need an approval.
    pub approval_from: Option<Priority>,
}

impl TicketsPolicy {
    pub fn from_env() -> Result<Self, String> {
        match std::env::var("TICKETS_APPROVAL_PRIORITY")
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            None => Ok(TicketsPolicy::default()),
            Some(v) if v == "off" => Ok(TicketsPolicy::default()),
            Some(v) => match Priority::parse(v.trim()) {
                Some(priority) => Ok(TicketsPolicy {
                    approval_from: Some(priority),
                }),
                None => Err(format!(
                    "TICKETS_APPROVAL_PRIORITY `{v}` is not off, low, normal, high or urgent"
                )),
            },
        }
    }

    /// `Some(what the approver judges)` when this create needs a human. All
    /// of it is the command's, so the fingerprint holds it to the approved run.
    pub fn approval_for(&self, command: &CreateTicket) -> Option<ApprovalSummary> {
        let from = self.approval_from?;
        (command.priority >= from).then(|| ApprovalSummary {
            action: format!("create a ticket with priority {}", command.priority.as_str()),
            target: format!("project {}", command.project),
            consequences: match command.priority {
                Priority::Urgent => "an urgent ticket pages the project's on-call engineer as soon as it exists",
                Priority::High => "a high-priority ticket goes to the top of the project's queue",
                Priority::Normal | Priority::Low => "a new ticket joins the project's queue",
            }
            .to_owned(),
            identifiers: [
                ("project", Some(command.project.clone())),
                ("title", Some(command.title.clone())),
                ("priority", Some(command.priority.as_str().to_owned())),
                ("source_event_id", command.source_event_id.clone()),
            ]
            .into_iter()
            .filter_map(|(name, value)| value.map(|v| (name.to_owned(), v)))
            .collect(),
        })
    }
}

/// `POST /v1/tickets/{ticket_id}/comments`, as sent.
#[derive(Debug, Deserialize, Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddCommentBody {
    #[validate(length(max = 10000, message = "must be at most 10000 characters"), custom(function = not_blank))]
    #[schema(
        example = "Certificate rotated; watching the error rate.",
        max_length = 10000,
        pattern = r"^[^\u0000]*[^\u0000\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$"
    )]
    pub body: String,
}

/// The validated comment; the path parameter is part of the command.
#[derive(Debug, Clone, Serialize)]
pub struct AddComment {
    pub ticket_id: String,
    pub body: String,
}

/// `PUT /v1/tickets/{ticket_id}/status`: the end state the caller wants.
#[derive(Debug, Deserialize, Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetStatusBody {
    pub status: TicketStatus,
    /// The version the caller last saw; a stale one is refused with 409 `version_mismatch`.
    #[validate(range(min = 1, message = "must be at least 1"))]
    #[schema(minimum = 1)]
    pub expected_version: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Ticket {
    #[schema(example = "tkt_0193a1b2c3d4e5f60718293a4b5c6d7e")]
    pub id: String,
    pub project: String,
    pub title: String,
    pub description: Option<String>,
    pub priority: Priority,
    pub status: TicketStatus,
    pub source_event_id: Option<String>,
    pub labels: Vec<String>,
    /// Grows by one with every status change.
    pub version: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Ticket {
    pub fn url(&self) -> String {
        format!("/v1/tickets/{}", self.id)
    }
}

/// Whether a create made a ticket or found the one its source event already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CreateOutcome {
    Created,
    MatchedExisting,
}

impl CreateOutcome {
    /// 201 for a new ticket, 200 for the one the source event already has.
    pub fn status(self) -> axum::http::StatusCode {
        match self {
            CreateOutcome::Created => axum::http::StatusCode::CREATED,
            CreateOutcome::MatchedExisting => axum::http::StatusCode::OK,
        }
    }
}

/// The answer to a create: the ticket and how it was reached.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TicketCreated {
    #[serde(flatten)]
    pub ticket: Ticket,
    pub outcome: CreateOutcome,
}

/// The answer to a status change.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TicketStatusChanged {
    #[serde(flatten)]
    pub ticket: Ticket,
    /// `false` when the ticket already had this status: nothing was written.
    pub changed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Comment {
    #[schema(example = "cmt_0193a1b2c3d4e5f60718293a4b5c6d7e")]
    pub id: String,
    pub ticket_id: String,
    pub body: String,
    /// The principal that wrote it.
    pub author_id: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Comment {
    pub fn url(&self) -> String {
        format!("/v1/tickets/{}/comments/{}", self.ticket_id, self.id)
    }
}

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

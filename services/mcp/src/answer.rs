//! What a tool call answers (docs/contract.md §13): the outcome in §13's
//! words, the operation it belongs to, the service's own answer,
//! and the one next step the retry rule allows.
//!
//! A call that reached a service answers with an [`Answer`] (`isError:
//! false`), a refusal or a business failure included: they are answers, not
//! faults. Only a call that could not be made — bad input, an intent reused
//! with another payload, a service that could not be reached and that nothing
//! is known of — is a [`ToolError`] (`isError: true`).

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

/// One tool call's answer: the `structuredContent` every tool declares as its
/// `outputSchema`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Answer {
    pub outcome: Outcome,
    /// The operation the call belongs to, once the service has one (`op_…`).
    pub operation_id: Option<String>,
    /// The key the call was sent with: made once per intent, or the one given.
    pub idempotency_key: Option<String>,
    /// The service's last HTTP status, when it answered.
    #[schemars(schema_with = "http_status")]
    pub http_status: Option<u16>,
    /// The service's body: the resource, the operation, or its problem.
    pub resource: Option<Value>,
    pub next_step: NextStep,
    /// The approval request, when a human must decide first.
    pub approval: Option<ApprovalWait>,
}

impl Answer {
    /// A read that found nothing, without asking a service.
    pub fn not_found() -> Answer {
        Answer {
            outcome: Outcome::NotFound,
            operation_id: None,
            idempotency_key: None,
            http_status: None,
            resource: None,
            next_step: NextStep::Done,
            approval: None,
        }
    }
}

/// An HTTP status: an integer, with no `format` JSON Schema lacks.
fn http_status(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": ["integer", "null"], "minimum": 100, "maximum": 599})
}

/// What became of the call (docs/contract.md §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The service did it, now.
    Created,
    /// The service found it done already: a ticket for the same source event,
    /// a status the ticket already had.
    MatchedExisting,
    /// The service had done it for this key: its first answer again.
    Replayed,
    /// Still running after the waits one call allows.
    InProgress,
    /// A human must approve the exact request first.
    AwaitingApproval,
    /// The key names another request at the service.
    KeyReused,
    /// A known, final refusal of the business (an order already paid, a
    /// refund above what was captured, an environment locked): stored
    /// against the key, replayed the same.
    BusinessFailure,
    /// An external effect may or may not have happened: the service's
    /// reconciler finds out. Never send again; poll.
    OutcomeUnknown,
    /// The service refused the request as sent and claimed nothing (bad input
    /// it alone can judge, a resource that does not exist, a key without the
    /// right).
    Refused,
    /// A read found what it asked for.
    Found,
    /// A read found nothing by that id or key.
    NotFound,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::MatchedExisting => "matched_existing",
            Outcome::Replayed => "replayed",
            Outcome::InProgress => "in_progress",
            Outcome::AwaitingApproval => "awaiting_approval",
            Outcome::KeyReused => "key_reused",
            Outcome::BusinessFailure => "business_failure",
            Outcome::OutcomeUnknown => "outcome_unknown",
            Outcome::Refused => "refused",
            Outcome::Found => "found",
            Outcome::NotFound => "not_found",
        }
    }
}

/// The one thing the retry rule lets the agent do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub enum NextStep {
    /// Known for good: nothing to do.
    #[serde(rename = "done")]
    Done,
    /// Its work goes on (or its outcome is unknown): ask `get_operation`, never send again.
    #[serde(rename = "poll get_operation")]
    PollOperation,
    /// Safe and useful: the same call, with the same intent, replays or finishes it.
    #[serde(rename = "call again with the same intent")]
    CallAgain,
    /// Sending it again cannot help: a new intent, or a person.
    #[serde(rename = "stop: new intent or human review")]
    Stop,
    /// A human decides; once approved, the same call with the same intent runs it.
    #[serde(rename = "wait for approval")]
    WaitForApproval,
}

/// The approval a call waits for.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ApprovalWait {
    pub approval_id: String,
    /// What the approver sees: the exact request, in a person's words.
    pub summary: Value,
    /// The operation's status: it shows the decision.
    pub status_url: String,
}

impl ApprovalWait {
    /// The approval request of a 202 `awaiting_approval` body.
    pub fn from_body(body: &Value) -> Option<ApprovalWait> {
        Some(ApprovalWait {
            approval_id: body["approval_id"].as_str()?.to_owned(),
            summary: body["summary"].clone(),
            status_url: body["status_url"].as_str()?.to_owned(),
        })
    }
}

/// A call that could not be made (`isError: true`): a stable `code` and what
/// to do about it, and nothing of the request itself.
#[derive(Debug, Clone, Serialize)]
pub struct ToolError {
    pub code: &'static str,
    pub detail: String,
    /// The fields at fault, for bad input: `{field, message}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Value>,
}

impl ToolError {
    pub fn new(code: &'static str, detail: impl Into<String>) -> ToolError {
        ToolError {
            code,
            detail: detail.into(),
            errors: None,
        }
    }

    /// The server's journal failed the call. The cause goes to the log, not
    /// to the agent: a database's own text is never a tool's answer.
    pub fn journal_unavailable(cause: &dyn std::fmt::Display) -> ToolError {
        tracing::error!(error = %cause, "the MCP server's journal failed a call");
        ToolError::new(
            "journal_unavailable",
            "the MCP server could not use its journal: call again with the same intent later",
        )
    }

    /// The call ended in a fault of the server's own: logged, not answered.
    pub fn internal(cause: &dyn std::fmt::Display) -> ToolError {
        tracing::error!(error = %cause, "a tool call failed inside the MCP server");
        ToolError::new(
            "internal",
            "the MCP server failed this call: call again with the same intent",
        )
    }

    /// Input that does not make a request: nothing was journaled or sent.
    pub fn invalid_input(detail: impl Into<String>) -> ToolError {
        ToolError::new("invalid_input", detail)
    }

    /// The problem a service would have answered, found before sending.
    pub fn from_problem(problem: &Value) -> ToolError {
        ToolError {
            code: "invalid_input",
            detail: problem["detail"].as_str().unwrap_or("the input is invalid").to_owned(),
            errors: problem.get("errors").cloned(),
        }
    }
}

impl From<ToolError> for CallToolResult {
    fn from(error: ToolError) -> CallToolResult {
        let text = serde_json::to_string(&error).unwrap_or_else(|_| json!({"code": error.code}).to_string());
        CallToolResult::error(vec![ContentBlock::text(text)])
    }
}

//! Which endpoint each tool maps onto: its service, its method and route,
//! and the service's own parse of its body, run before anything is
//! journaled or sent (so the MCP server refuses exactly what the service
//! would, with the same field messages).

use platform::{error::ApiError, json::parse_body};
use serde::de::DeserializeOwned;
use validator::Validate;

/// The three services a tool may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Tickets,
    Payments,
    Deployments,
}

impl Service {
    pub const ALL: [Service; 3] = [Service::Tickets, Service::Payments, Service::Deployments];

    pub fn as_str(self) -> &'static str {
        match self {
            Service::Tickets => "tickets",
            Service::Payments => "payments",
            Service::Deployments => "deployments",
        }
    }
}

/// The service's parse of a body: its deserialization (unknown fields
/// refused), its validation, and the command it builds where building one
/// needs nothing but the body.
pub type Check = fn(&[u8]) -> Result<(), ApiError>;

/// A write tool's endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Write {
    pub service: Service,
    pub method: agent::Method,
    /// The route template, as the service's OpenAPI document names it.
    pub route: &'static str,
    /// `None`: the endpoint takes no body.
    pub check: Option<Check>,
}

/// A read tool's endpoint: a GET of a route template.
#[derive(Debug, Clone, Copy)]
pub struct Read {
    pub service: Service,
    pub route: &'static str,
    /// The query parameters it takes.
    pub query: &'static [&'static str],
}

fn body<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<(), ApiError> {
    parse_body::<T>(bytes).map(drop)
}

fn body_then<T: DeserializeOwned + Validate, C: TryFrom<T, Error = ApiError>>(bytes: &[u8]) -> Result<(), ApiError> {
    C::try_from(parse_body::<T>(bytes)?).map(drop)
}

pub const CREATE_TICKET: Write = Write {
    service: Service::Tickets,
    method: agent::Method::Post,
    route: "/v1/tickets",
    check: Some(body::<tickets::domain::CreateTicketBody>),
};
pub const COMMENT_ON_TICKET: Write = Write {
    service: Service::Tickets,
    method: agent::Method::Post,
    route: "/v1/tickets/{ticket_id}/comments",
    check: Some(body::<tickets::domain::AddCommentBody>),
};
pub const SET_TICKET_STATUS: Write = Write {
    service: Service::Tickets,
    method: agent::Method::Put,
    route: "/v1/tickets/{ticket_id}/status",
    check: Some(body::<tickets::domain::SetStatusBody>),
};
pub const CREATE_PAYMENT_INTENT: Write = Write {
    service: Service::Payments,
    method: agent::Method::Post,
    route: "/v1/payment_intents",
    check: Some(body_then::<payments::domain::CreateIntentBody, payments::domain::CreateIntent>),
};
pub const CAPTURE_PAYMENT: Write = Write {
    service: Service::Payments,
    method: agent::Method::Post,
    route: "/v1/payment_intents/{intent_id}/capture",
    check: Some(body::<payments::domain::CaptureBody>),
};
pub const REFUND_PAYMENT: Write = Write {
    service: Service::Payments,
    method: agent::Method::Post,
    route: "/v1/payment_intents/{intent_id}/refunds",
    check: Some(body::<payments::domain::RefundBody>),
};
pub const CANCEL_PAYMENT_INTENT: Write = Write {
    service: Service::Payments,
    method: agent::Method::Post,
    route: "/v1/payment_intents/{intent_id}/cancel",
    check: None,
};
pub const CREATE_DEPLOYMENT: Write = Write {
    service: Service::Deployments,
    method: agent::Method::Post,
    route: "/v1/deployments",
    check: Some(body_then::<deployments::domain::CreateDeploymentBody, deployments::domain::CreateDeployment>),
};
pub const CANCEL_DEPLOYMENT: Write = Write {
    service: Service::Deployments,
    method: agent::Method::Post,
    route: "/v1/deployments/{deployment_id}/cancel",
    check: None,
};
pub const CREATE_ROLLBACK: Write = Write {
    service: Service::Deployments,
    method: agent::Method::Post,
    route: "/v1/rollbacks",
    check: Some(body::<deployments::domain::RollbackBody>),
};

pub const GET_TICKET: Read = Read {
    service: Service::Tickets,
    route: "/v1/tickets/{ticket_id}",
    query: &[],
};
pub const LIST_TICKETS: Read = Read {
    service: Service::Tickets,
    route: "/v1/tickets",
    query: &["project", "source_event_id", "status", "limit", "cursor"],
};
pub const GET_PAYMENT_INTENT: Read = Read {
    service: Service::Payments,
    route: "/v1/payment_intents/{intent_id}",
    query: &[],
};
pub const GET_DEPLOYMENT: Read = Read {
    service: Service::Deployments,
    route: "/v1/deployments/{deployment_id}",
    query: &[],
};
pub const GET_ENVIRONMENT: Read = Read {
    service: Service::Deployments,
    route: "/v1/environments/{service}/{environment}",
    query: &[],
};

/// Every write tool, by name.
pub const WRITES: [(&str, Write); 10] = [
    ("create_ticket", CREATE_TICKET),
    ("comment_on_ticket", COMMENT_ON_TICKET),
    ("set_ticket_status", SET_TICKET_STATUS),
    ("create_payment_intent", CREATE_PAYMENT_INTENT),
    ("capture_payment", CAPTURE_PAYMENT),
    ("refund_payment", REFUND_PAYMENT),
    ("cancel_payment_intent", CANCEL_PAYMENT_INTENT),
    ("create_deployment", CREATE_DEPLOYMENT),
    ("cancel_deployment", CANCEL_DEPLOYMENT),
    ("create_rollback", CREATE_ROLLBACK),
];

/// Every read tool that is one GET, by name.
pub const READS: [(&str, Read); 5] = [
    ("get_ticket", GET_TICKET),
    ("list_tickets", LIST_TICKETS),
    ("get_payment_intent", GET_PAYMENT_INTENT),
    ("get_deployment", GET_DEPLOYMENT),
    ("get_environment", GET_ENVIRONMENT),
];

/// Operations and approvals live in every service: these are asked of the
/// one that knows the id (see `gateway`).
pub const OPERATION_BY_ID: &str = "/v1/operations/{operation_id}";
pub const APPROVAL_BY_ID: &str = "/v1/approvals/{approval_id}";

/// The argument a tool takes for a route's path parameter: a payment
/// intent's id is `payment_intent_id`, never to be mistaken for an `intent`.
pub fn argument_for(parameter: &str) -> &str {
    match parameter {
        "intent_id" => "payment_intent_id",
        other => other,
    }
}

/// The names a route template's `{…}` holds, in order.
pub fn path_parameters(route: &str) -> Vec<&str> {
    route
        .split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
        .collect()
}

//! The one table of the matrix: for every operation of every service — a
//! method and a route template, as the service's OpenAPI document names
//! them — what each principal is answered when it names acme's resources.
//! When the contract changes who may do what, the change is a cell here.
//!
//! Cells that write are chosen so that a write by the right principal leaves
//! the seeds as the other cells need them: a create makes something new, a
//! cancel finds what was cancelled already, a decision is the one acme's
//! approver made already, a resolution or redelivery finds an operation
//! that needs none (409 `invalid_state`, decided after the role and the
//! account). No row depends on the order the rows run in.

use std::fmt;

use serde_json::{Value, json};

use crate::world::{Seeds, digest};

/// What a cell must be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Success, with this status.
    Status(u16),
    /// problem+json, with this status and `code`.
    Problem(u16, &'static str),
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Status(status) => write!(f, "{status}"),
            Expect::Problem(status, code) => write!(f, "{status} {code}"),
        }
    }
}

pub const OK: Expect = Expect::Status(200);
pub const CREATED: Expect = Expect::Status(201);
pub const ACCEPTED: Expect = Expect::Status(202);
pub const UNAUTHENTICATED: Expect = Expect::Problem(401, "unauthenticated");
pub const FORBIDDEN: Expect = Expect::Problem(403, "forbidden");
pub const NOT_FOUND: Expect = Expect::Problem(404, "not_found");
pub const INVALID_STATE: Expect = Expect::Problem(409, "invalid_state");

/// A row every service has: the routes the `idempotency` crate mounts, and
/// the pages every service serves.
pub const EVERY_SERVICE: &str = "*";

/// One operation, sent one way, by every principal.
pub struct Row {
    /// The service whose document has it, or [`EVERY_SERVICE`].
    pub service: &'static str,
    /// As the document spells it: `get`, `post`, `put`.
    pub method: &'static str,
    pub route: &'static str,
    /// Appended to the path; `{seed}`s are filled as the route's are.
    pub query: &'static str,
    /// The seed that fills a `{parameter}`, where it is not the seed of that name.
    pub targets: &'static [(&'static str, &'static str)],
    /// A valid body; the cell's number makes it new where it must be.
    pub body: Option<fn(&Seeds, usize) -> Value>,
    /// `false` for the pages no document lists (they need no key).
    pub documented: bool,
    /// Per principal, in the order of [`crate::world::PRINCIPALS`].
    pub expect: [Expect; 8],
}

impl Row {
    fn query(mut self, query: &'static str) -> Row {
        self.query = query;
        self
    }

    fn target(mut self, targets: &'static [(&'static str, &'static str)]) -> Row {
        self.targets = targets;
        self
    }

    fn body(mut self, body: fn(&Seeds, usize) -> Value) -> Row {
        self.body = Some(body);
        self
    }
}

fn row(service: &'static str, method: &'static str, route: &'static str, expect: [Expect; 8]) -> Row {
    Row {
        service,
        method,
        route,
        query: "",
        targets: &[],
        body: None,
        documented: true,
        expect,
    }
}

/// A page every service serves to anyone, with or without a key (docs/contract.md §5, §11).
fn public(route: &'static str) -> Row {
    Row {
        documented: false,
        ..row(EVERY_SERVICE, "get", route, [OK; 8])
    }
}

/// A `/v1` operation's answers: 401 for nobody and for a key no service
/// has (§1), then those of acme's agent, approver and admin, then those of
/// globex's agent, approver and admin naming acme's resources.
fn v1(acme: [Expect; 3], globex: [Expect; 3]) -> [Expect; 8] {
    let [agent, approver, admin] = acme;
    let [other_agent, other_approver, other_admin] = globex;
    [
        UNAUTHENTICATED,
        UNAUTHENTICATED,
        agent,
        approver,
        admin,
        other_agent,
        other_approver,
        other_admin,
    ]
}

/// Every role of the account gets `own`; every role of another account, `other`.
fn any_role(own: Expect, other: Expect) -> [Expect; 8] {
    v1([own; 3], [other; 3])
}

/// For approvers and admins, not agents (§4, §6, §8): each account's own.
fn people(other: Expect) -> [Expect; 8] {
    v1([FORBIDDEN, OK, OK], [FORBIDDEN, other, other])
}

/// Only an admin, decided before any lookup (§5): another account's admin finds nothing.
fn admin_settles(own: Expect) -> [Expect; 8] {
    v1([FORBIDDEN, FORBIDDEN, own], [FORBIDDEN, FORBIDDEN, NOT_FOUND])
}

pub fn table() -> Vec<Row> {
    const ALL: &str = EVERY_SERVICE;
    vec![
        // the operation status, settling by hand, approvals, the journal (§4, §5, §6, §8)
        row(ALL, "get", "/v1/operations/{operation_id}", any_role(OK, NOT_FOUND)),
        // by key anyone may look; another account's key names nothing there
        row(ALL, "get", "/v1/operations", any_role(OK, OK)).query("?idempotency_key={idempotency_key}"),
        // without a key: what needs a person, for people
        row(ALL, "get", "/v1/operations", people(OK)),
        row(ALL, "post", "/v1/operations/{operation_id}/resolution", admin_settles(INVALID_STATE))
            .body(|_, _| json!({"outcome": "failed", "evidence": "no trace of it at the external system"})),
        row(ALL, "post", "/v1/operations/{operation_id}/redelivery", admin_settles(INVALID_STATE)),
        row(ALL, "get", "/v1/approvals", people(OK)),
        row(ALL, "get", "/v1/approvals/{approval_id}", people(NOT_FOUND)),
        // only an approver decides; acme's made this decision already, and gets it again
        row(
            ALL,
            "post",
            "/v1/approvals/{approval_id}/decision",
            v1([FORBIDDEN, OK, FORBIDDEN], [FORBIDDEN, NOT_FOUND, FORBIDDEN]),
        )
        .target(&[("approval_id", "decided_approval_id")])
        .body(|seeds, _| json!({"decision": "reject", "fingerprint": seeds.get("decided_fingerprint")})),
        row(ALL, "get", "/v1/audit", people(OK)),
        // the head of the service's chain: a number and a hash, nothing of any account
        row(ALL, "get", "/v1/audit/head", people(OK)),
        public("/healthz"),
        public("/openapi.json"),
        public("/docs"),
        public("/docs/problems/not_found"),
        public("/docs/api/"),
        public("/metrics"),
        // tickets (§7)
        row("tickets", "post", "/v1/tickets", any_role(CREATED, CREATED))
            .body(|_, cell| json!({"project": "matrix", "title": format!("Cell {cell}")})),
        row("tickets", "get", "/v1/tickets", any_role(OK, OK)),
        row("tickets", "get", "/v1/tickets/{ticket_id}", any_role(OK, NOT_FOUND)),
        row("tickets", "post", "/v1/tickets/{ticket_id}/comments", any_role(CREATED, NOT_FOUND))
            .body(|_, cell| json!({"body": format!("Cell {cell}")})),
        row("tickets", "get", "/v1/tickets/{ticket_id}/comments", any_role(OK, NOT_FOUND)),
        row(
            "tickets",
            "get",
            "/v1/tickets/{ticket_id}/comments/{comment_id}",
            any_role(OK, NOT_FOUND),
        ),
        // the status it has: a no-op for acme, nothing at all for anyone else
        row("tickets", "put", "/v1/tickets/{ticket_id}/status", any_role(OK, NOT_FOUND))
            .body(|_, _| json!({"status": "open"})),
        // payments (§7)
        row("payments", "post", "/v1/payment_intents", any_role(CREATED, CREATED)).body(|_, cell| {
            json!({"order_id": format!("cell-{cell}"), "amount": "5.00", "currency": "EUR",
                   "payee": {"name": "Acme Supplies GmbH", "account": "DE89370400440532013000"}})
        }),
        row("payments", "get", "/v1/payment_intents", any_role(OK, OK)),
        row("payments", "get", "/v1/payment_intents/{intent_id}", any_role(OK, NOT_FOUND)),
        // cancelling what is cancelled already answers it unchanged
        row(
            "payments",
            "post",
            "/v1/payment_intents/{intent_id}/cancel",
            any_role(OK, NOT_FOUND),
        )
        .target(&[("intent_id", "cancelled_intent_id")]),
        // the intent was captured already
        row(
            "payments",
            "post",
            "/v1/payment_intents/{intent_id}/capture",
            any_role(INVALID_STATE, NOT_FOUND),
        )
        .body(|_, _| json!({})),
        row(
            "payments",
            "get",
            "/v1/payment_intents/{intent_id}/captures",
            any_role(OK, NOT_FOUND),
        ),
        // 1.00 of what is left of the capture's 40.00, for each of acme's roles
        row(
            "payments",
            "post",
            "/v1/payment_intents/{intent_id}/refunds",
            any_role(ACCEPTED, NOT_FOUND),
        )
        .body(|_, _| json!({"amount": "1.00"})),
        row(
            "payments",
            "get",
            "/v1/payment_intents/{intent_id}/refunds",
            any_role(OK, NOT_FOUND),
        ),
        row("payments", "get", "/v1/captures/{capture_id}", any_role(OK, NOT_FOUND)),
        row("payments", "get", "/v1/refunds/{refund_id}", any_role(OK, NOT_FOUND)),
        // deployments (§7): each cell's deployment is of a service of its own, so none is locked
        row("deployments", "post", "/v1/deployments", any_role(ACCEPTED, ACCEPTED)).body(|_, cell| {
            json!({"service": format!("cell-{cell}"), "environment": "development", "artifact_digest": digest('f')})
        }),
        row("deployments", "get", "/v1/deployments", any_role(OK, OK)),
        row("deployments", "get", "/v1/deployments/{deployment_id}", any_role(OK, NOT_FOUND)),
        row(
            "deployments",
            "post",
            "/v1/deployments/{deployment_id}/cancel",
            any_role(OK, NOT_FOUND),
        )
        .target(&[("deployment_id", "cancelled_deployment_id")]),
        // a rollback always waits for an approver first
        row("deployments", "post", "/v1/rollbacks", any_role(ACCEPTED, NOT_FOUND)).body(|seeds, _| {
            json!({"service": "checkout", "environment": "staging",
                   "to_deployment_id": seeds.get("first_deployment_id"), "reason": "matrix"})
        }),
        row("deployments", "get", "/v1/rollbacks/{rollback_id}", any_role(OK, NOT_FOUND)),
        // another account's environment of the same name is its own, and empty
        row(
            "deployments",
            "get",
            "/v1/environments/{service}/{environment}",
            any_role(OK, OK),
        ),
    ]
}

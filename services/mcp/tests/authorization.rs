//! The MCP tools' part of the authorization matrix (docs/contract.md §10,
//! §13), on both backends: an MCP server acting for globex, sharing its
//! journal with acme's, calls every tool it lists with acme's ids, acme's
//! intents and acme's keys. What each call must answer comes from one table
//! ([`table`]); a listed tool the table lacks fails, and so does a row whose
//! tool is no longer listed. No answer may show an acme id that the call did
//! not send.

mod support;

use std::collections::BTreeSet;

use platform::Backend;
use serde_json::{Value, json};
use support::*;

/// What acme made through its own MCP server, by name.
struct Seeds {
    values: Vec<(&'static str, String)>,
}

impl Seeds {
    #[track_caller]
    fn get(&self, name: &str) -> &str {
        let found = self.values.iter().find(|(n, _)| *n == name);
        &found.unwrap_or_else(|| panic!("no seed `{name}`")).1
    }

    fn add(&mut self, name: &'static str, value: &Value) {
        let value = value.as_str().unwrap_or_else(|| panic!("seeding `{name}`: {value}"));
        self.values.push((name, value.to_owned()));
    }
}

/// What a call naming acme's things must answer globex.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// A read finds nothing.
    NotFound,
    /// A write is answered the service's 404 `not_found`, and nothing of acme's is touched.
    ServiceNotFound,
    /// A write that names nothing of acme's but its intent or key: globex's
    /// own operation, made now, never acme's replayed.
    CreatedAnew,
    /// A read of a list or a place globex has too: its own, without acme's.
    FoundOwn,
}

/// One call: a tool, its arguments from acme's seeds, what it must answer.
struct Row {
    tool: &'static str,
    arguments: fn(&Seeds) -> Value,
    expect: Expect,
}

const fn row(tool: &'static str, arguments: fn(&Seeds) -> Value, expect: Expect) -> Row {
    Row {
        tool,
        arguments,
        expect,
    }
}

const PAYEE: &str = "DE89370400440532013000";

fn acme_ticket(seeds: &Seeds) -> Value {
    json!({"project": seeds.get("project"), "title": "Disk full"})
}

fn acme_intent(seeds: &Seeds) -> Value {
    json!({"order_id": seeds.get("order_id"), "amount": "2500.00", "currency": "EUR",
           "payee": {"name": "Acme Supplies GmbH", "account": PAYEE}})
}

fn acme_deployment() -> Value {
    json!({"service": "checkout", "environment": "staging", "artifact_digest": digest("acme")})
}

/// `base`, with `more`'s members added.
fn with(mut base: Value, more: Value) -> Value {
    base.as_object_mut().unwrap().extend(more.as_object().unwrap().clone());
    base
}

/// The one table: every tool, called by globex's server with acme's ids,
/// intents and keys (the intents acme used, with the payloads it sent). A
/// write's intent that globex sends is globex's from then on, so the lookups
/// by intent name one only acme sent, or one whose call the service refused
/// unclaimed.
fn table() -> Vec<Row> {
    use Expect::*;
    vec![
        row(
            "create_ticket",
            |s| with(acme_ticket(s), json!({"intent": "ticket for alert 4411"})),
            CreatedAnew,
        ),
        // a key one of acme's intents holds is globex's own in globex's account
        row(
            "create_ticket",
            |s| with(acme_ticket(s), json!({"idempotency_key": s.get("comment_key")})),
            CreatedAnew,
        ),
        row(
            "comment_on_ticket",
            |s| json!({"intent": "comment on alert 4411", "ticket_id": s.get("ticket_id"), "body": "Mine now"}),
            ServiceNotFound,
        ),
        row(
            "set_ticket_status",
            |s| json!({"intent": "close alert 4411", "ticket_id": s.get("ticket_id"), "status": "closed"}),
            ServiceNotFound,
        ),
        row(
            "create_payment_intent",
            |s| with(acme_intent(s), json!({"intent": "pay order"})),
            CreatedAnew,
        ),
        row(
            "capture_payment",
            |s| json!({"intent": "capture order", "payment_intent_id": s.get("payment_intent_id")}),
            ServiceNotFound,
        ),
        row(
            "refund_payment",
            |s| json!({"intent": "refund order", "payment_intent_id": s.get("payment_intent_id"), "amount": "1.00"}),
            ServiceNotFound,
        ),
        row(
            "cancel_payment_intent",
            |s| json!({"intent": "cancel order", "payment_intent_id": s.get("payment_intent_id")}),
            ServiceNotFound,
        ),
        row(
            "create_deployment",
            |_| with(acme_deployment(), json!({"intent": "deploy checkout"})),
            CreatedAnew,
        ),
        row(
            "cancel_deployment",
            |s| json!({"intent": "cancel checkout", "deployment_id": s.get("deployment_id")}),
            ServiceNotFound,
        ),
        row(
            "create_rollback",
            |s| {
                json!({"intent": "roll checkout back", "service": "checkout", "environment": "staging",
                       "to_deployment_id": s.get("deployment_id"), "reason": "mine now"})
            },
            ServiceNotFound,
        ),
        row(
            "get_operation",
            |s| json!({"operation_id": s.get("operation_id")}),
            NotFound,
        ),
        row(
            "get_operation",
            |s| json!({"idempotency_key": s.get("ticket_key")}),
            NotFound,
        ),
        row("get_operation", |_| json!({"intent": "note on alert 4411"}), NotFound),
        row("get_operation", |_| json!({"intent": "capture order"}), NotFound),
        row("get_ticket", |s| json!({"ticket_id": s.get("ticket_id")}), NotFound),
        row("list_tickets", |s| json!({"project": s.get("project")}), FoundOwn),
        row(
            "get_payment_intent",
            |s| json!({"payment_intent_id": s.get("payment_intent_id")}),
            NotFound,
        ),
        row(
            "get_deployment",
            |s| json!({"deployment_id": s.get("deployment_id")}),
            NotFound,
        ),
        row(
            "get_environment",
            |_| json!({"service": "checkout", "environment": "staging"}),
            FoundOwn,
        ),
        row(
            "get_approval",
            |s| json!({"approval_id": s.get("approval_id")}),
            NotFound,
        ),
    ]
}

/// acme's server makes one of each thing a tool can name.
async fn seed(acme: &Client) -> Seeds {
    let mut seeds = Seeds { values: Vec::new() };
    let project = unique("ops");
    let order = unique("order");
    seeds.values.push(("project", project.clone()));
    seeds.values.push(("order_id", order));

    let ticket = acme
        .call("create_ticket", ticket("ticket for alert 4411", &project, "Disk full"))
        .await;
    assert_eq!(ticket.outcome(), "created", "seeding: {:?}", ticket.json);
    seeds.add("ticket_id", &ticket.json["resource"]["id"]);
    seeds.add("ticket_key", &ticket.json["idempotency_key"]);
    seeds.add("operation_id", &ticket.json["operation_id"]);
    let comment = acme
        .call(
            "comment_on_ticket",
            json!({"intent": "comment on alert 4411", "ticket_id": seeds.get("ticket_id"), "body": "Looking"}),
        )
        .await;
    assert_eq!(comment.outcome(), "created", "seeding: {:?}", comment.json);
    seeds.add("comment_id", &comment.json["resource"]["id"]);
    seeds.add("comment_key", &comment.json["idempotency_key"]);
    // an intent only acme's server ever sends
    let note = acme
        .call(
            "comment_on_ticket",
            json!({"intent": "note on alert 4411", "ticket_id": seeds.get("ticket_id"), "body": "Noted"}),
        )
        .await;
    assert_eq!(note.outcome(), "created", "seeding: {:?}", note.json);
    seeds.add("note_operation_id", &note.json["operation_id"]);

    let intent = acme
        .call(
            "create_payment_intent",
            with(acme_intent(&seeds), json!({"intent": "pay order"})),
        )
        .await;
    assert_eq!(intent.outcome(), "created", "seeding: {:?}", intent.json);
    seeds.add("payment_intent_id", &intent.json["resource"]["id"]);
    // 2,500 EUR waits for an approver
    let capture = acme
        .call(
            "capture_payment",
            json!({"intent": "capture order", "payment_intent_id": seeds.get("payment_intent_id")}),
        )
        .await;
    assert_eq!(capture.outcome(), "awaiting_approval", "seeding: {:?}", capture.json);
    seeds.add("approval_id", &capture.json["approval"]["approval_id"]);
    seeds.add("capture_operation_id", &capture.json["operation_id"]);
    seeds.add("capture_key", &capture.json["idempotency_key"]);

    let deployment = acme
        .call(
            "create_deployment",
            with(acme_deployment(), json!({"intent": "deploy checkout"})),
        )
        .await;
    assert_eq!(deployment.outcome(), "created", "seeding: {:?}", deployment.json);
    seeds.add("deployment_id", &deployment.json["resource"]["id"]);
    seeds.add("deployment_key", &deployment.json["idempotency_key"]);
    seeds
}

/// Seeds that are acme's alone: everything but the names a caller makes up.
fn acme_values(seeds: &Seeds) -> impl Iterator<Item = &str> {
    seeds
        .values
        .iter()
        .filter(|(name, _)| !["project", "order_id"].contains(name))
        .map(|(_, value)| value.as_str())
}

/// What is wrong with `called`, if it is not what `expect` says.
fn mismatch(expect: Expect, called: &Called, seeds: &Seeds) -> Option<String> {
    let answer = &called.json;
    let outcome = answer["outcome"].as_str().unwrap_or_default();
    let right = !called.is_error
        && match expect {
            Expect::NotFound => outcome == "not_found",
            Expect::ServiceNotFound => {
                matches!(outcome, "refused" | "business_failure")
                    && answer["http_status"] == 404
                    && answer["resource"]["code"] == "not_found"
            }
            Expect::CreatedAnew => {
                let made = answer["resource"]["id"].as_str().unwrap_or_default();
                outcome == "created" && !made.is_empty() && !acme_values(seeds).any(|v| v == made)
            }
            Expect::FoundOwn => outcome == "found",
        };
    (!right).then(|| format!("expected {expect:?}, got {answer}"))
}

async fn every_tool_called_with_another_account_s_ids_intents_and_keys_answers_as_the_table_says(backend: Backend) {
    let world = World::start(backend).await;
    let acme = world.connect().await;
    let seeds = seed(&acme).await;
    let mut globex_config = world.config();
    globex_config.account = Some("globex".into());
    for target in [
        &mut globex_config.tickets,
        &mut globex_config.payments,
        &mut globex_config.deployments,
    ] {
        target.api_key = platform::testing::GLOBEX_AGENT.into();
    }
    // the same journal as acme's server: the harder case
    let globex = world.connect_with(globex_config).await;
    let listed: BTreeSet<String> = globex
        .client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|tool| tool.name.into_owned())
        .collect();
    let table = table();
    let mut wrong = Vec::new();
    for tool in &listed {
        if !table.iter().any(|row| row.tool == tool) {
            wrong.push(format!("{tool} is not in the table"));
        }
    }
    for row in &table {
        if !listed.contains(row.tool) {
            wrong.push(format!("the table's {} is not a listed tool", row.tool));
        }
    }

    for row in &table {
        let arguments = (row.arguments)(&seeds);
        let called = globex.call(row.tool, arguments.clone()).await;
        let cell = format!("{} {arguments}", row.tool);
        if let Some(why) = mismatch(row.expect, &called, &seeds) {
            wrong.push(format!("{cell}: {why}"));
        }
        let (sent, answered) = (arguments.to_string(), called.json.to_string());
        let shown: Vec<&str> = acme_values(&seeds)
            .filter(|value| !sent.contains(value) && answered.contains(value))
            .collect();
        if !shown.is_empty() {
            wrong.push(format!("{cell}: the answer shows acme's {shown:?}: {answered}"));
        }
    }
    let ticket = world
        .get(
            &world.tickets,
            &format!("/v1/tickets/{}", seeds.get("ticket_id")),
            ACME_AGENT,
        )
        .await;
    let intent = world
        .get(
            &world.payments,
            &format!("/v1/payment_intents/{}", seeds.get("payment_intent_id")),
            ACME_AGENT,
        )
        .await;
    if ticket["status"] != "open" || intent["state"] != "requires_capture" {
        wrong.push(format!("acme's things changed: {ticket} {intent}"));
    }
    eprintln!("mcp: {} tools in {} rows", listed.len(), table.len());
    assert!(
        wrong.is_empty(),
        "{} of {} calls are not as the table says:\n{}",
        wrong.len(),
        table.len(),
        wrong.join("\n")
    );
}

platform::both_backends!(every_tool_called_with_another_account_s_ids_intents_and_keys_answers_as_the_table_says);

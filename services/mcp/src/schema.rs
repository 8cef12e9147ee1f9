//! Each tool's `inputSchema`, taken from the service's own OpenAPI document
//! (the one `/openapi.json` serves, generated from the validated command
//! types): a field the service refuses, the schema refuses too.
//!
//! A write tool's input is the body's members, the route's path parameters,
//! and `intent` or `idempotency_key` beside them; a read tool's is its path
//! and query parameters. The document's component schemas come along as
//! `$defs`.

use std::collections::BTreeSet;

use rmcp::model::JsonObject;
use serde_json::{Map, Value, json};

use crate::endpoints::{Read, Service, Write, argument_for};

/// What an `intent` is, for the model that fills it in.
pub const INTENT: &str = "A stable name for this one intended action, e.g. \"ticket for alert 4411\" \
     (1-200 characters). Use one intent per action and the same intent on every retry of it, even \
     after a timeout or a restart: the server makes the idempotency key once per intent and reuses it, \
     so a retry can never do the action twice. The same intent with a different payload is refused.";
const IDEMPOTENCY_KEY: &str = "Instead of `intent`: an idempotency key you manage yourself, sent as is.";

/// The three services' OpenAPI documents, as their `/openapi.json` serves them.
#[derive(Debug, Clone)]
pub struct Documents {
    tickets: Value,
    payments: Value,
    deployments: Value,
}

impl Documents {
    /// The documents; `environments` are the deployments service's (its
    /// document enumerates them).
    pub fn new(environments: &[String]) -> Documents {
        Documents {
            tickets: platform::openapi::complete(&tickets::openapi()),
            payments: platform::openapi::complete(&payments::openapi()),
            deployments: platform::openapi::complete(&deployments::openapi(environments)),
        }
    }

    fn of(&self, service: Service) -> &Value {
        match service {
            Service::Tickets => &self.tickets,
            Service::Payments => &self.payments,
            Service::Deployments => &self.deployments,
        }
    }

    /// A write tool's input: the body's members with the route's path
    /// parameters and `intent` / `idempotency_key` beside them.
    pub fn write_input(&self, endpoint: &Write) -> JsonObject {
        let doc = self.of(endpoint.service);
        let operation = &doc["paths"][endpoint.route][endpoint.method.as_str().to_ascii_lowercase()];
        let mut input = Input::default();
        input.optional(
            "intent",
            json!({"type": "string", "minLength": 1, "maxLength": 200, "description": INTENT}),
        );
        input.optional(
            "idempotency_key",
            json!({"type": "string", "pattern": platform::openapi::IDEMPOTENCY_KEY_PATTERN, "description": IDEMPOTENCY_KEY}),
        );
        input.parameters(operation, "path");
        if let Some(body) = operation.pointer("/requestBody/content/application~1json/schema") {
            let body = resolve(doc, body);
            for (name, schema) in body["properties"].as_object().into_iter().flatten() {
                input.optional(name, schema.clone());
            }
            for name in body["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                input.required.insert(name.to_owned());
            }
        }
        input.finish(doc)
    }

    /// A read tool's input: its path and query parameters.
    pub fn read_input(&self, endpoint: &Read) -> JsonObject {
        let doc = self.of(endpoint.service);
        let operation = &doc["paths"][endpoint.route]["get"];
        let mut input = Input::default();
        input.parameters(operation, "path");
        input.parameters(operation, "query");
        input.finish(doc)
    }
}

/// An input schema being put together.
#[derive(Default)]
struct Input {
    properties: Map<String, Value>,
    required: BTreeSet<String>,
}

impl Input {
    fn optional(&mut self, name: &str, schema: Value) {
        self.properties.insert(name.to_owned(), schema);
    }

    /// The operation's parameters that are `location` (path, query).
    fn parameters(&mut self, operation: &Value, location: &str) {
        let parameters = operation["parameters"].as_array().into_iter().flatten();
        for parameter in parameters.filter(|p| p["in"] == location) {
            let Some(name) = parameter["name"].as_str().map(argument_for) else {
                continue;
            };
            let mut schema = parameter["schema"].clone();
            if let (Some(description), Some(schema)) = (parameter.get("description"), schema.as_object_mut()) {
                schema.insert("description".into(), description.clone());
            }
            self.optional(name, schema);
            if parameter["required"] == true {
                self.required.insert(name.to_owned());
            }
        }
    }

    /// The schema, with the document's component schemas it refers to as `$defs`.
    fn finish(self, doc: &Value) -> JsonObject {
        let mut schema = json!({
            "type": "object",
            "properties": self.properties,
            "required": self.required,
            "additionalProperties": false,
        });
        let defs = referenced_components(doc, &schema);
        if !defs.is_empty() {
            schema["$defs"] = Value::Object(defs);
        }
        rewrite_refs(&mut schema);
        object(schema)
    }
}

const COMPONENTS: &str = "#/components/schemas/";

/// A schema, or the component it refers to.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str().and_then(|r| r.strip_prefix(COMPONENTS)) {
        Some(name) => &doc["components"]["schemas"][name],
        None => schema,
    }
}

/// Every component `schema` reaches, through components that reach others.
fn referenced_components(doc: &Value, schema: &Value) -> Map<String, Value> {
    let mut found = Map::new();
    let mut waiting = Vec::new();
    refs(schema, &mut waiting);
    while let Some(name) = waiting.pop() {
        if found.contains_key(&name) {
            continue;
        }
        let component = doc["components"]["schemas"][&name].clone();
        refs(&component, &mut waiting);
        found.insert(name, component);
    }
    found
}

fn refs(schema: &Value, into: &mut Vec<String>) {
    match schema {
        Value::Object(object) => {
            if let Some(name) = object
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix(COMPONENTS))
            {
                into.push(name.to_owned());
            }
            object.values().for_each(|v| refs(v, into));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, into)),
        _ => {}
    }
}

fn rewrite_refs(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            if let Some(Value::String(reference)) = object.get_mut("$ref")
                && let Some(name) = reference.strip_prefix(COMPONENTS)
            {
                *reference = format!("#/$defs/{name}");
            }
            object.values_mut().for_each(rewrite_refs);
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

/// `get_operation`'s input: one of three ways to name an operation.
pub fn get_operation_input() -> JsonObject {
    let input = json!({
        "type": "object",
        "properties": {
            "operation_id": {"type": "string", "description": "The operation's id, `op_…`."},
            "idempotency_key": {"type": "string", "description": "The key it was sent with."},
            "intent": {"type": "string", "description": "The intent a write tool was called with."},
        },
        "additionalProperties": false,
        "description": "Exactly one of operation_id, idempotency_key, intent.",
    });
    object(input)
}

/// `get_approval`'s input.
pub fn get_approval_input() -> JsonObject {
    object(json!({
        "type": "object",
        "properties": {"approval_id": {"type": "string", "description": "The approval's id, `apr_…`."}},
        "required": ["approval_id"],
        "additionalProperties": false,
    }))
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(object) => object,
        _ => unreachable!("built as an object"),
    }
}

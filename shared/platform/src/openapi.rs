//! Completes a service's OpenAPI document with what its operations answer by
//! construction, so that each route's annotation names only its own outcomes
//! and the document still lists every status an operation can answer
//! (docs/contract.md §11):
//!
//! - the problems the shared layers answer before a handler runs: a key that
//!   authenticates nothing, input that does not parse, a body too large or
//!   not JSON, the idempotency layer's refusals, slow or oversized headers,
//!   a connection past the process's cap;
//! - the problem schema's `code` as an enumeration of [`PROBLEM_CODES`];
//! - the exact form of an `Idempotency-Key`, the bounds of a page's `limit`,
//!   and the NUL character that no string of a request may hold;
//! - links from a created resource to the operations on it, so a client (or
//!   a stateful fuzzer) can follow a create to its capture, comment or cancel.
//!
//! It works on the document as JSON: every rule reads what an operation
//! declares (its path, parameters, body) and adds what that implies.

mod links;

use serde_json::{Map, Value, json};
use utoipa::openapi::OpenApi;

use self::links::{add_links, links};
use crate::{page::MAX_LIMIT, problems::PROBLEM_CODES};

const PROBLEM_SCHEMA: &str = "#/components/schemas/Problem";

/// What the server accepts as a key: a bare token of visible ASCII, or an
/// RFC 8941 sf-string that unquotes to one; 1–255 characters either way.
pub const IDEMPOTENCY_KEY_PATTERN: &str = r#"^(?:[!#-~][!-~]{0,254}|"(?:[!#-\[\]-~]|\\["\\]){1,255}")$"#;

/// Every string a request carries is refused if it holds a NUL (PostgreSQL
/// cannot store one, and both backends answer alike).
pub const NO_NUL_PATTERN: &str = r"^[^\u0000]*$";

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// The document `/openapi.json` serves.
pub fn complete(doc: &OpenApi) -> Value {
    let mut doc = serde_json::to_value(doc).expect("an OpenAPI document is JSON");
    enumerate_problem_codes(&mut doc);
    constrain_request_bodies(&mut doc);
    let links = links(&doc);
    for (path, method, operation) in operations_mut(&mut doc) {
        constrain_parameters(operation);
        for (status, codes) in answered_by_construction(&path, operation) {
            add_problem_response(operation, status, &codes);
        }
        add_headers_too_large(operation);
        if let Some(links) = links.get(&(path, method)) {
            add_links(operation, links);
        }
    }
    doc
}

/// Each operation of the document, with its path and method.
fn operations_mut(doc: &mut Value) -> Vec<(String, &'static str, &mut Map<String, Value>)> {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return Vec::new();
    };
    paths
        .iter_mut()
        .flat_map(|(path, item)| {
            let item = item.as_object_mut().into_iter().flat_map(|item| item.iter_mut());
            item.filter_map(move |(method, operation)| {
                let method = METHODS.into_iter().find(|m| m == method)?;
                Some((path.clone(), method, operation.as_object_mut()?))
            })
        })
        .collect()
}

fn operations(doc: &Value) -> Vec<(&str, &'static str, &Map<String, Value>)> {
    let Some(paths) = doc.get("paths").and_then(Value::as_object) else {
        return Vec::new();
    };
    paths
        .iter()
        .flat_map(|(path, item)| {
            let item = item.as_object().into_iter().flat_map(|item| item.iter());
            item.filter_map(move |(method, operation)| {
                let method = METHODS.into_iter().find(|m| m == method)?;
                Some((path.as_str(), method, operation.as_object()?))
            })
        })
        .collect()
}

fn parameters(operation: &Map<String, Value>) -> impl Iterator<Item = &Map<String, Value>> {
    operation
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

fn takes(operation: &Map<String, Value>, location: &str) -> bool {
    parameters(operation).any(|p| p["in"] == location)
}

fn takes_idempotency_key(operation: &Map<String, Value>) -> bool {
    parameters(operation).any(|p| p["in"] == "header" && is_idempotency_key(p))
}

/// A key the operation cannot do without (a decision or a cancel takes one,
/// and honours it, but needs none).
fn requires_idempotency_key(operation: &Map<String, Value>) -> bool {
    parameters(operation).any(|p| p["in"] == "header" && is_idempotency_key(p) && p["required"] == true)
}

fn is_idempotency_key(parameter: &Map<String, Value>) -> bool {
    parameter["name"]
        .as_str()
        .is_some_and(|name| name.eq_ignore_ascii_case("idempotency-key"))
}

/// The statuses an operation answers because of what it takes, each with the
/// codes it may carry; the route's own annotation adds its business outcomes.
fn answered_by_construction(path: &str, operation: &Map<String, Value>) -> Vec<(&'static str, Vec<&'static str>)> {
    let has_body = operation.contains_key("requestBody");
    let has_key = takes_idempotency_key(operation);
    let mut bad_request = Vec::new();
    if has_body || takes(operation, "query") {
        bad_request.push("invalid_request");
    }
    if has_key {
        if requires_idempotency_key(operation) {
            bad_request.push("idempotency_key_missing");
        }
        bad_request.push("idempotency_key_invalid");
    }
    let mut answers = Vec::new();
    if !bad_request.is_empty() {
        answers.push(("400", bad_request));
    }
    if path.starts_with("/v1/") {
        answers.push(("401", vec!["unauthenticated"]));
    }
    if takes(operation, "path") {
        answers.push(("404", vec!["not_found"]));
    }
    if has_key {
        answers.push(("409", vec!["request_in_progress", "operation_outcome_unknown"]));
        answers.push(("422", vec!["idempotency_key_reused"]));
    }
    if has_body {
        answers.push(("413", vec!["payload_too_large"]));
        answers.push(("415", vec!["unsupported_media_type"]));
    }
    answers.push(("408", vec!["request_timeout"]));
    answers.push(("500", vec!["internal_error"]));
    answers.push(("503", vec!["too_many_connections"]));
    answers
}

/// Headers larger than the server reads (32 KiB) are refused by the HTTP
/// layer before any route runs, with a 431 that has no body.
fn add_headers_too_large(operation: &mut Map<String, Value>) {
    let responses = operation
        .entry("responses")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("`responses` is an object");
    responses.entry("431").or_insert_with(
        || json!({"description": "The request's headers are larger than 32 KiB; the HTTP layer answers with no body."}),
    );
}

/// Adds a problem+json answer unless the route documents that status itself.
fn add_problem_response(operation: &mut Map<String, Value>, status: &str, codes: &[&str]) {
    let responses = operation
        .entry("responses")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("`responses` is an object");
    if responses.contains_key(status) {
        return;
    }
    let codes: Vec<String> = codes.iter().map(|code| format!("`{code}`")).collect();
    responses.insert(
        status.to_owned(),
        json!({
            "description": codes.join(", "),
            "content": {"application/problem+json": {"schema": {"$ref": PROBLEM_SCHEMA}}}
        }),
    );
}

fn enumerate_problem_codes(doc: &mut Value) {
    let codes: Vec<&str> = PROBLEM_CODES.iter().map(|(code, _, _)| *code).collect();
    if let Some(code) = doc.pointer_mut("/components/schemas/Problem/properties/code") {
        code["enum"] = json!(codes);
    }
}

/// Declares what the server checks of a parameter: the form of an
/// idempotency key, the bounds of `limit`, and no NUL in a query string.
fn constrain_parameters(operation: &mut Map<String, Value>) {
    let Some(parameters) = operation.get_mut("parameters").and_then(Value::as_array_mut) else {
        return;
    };
    for parameter in parameters.iter_mut().filter_map(Value::as_object_mut) {
        if parameter["in"] == "header" && is_idempotency_key(parameter) {
            parameter.insert(
                "schema".into(),
                json!({"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN}),
            );
        } else if parameter["in"] == "query" {
            let name = parameter["name"].as_str().unwrap_or_default().to_owned();
            let Some(schema) = parameter.get_mut("schema") else {
                continue;
            };
            match name.as_str() {
                // every list reads its page with `PageRequest`
                "limit" => {
                    schema["minimum"] = json!(1);
                    schema["maximum"] = json!(MAX_LIMIT);
                }
                // read as the header is: a bare token or a quoted string
                "idempotency_key" => schema["pattern"] = json!(IDEMPOTENCY_KEY_PATTERN),
                _ => forbid_nul(schema),
            }
        }
    }
}

/// Adds [`NO_NUL_PATTERN`] to every string of every schema a request body
/// refers to, unless it has a pattern, format or enumeration of its own, and
/// closes each shape of a tagged union there (see [`close_shapes`]).
fn constrain_request_bodies(doc: &mut Value) {
    let mut names: Vec<String> = operations(doc)
        .into_iter()
        .filter_map(|(_, _, operation)| operation.get("requestBody"))
        .flat_map(referenced_schemas)
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    while let Some(name) = names.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        if let Some(schema) = doc.pointer_mut(&format!("/components/schemas/{name}")) {
            names.extend(referenced_schemas(schema));
            forbid_nul(schema);
            close_shapes(schema);
        }
    }
}

fn referenced_schemas(value: &Value) -> Vec<String> {
    match value {
        Value::Object(members) => members
            .iter()
            .flat_map(|(name, member)| match (name.as_str(), member.as_str()) {
                ("$ref", Some(reference)) => reference
                    .strip_prefix("#/components/schemas/")
                    .map(|name| vec![name.to_owned()])
                    .unwrap_or_default(),
                _ => referenced_schemas(member),
            })
            .collect(),
        Value::Array(items) => items.iter().flat_map(referenced_schemas).collect(),
        _ => Vec::new(),
    }
}

fn forbid_nul(schema: &mut Value) {
    let Some(members) = schema.as_object_mut() else {
        return;
    };
    let is_string = match &members.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(types)) => types.iter().any(|t| t == "string"),
        _ => false,
    };
    let constrained = ["pattern", "format", "enum", "const"]
        .iter()
        .any(|k| members.contains_key(*k));
    if is_string && !constrained {
        members.insert("pattern".into(), json!(NO_NUL_PATTERN));
    }
    for (name, member) in members.iter_mut() {
        match (name.as_str(), member) {
            ("properties", Value::Object(properties)) => properties.values_mut().for_each(forbid_nul),
            ("items" | "additionalProperties", member) => forbid_nul(member),
            ("oneOf" | "anyOf" | "allOf", Value::Array(schemas)) => schemas.iter_mut().for_each(forbid_nul),
            _ => {}
        }
    }
}

/// Every request body refuses a member it does not name (400). The derive
/// says so for a struct (`additionalProperties: false`) but not for each
/// shape of an enum, so a client reading the schema would think any member
/// welcome there: each object shape of a `oneOf` is closed here.
fn close_shapes(schema: &mut Value) {
    let Some(Value::Array(shapes)) = schema.get_mut("oneOf") else {
        return;
    };
    for shape in shapes.iter_mut().filter_map(Value::as_object_mut) {
        if shape.contains_key("properties") && !shape.contains_key("additionalProperties") {
            shape.insert("additionalProperties".into(), Value::Bool(false));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A document as the routes' annotations give it: a create with a body
    /// and a key that documents its own 409, and a read by id.
    fn annotated() -> OpenApi {
        let problem = json!({"content": {"application/problem+json": {"schema": {"$ref": PROBLEM_SCHEMA}}}});
        serde_json::from_value(json!({
            "openapi": "3.1.0",
            "info": {"title": "things", "version": "1"},
            "paths": {
                "/v1/things": {"post": {
                    "operationId": "create_thing",
                    "parameters": [{"name": "Idempotency-Key", "in": "header", "required": true, "schema": {"type": "string"}}],
                    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ThingBody"}}}},
                    "responses": {
                        "201": {"description": "Created"},
                        "409": {"description": "`thing_exists`", "content": problem["content"]}
                    }
                }},
                "/v1/things/{thing_id}": {"get": {
                    "operationId": "get_thing",
                    "parameters": [{"name": "thing_id", "in": "path", "required": true, "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "The thing"}}
                }},
                "/v1/things/{thing_id}/cancel": {"post": {
                    "operationId": "cancel_thing",
                    "parameters": [{"name": "thing_id", "in": "path", "required": true, "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "Cancelled"}}
                }}
            },
            "components": {"schemas": {
                "Problem": {"type": "object", "properties": {"code": {"type": "string"}}},
                "ThingBody": {"type": "object", "properties": {
                    "name": {"type": "string"},
                    "digest": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}
                }}
            }}
        }))
        .unwrap()
    }

    fn statuses(doc: &Value, path: &str, method: &str) -> Vec<String> {
        doc["paths"][path][method]["responses"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    }

    #[test]
    fn each_operation_lists_the_statuses_it_answers_by_construction() {
        let doc = complete(&annotated());

        let mut create = statuses(&doc, "/v1/things", "post");
        create.sort();
        assert_eq!(
            create,
            [
                "201", "400", "401", "408", "409", "413", "415", "422", "431", "500", "503"
            ]
        );
        let mut read = statuses(&doc, "/v1/things/{thing_id}", "get");
        read.sort();
        assert_eq!(read, ["200", "401", "404", "408", "431", "500", "503"]);
        let missing_key = &doc["paths"]["/v1/things"]["post"]["responses"]["400"];
        assert_eq!(
            missing_key["content"]["application/problem+json"]["schema"]["$ref"],
            PROBLEM_SCHEMA
        );
        assert!(
            missing_key["description"]
                .as_str()
                .unwrap()
                .contains("`idempotency_key_missing`")
        );
    }

    #[test]
    fn a_status_the_route_documents_is_kept_as_the_route_wrote_it() {
        let doc = complete(&annotated());

        assert_eq!(
            doc["paths"]["/v1/things"]["post"]["responses"]["409"]["description"],
            "`thing_exists`"
        );
    }

    #[test]
    fn the_problem_code_is_an_enumeration_of_every_code() {
        let doc = complete(&annotated());

        let codes = doc["components"]["schemas"]["Problem"]["properties"]["code"]["enum"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(codes.len(), PROBLEM_CODES.len());
        let mut unique = codes.clone();
        unique.sort_by_key(|code| code.to_string());
        unique.dedup();
        assert_eq!(unique.len(), codes.len(), "each code is listed once: {codes:?}");
        for code in ["unauthenticated", "idempotency_key_reused", "request_timeout"] {
            assert!(codes.contains(&json!(code)), "{code}");
        }
    }

    #[test]
    fn each_shape_of_a_request_body_union_refuses_a_member_it_does_not_name() {
        let mut annotated = serde_json::to_value(annotated()).unwrap();
        let shape =
            |outcome: &str| json!({"type": "object", "properties": {"outcome": {"type": "string", "enum": [outcome]}}});
        annotated["components"]["schemas"]["ThingBody"] = json!({"oneOf": [shape("made"), shape("lost")]});
        annotated["components"]["schemas"]["Problem"] = json!({"oneOf": [shape("a"), shape("b")]});

        let doc = complete(&serde_json::from_value(annotated).unwrap());

        for item in doc["components"]["schemas"]["ThingBody"]["oneOf"].as_array().unwrap() {
            assert_eq!(item["additionalProperties"], false, "{item}");
        }
        for item in doc["components"]["schemas"]["Problem"]["oneOf"].as_array().unwrap() {
            assert_eq!(
                item.get("additionalProperties"),
                None,
                "an answer's schema is left as it is"
            );
        }
    }

    #[test]
    fn a_key_is_declared_in_the_form_the_server_accepts_and_strings_without_nul() {
        let doc = complete(&annotated());

        let key = &doc["paths"]["/v1/things"]["post"]["parameters"][0]["schema"];
        assert_eq!(key["pattern"], IDEMPOTENCY_KEY_PATTERN);
        let body = &doc["components"]["schemas"]["ThingBody"]["properties"];
        assert_eq!(body["name"]["pattern"], NO_NUL_PATTERN);
        assert_eq!(
            body["digest"]["pattern"], "^sha256:[0-9a-f]{64}$",
            "its own pattern stays"
        );
    }

    #[test]
    fn a_created_resource_links_to_the_operations_on_it() {
        let doc = complete(&annotated());

        let links = &doc["paths"]["/v1/things"]["post"]["responses"]["201"]["links"];
        assert_eq!(
            links["get_thing"],
            json!({"operationId": "get_thing", "parameters": {"thing_id": "$response.body#/id"}})
        );
        assert_eq!(links["cancel_thing"]["parameters"]["thing_id"], "$response.body#/id");
        assert!(
            doc["paths"]["/v1/things"]["post"]["responses"]["409"]
                .get("links")
                .is_none()
        );
    }

    /// Every `code` the services' own error constructors use, read from their
    /// sources (tests and the simulated external systems aside).
    fn constructed_codes() -> Vec<String> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dirs = [
            "shared/platform/src",
            "shared/idempotency/src",
            "services/tickets/src",
            "services/payments/src",
            "services/deployments/src",
        ];
        let mut files: Vec<_> = dirs.iter().map(|dir| root.join(dir)).collect();
        let mut codes = Vec::new();
        while let Some(path) = files.pop() {
            if path.is_dir() {
                files.extend(std::fs::read_dir(&path).unwrap().map(|entry| entry.unwrap().path()));
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            let source = source.split("#[cfg(test)]").next().unwrap();
            // `ApiError::new(` everywhere; `Self::new(` inside `ApiError` itself
            let constructor = if path.ends_with("platform/src/error.rs") {
                "Self::new("
            } else {
                "ApiError::new("
            };
            for call in source.split(constructor).skip(1) {
                // the code is the second argument, a string literal
                if let Some((_, rest)) = call.split_once(',')
                    && let Some(literal) = rest.trim_start().strip_prefix('"')
                    && let Some((code, _)) = literal.split_once('"')
                {
                    codes.push(code.to_owned());
                }
            }
        }
        codes
    }

    #[test]
    fn every_code_the_services_construct_is_in_the_list() {
        let codes = constructed_codes();

        assert!(
            codes.iter().any(|c| c == "idempotency_key_reused"),
            "the scan finds codes"
        );
        for code in codes {
            assert!(
                PROBLEM_CODES.iter().any(|(listed, _, _)| *listed == code),
                "`{code}` is not in PROBLEM_CODES"
            );
        }
    }
}

//! Links from a created resource to the operations on it, from an approval
//! request to the approval, and from an answer to its operation's status.

use serde_json::{Map, Value, json};

use super::operations;

/// One link: a name, the operation it leads to, and where each of that
/// operation's path parameters comes from.
pub(super) type Link = (String, String, Map<String, Value>);

/// The links of each operation's success answers: from what a POST creates to
/// every operation under its path (its `id` fills the next path parameter),
/// from an approval request to the approval's operations, and from every
/// answer with an `Operation-Id` to that operation's status.
pub(super) fn links(doc: &Value) -> std::collections::HashMap<(String, &'static str), Vec<Link>> {
    let all = operations(doc);
    let find = |id: &str| all.iter().find(|(_, _, op)| op["operationId"] == id);
    let mut links: std::collections::HashMap<(String, &'static str), Vec<Link>> = Default::default();
    for (path, method, _) in all.iter().filter(|(_, method, _)| *method == "post") {
        let mut out = Vec::new();
        for (target_path, _, target) in &all {
            let Some(rest) = target_path.strip_prefix(&format!("{path}/{{")) else {
                continue;
            };
            let Some((created, _)) = rest.split_once('}') else {
                continue;
            };
            let known = path_parameters(path);
            let names = path_parameters(target_path);
            // only what this request's path and answer can fill
            if names.iter().any(|name| name != created && !known.contains(name)) {
                continue;
            }
            let mut parameters = Map::new();
            for name in names {
                let source = if name == created {
                    "$response.body#/id".to_owned()
                } else {
                    format!("$request.path.{name}")
                };
                parameters.insert(name, json!(source));
            }
            out.push((operation_id(target), operation_id(target), parameters));
        }
        if let Some((_, _, target)) = find("get_operation") {
            let parameters = Map::from_iter([("operation_id".into(), json!("$response.header.Operation-Id"))]);
            out.push(("get_operation".into(), operation_id(target), parameters));
        }
        for id in ["get_approval", "decide"] {
            if let Some((_, _, target)) = find(id) {
                let parameters = Map::from_iter([("approval_id".into(), json!("$response.body#/approval_id"))]);
                out.push((
                    format!("{id}_when_approval_requested"),
                    operation_id(target),
                    parameters,
                ));
            }
        }
        links.insert((path.to_string(), *method), out);
    }
    links
}

fn operation_id(operation: &Map<String, Value>) -> String {
    operation["operationId"].as_str().unwrap_or_default().to_owned()
}

fn path_parameters(path: &str) -> Vec<String> {
    path.split('{')
        .skip(1)
        .filter_map(|part| part.split_once('}').map(|(name, _)| name.to_owned()))
        .collect()
}

/// Puts the links on every 2xx answer of the operation.
pub(super) fn add_links(operation: &mut Map<String, Value>, links: &[Link]) {
    let Some(responses) = operation.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    for (status, response) in responses.iter_mut() {
        if !status.starts_with('2') {
            continue;
        }
        let Some(response) = response.as_object_mut() else {
            continue;
        };
        let out = response.entry("links").or_insert_with(|| json!({}));
        for (name, operation_id, parameters) in links {
            // an approval request is the only 202 body with an `approval_id`
            if name.ends_with("_when_approval_requested") && status != "202" {
                continue;
            }
            out[name.as_str()] = json!({"operationId": operation_id, "parameters": parameters});
        }
    }
}

//! A tool's arguments taken apart: strings, ids, the route's path segments
//! and the query, with anything left over refused.

use rmcp::model::JsonObject;
use serde_json::Value;

use crate::{
    answer::ToolError,
    endpoints::{argument_for, path_parameters},
};

pub(super) fn take_string(args: &mut JsonObject, name: &str) -> Result<Option<String>, ToolError> {
    match args.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ToolError::invalid_input(format!("`{name}` must be a string"))),
    }
}

/// An id, key or intent to look something up by: a string, not empty.
pub(super) fn take_id(args: &mut JsonObject, name: &str) -> Result<Option<String>, ToolError> {
    match take_string(args, name)? {
        Some(value) if value.is_empty() => Err(ToolError::invalid_input(format!("`{name}` must not be empty"))),
        value => Ok(value),
    }
}

/// The route with its `{…}` filled from the arguments (taken out of them).
pub(super) fn fill_route(route: &str, args: &mut JsonObject) -> Result<String, ToolError> {
    let mut path = route.to_owned();
    for parameter in path_parameters(route) {
        let name = argument_for(parameter);
        let value = take_id(args, name)?.ok_or_else(|| ToolError::invalid_input(format!("`{name}` is required")))?;
        path = path.replace(&format!("{{{parameter}}}"), &path_segment(&value)?);
    }
    Ok(path)
}

/// An id as one path segment, percent-encoded: an id can never change the
/// route. `.` and `..`, which no encoding keeps from climbing, are refused.
pub(super) fn path_segment(value: &str) -> Result<String, ToolError> {
    platform::path::segment(value).map_err(|e| ToolError::invalid_input(e.to_string()))
}

/// The remaining arguments as the query's pairs: only the endpoint's own
/// parameters, and only scalars.
pub(super) fn query_of(args: JsonObject, allowed: &[&str]) -> Result<Vec<(String, String)>, ToolError> {
    args.into_iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(name, value)| {
            if !allowed.contains(&name.as_str()) {
                return Err(ToolError::invalid_input(format!("unknown argument `{name}`")));
            }
            match value {
                Value::String(s) => Ok((name, s)),
                Value::Number(n) => Ok((name, n.to_string())),
                _ => Err(ToolError::invalid_input(format!(
                    "`{name}` must be a string or a number"
                ))),
            }
        })
        .collect()
}

pub(super) fn no_more(args: &JsonObject) -> Result<(), ToolError> {
    match args.keys().next() {
        Some(extra) => Err(ToolError::invalid_input(format!("unknown argument `{extra}`"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_path_parameter_is_one_segment_whatever_it_holds() {
        let mut args = JsonObject::new();
        args.insert("ticket_id".into(), json!("../operations?x=1"));
        let path = fill_route("/v1/tickets/{ticket_id}/comments", &mut args).unwrap();
        let parsed = reqwest::Url::parse(&format!("http://tickets.test{path}")).unwrap();
        assert_eq!(parsed.path(), "/v1/tickets/..%2Foperations%3Fx%3D1/comments");
        assert_eq!(parsed.query(), None);
        assert!(args.is_empty(), "the parameter is taken out of the body");
    }

    #[test]
    fn a_path_parameter_a_url_parser_reads_as_here_or_one_up_is_refused() {
        for id in [".", ".."] {
            let mut args = JsonObject::new();
            args.insert("ticket_id".into(), json!(id));
            let filled = fill_route("/v1/tickets/{ticket_id}/comments", &mut args);
            assert!(filled.is_err(), "{id:?} became {filled:?}");
        }
    }
}

//! The matrix: the five dispute tests of the article (docs/article.md) on every write route. Each
//! test is a story template in `scenarios/matrix/tests/`; each route is an
//! entry of `scenarios/matrix/routes.toml` (what the agent sends, what must
//! exist first, how its one effect is counted). A cell is a template applied
//! to a route: `{route.path}` in the template becomes that route's path, the
//! route's setup steps come first, and its effect checks join the template's.

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;

use crate::story::{Cell, Expectations, Sandbox, Step, Story};

/// Every cell, with the routes and tests in the order the files give them.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub routes: Vec<String>,
    /// The tests (columns); a test may have several variants, each its own cell.
    pub tests: Vec<String>,
    pub cells: Vec<Story>,
}

/// A route as `routes.toml` gives it. The matrix itself reads its name,
/// sandbox, setup and checks; the other fields are for the templates
/// (`{route.path}`), and are here so that a route without one is refused
/// when it is loaded, not halfway through a run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code, reason = "the fields only the templates read")]
struct Route {
    name: String,
    service: String,
    /// What the agent does, after "The agent": "captures the intent".
    does: String,
    path: String,
    body: toml::Value,
    /// The status of the first answer.
    status: u16,
    /// Where the changed request goes (the same path when absent).
    changed_path: Option<String>,
    /// A body that is the same request in every respect but one.
    changed_body: toml::Value,
    /// For work the outbox delivers: the external system it goes to.
    delivers_to: Option<String>,
    #[serde(default)]
    sandbox: Sandbox,
    /// What must exist before the route can be called.
    #[serde(default)]
    setup: Vec<Step>,
    /// The route's one effect, counted where it lands.
    expect: Expectations,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutesFile {
    route: Vec<toml::Table>,
}

/// A template's own fields; the rest of its file is a story. (`needs`, the
/// route fields it needs, is read first: routes without them have no such cell.)
struct TemplateHead {
    /// The column it fills.
    test: String,
    /// Which of the test's variants it is, when the test has several.
    variant: Option<String>,
}

/// Loads `dir/routes.toml` and `dir/tests/*.toml` and applies every template
/// to every route that has what it needs.
pub fn load(dir: &Path) -> Result<Matrix, String> {
    let routes_path = dir.join("routes.toml");
    let text = std::fs::read_to_string(&routes_path).map_err(|e| format!("{}: {e}", routes_path.display()))?;
    let file: RoutesFile = toml::from_str(&text).map_err(|e| format!("{}: {e}", routes_path.display()))?;
    let routes = file
        .route
        .into_iter()
        .map(route_fields)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", routes_path.display()))?;

    let tests_dir = dir.join("tests");
    let mut files: Vec<_> = std::fs::read_dir(&tests_dir)
        .map_err(|e| format!("{}: {e}", tests_dir.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    let mut templates = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        templates.push((path, stem, table));
    }

    let mut matrix = Matrix {
        routes: Vec::new(),
        tests: Vec::new(),
        cells: Vec::new(),
    };
    for (fields, route) in &routes {
        matrix.routes.push(route.name.clone());
        for (path, stem, template) in &templates {
            let cell = apply(template, fields, route, stem)
                .map_err(|e| format!("{} applied to route `{}`: {e}", path.display(), route.name))?;
            if let Some(story) = cell {
                let test = story.cell.as_ref().map(|c| c.test.clone()).unwrap_or_default();
                if !matrix.tests.contains(&test) {
                    matrix.tests.push(test);
                }
                matrix.cells.push(story);
            }
        }
    }
    Ok(matrix)
}

/// A route's fields for the templates (`changed_path` defaults to `path`),
/// its own setup and checks filled in from them, and the route read from them.
fn route_fields(mut fields: toml::Table) -> Result<(toml::Table, Route), String> {
    let name = fields
        .get("name")
        .and_then(toml::Value::as_str)
        .unwrap_or("(a route without a name)")
        .to_owned();
    if !fields.contains_key("changed_path")
        && let Some(path) = fields.get("path").cloned()
    {
        fields.insert("changed_path".into(), path);
    }
    // the route's own steps and checks may name its fields too
    let plain: toml::Table = fields
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "setup" | "expect" | "sandbox"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut filled = toml::Value::Table(fields);
    substitute(&mut filled, &plain).map_err(|e| format!("route `{name}`: {e}"))?;
    let route: Route = filled
        .try_into()
        .map_err(|e: toml::de::Error| format!("route `{name}`: {e}"))?;
    Ok((plain, route))
}

/// The cell of `template` on this route, or `None` if the route lacks a field the template needs.
fn apply(template: &toml::Table, fields: &toml::Table, route: &Route, stem: &str) -> Result<Option<Story>, String> {
    let mut story = template.clone();
    let needs: Vec<String> = match story.remove("needs") {
        Some(needs) => needs.try_into().map_err(|e: toml::de::Error| format!("needs: {e}"))?,
        None => Vec::new(),
    };
    if needs.iter().any(|field| !fields.contains_key(field)) {
        return Ok(None);
    }
    substitute_table(&mut story, fields)?;
    let head = TemplateHead {
        test: take_string(&mut story, "test")?.ok_or("no `test`: which of the five tests is it?")?,
        variant: take_string(&mut story, "variant")?,
    };
    let story = toml::Value::Table(story);
    let mut story: Story = story.try_into().map_err(|e: toml::de::Error| e.to_string())?;
    story.name = format!("{}/{stem}", route.name);
    story.steps = route.setup.iter().cloned().chain(story.steps).collect();
    story.expect = story.expect.and(route.expect.clone());
    let mut env: BTreeMap<String, String> = route.sandbox.env.clone();
    env.extend(story.sandbox.env);
    story.sandbox.env = env;
    story.cell = Some(Cell {
        route: route.name.clone(),
        test: head.test,
        variant: head.variant,
    });
    story.check()?;
    Ok(Some(story))
}

fn take_string(table: &mut toml::Table, key: &str) -> Result<Option<String>, String> {
    match table.remove(key) {
        None => Ok(None),
        Some(toml::Value::String(text)) => Ok(Some(text)),
        Some(other) => Err(format!("`{key}` must be a string, not a {}", other.type_str())),
    }
}

/// Replaces `{route.<field>}` everywhere in `value`: a string that is only
/// the placeholder becomes the field's value (a body, a number), and a
/// placeholder inside text becomes the field's text.
fn substitute(value: &mut toml::Value, fields: &toml::Table) -> Result<(), String> {
    match value {
        toml::Value::String(text) => {
            if let Some(field) = text.strip_prefix("{route.").and_then(|t| t.strip_suffix('}'))
                && !field.contains('}')
            {
                *value = fields
                    .get(field)
                    .cloned()
                    .ok_or_else(|| format!("the route has no `{field}`"))?;
                return Ok(());
            }
            *text = fill_text(text, fields)?;
        }
        toml::Value::Array(items) => {
            for item in items {
                substitute(item, fields)?;
            }
        }
        toml::Value::Table(table) => substitute_table(table, fields)?,
        _ => {}
    }
    Ok(())
}

fn substitute_table(table: &mut toml::Table, fields: &toml::Table) -> Result<(), String> {
    table.iter_mut().try_for_each(|(_, item)| substitute(item, fields))
}

fn fill_text(text: &str, fields: &toml::Table) -> Result<String, String> {
    let mut filled = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("{route.") {
        filled.push_str(&rest[..at]);
        let after = &rest[at + "{route.".len()..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("`{text}`: a placeholder without its closing brace"))?;
        let field = &after[..end];
        match fields.get(field) {
            Some(toml::Value::String(value)) => filled.push_str(value),
            Some(toml::Value::Integer(value)) => filled.push_str(&value.to_string()),
            Some(_) => return Err(format!("`{{route.{field}}}` is not text and cannot go inside `{text}`")),
            None => return Err(format!("the route has no `{field}`")),
        }
        rest = &after[end + 1..];
    }
    filled.push_str(rest);
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    const ROUTES: &str = r#"
[[route]]
name = "ticket-create"
service = "tickets"
does = "asks for a ticket"
path = "/v1/tickets"
body = { project = "ops", title = "Rotate" }
changed_body = { project = "ops", title = "Rotate again" }
status = 201
expect = { count = [{ what = "tickets", service = "tickets", path = "/v1/tickets", count = 1 }] }

[[route]]
name = "capture"
service = "payments"
does = "captures the intent"
path = "/v1/payment_intents/{intent.id}/capture"
body = {}
changed_body = { amount = "1.00" }
status = 202
delivers_to = "payment provider"
expect = { provider_charges = 1 }

[[route.setup]]
say = "The agent creates the intent it captures, at {route.service}."
agent = { name = "intent", service = "{route.service}", path = "/v1/payment_intents", body = {} }
"#;

    const DROPPED: &str = r#"
test = "dropped answer"
title = "{route.name}: the answer is dropped"
lesson = "Retry with the same key."

[[step]]
say = "The agent {route.does}."
agent = { name = "act", service = "{route.service}", path = "{route.path}", body = "{route.body}" }

[[step]]
say = "Copies, answered {route.status} or 409."
burst = { copies = 2, operation = "act", service = "{route.service}", path = "{route.changed_path}", body = "{route.changed_body}" }
expect = { statuses = ["{route.status}", 409] }

[expect]
journal = [{ operation = "act", service = "{route.service}", includes = ["replayed"] }]
"#;

    const DELIVERY: &str = r#"
test = "killed after the claim"
variant = "before the {route.delivers_to} hears of it"
needs = ["delivers_to"]
title = "{route.name}: killed before the {route.delivers_to} hears of it"
lesson = "The outbox delivers it once."

[[step]]
say = "The agent {route.does}."
agent = { name = "act", service = "{route.service}", path = "{route.path}", body = "{route.body}" }
"#;

    fn matrix(templates: &[(&str, &str)]) -> Result<Matrix, String> {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "routes.toml", ROUTES);
        for (name, text) in templates {
            write(dir.path(), &format!("tests/{name}"), text);
        }
        load(dir.path())
    }

    #[test]
    fn every_template_is_applied_to_every_route_that_has_what_it_needs() {
        let matrix = matrix(&[("1-dropped.toml", DROPPED), ("5-delivery.toml", DELIVERY)]).unwrap();
        let names: Vec<&str> = matrix.cells.iter().map(|s| s.name.as_str()).collect();

        assert_eq!(
            names,
            ["ticket-create/1-dropped", "capture/1-dropped", "capture/5-delivery"]
        );
        assert_eq!(matrix.routes, ["ticket-create", "capture"]);
        assert_eq!(matrix.tests, ["dropped answer", "killed after the claim"]);
        let cell = matrix.cells[2].cell.as_ref().unwrap();
        assert_eq!(
            (cell.route.as_str(), cell.test.as_str(), cell.variant.as_deref()),
            (
                "capture",
                "killed after the claim",
                Some("before the payment provider hears of it")
            )
        );
    }

    #[test]
    fn a_placeholder_takes_the_routes_value_whole_or_as_text() {
        let matrix = matrix(&[("1-dropped.toml", DROPPED)]).unwrap();
        let capture = &matrix.cells[1];

        assert_eq!(capture.title, "capture: the answer is dropped");
        assert_eq!(capture.steps[1].say, "The agent captures the intent.");
        let act = capture.steps[1].agent.as_ref().unwrap();
        assert_eq!(
            act.path, "/v1/payment_intents/{intent.id}/capture",
            "the play fills {{intent.id}} later"
        );
        assert_eq!(act.body, serde_json::json!({}));
        let burst = capture.steps[2].burst.as_ref().unwrap();
        assert_eq!(burst.path, act.path, "changed_path defaults to the path");
        assert_eq!(burst.body, serde_json::json!({"amount": "1.00"}));
        assert_eq!(capture.steps[2].expect.as_ref().unwrap().statuses, Some(vec![202, 409]));
    }

    #[test]
    fn a_cell_is_the_routes_setup_then_the_template_with_both_sets_of_checks() {
        let matrix = matrix(&[("1-dropped.toml", DROPPED)]).unwrap();
        let capture = &matrix.cells[1];

        assert_eq!(
            capture.steps[0].say,
            "The agent creates the intent it captures, at payments."
        );
        assert_eq!(capture.steps.len(), 3);
        assert_eq!(capture.expect.provider_charges, Some(1));
        assert_eq!(capture.expect.journal[0].service, "payments");
        assert_eq!(matrix.cells[0].expect.count[0].what, "tickets");
    }

    #[test]
    fn a_template_naming_a_field_no_route_has_is_refused_with_the_route_and_the_field() {
        let broken = DROPPED.replace("{route.does}", "{route.verb}");
        let error = matrix(&[("1-dropped.toml", &broken)]).unwrap_err();

        assert!(
            error.contains("1-dropped.toml applied to route `ticket-create`"),
            "{error}"
        );
        assert!(error.contains("the route has no `verb`"), "{error}");
    }

    #[test]
    fn a_template_without_its_test_is_refused() {
        let error = matrix(&[("1-dropped.toml", &DROPPED.replace("test = \"dropped answer\"", ""))]).unwrap_err();

        assert!(error.contains("no `test`"), "{error}");
    }
}

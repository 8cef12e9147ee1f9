//! The authorization matrix (docs/contract.md §1, §4, §5, §6, §8, §10), on
//! both backends: every operation of every service, enumerated from the
//! service's own OpenAPI document, sent by nobody, by a key no service has,
//! by each role of the account whose resources it names (acme), and by each
//! role of another account (globex) naming acme's resources. What each cell
//! is answered comes from one table ([`table::table`]); an operation the
//! table lacks fails, and so does a row whose operation the document no
//! longer has, so a new route cannot pass unseen. No answer to anyone but
//! acme may show one of acme's ids. The console's sign-in and forms get the
//! same (see `console`).

mod console;
mod table;
mod world;

use std::collections::BTreeSet;

use axum::{
    body::Body,
    http::{Method, Request},
};
use platform::{Backend, testing::TestResponse};
use serde_json::Value;
use table::{Expect, Row};
use world::{PRINCIPALS, Principal, Seeded};

/// `(method, route)` of every operation in an OpenAPI document.
fn operations(document: &Value) -> BTreeSet<(String, String)> {
    let paths = document["paths"].as_object().expect("a document has paths");
    paths
        .iter()
        .flat_map(|(route, item)| {
            let methods = item.as_object().expect("a path item").keys();
            methods
                .filter(|m| ["get", "put", "post", "delete", "options", "head", "patch", "trace"].contains(&m.as_str()))
                .map(move |method| (method.clone(), route.clone()))
        })
        .collect()
}

/// `template` with each `{name}` replaced by its seed (or the row's target for it).
fn filled(template: &str, row: &Row, service: &Seeded) -> String {
    let mut filled = String::new();
    let mut rest = template;
    while let Some((before, after)) = rest.split_once('{') {
        let (name, after) = after.split_once('}').expect("a closed `{`");
        let seed = row
            .targets
            .iter()
            .find(|(parameter, _)| *parameter == name)
            .map_or(name, |(_, seed)| *seed);
        filled.push_str(before);
        filled.push_str(service.seeds.get(seed));
        rest = after;
    }
    filled.push_str(rest);
    filled
}

/// The cell's request as `who` sends it — with a valid body, and a key no
/// other cell sends, where the operation takes them — and what it names:
/// its path and its body.
fn request(service: &Seeded, row: &Row, who: Principal, cell: usize) -> (String, Request<Body>) {
    let path = filled(&format!("{}{}", row.route, row.query), row, service);
    let method = Method::from_bytes(row.method.to_ascii_uppercase().as_bytes()).unwrap();
    let mut request = Request::builder().method(method.clone()).uri(&path);
    if let Some(bearer) = service.bearer(who) {
        request = request.header("authorization", format!("Bearer {bearer}"));
    }
    if method != Method::GET {
        request = request.header("idempotency-key", format!("matrix-{}-{cell}", service.name));
    }
    let body = row.body.map(|body| body(&service.seeds, cell).to_string());
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let sent = format!("{path} {}", body.as_deref().unwrap_or(""));
    (sent, request.body(Body::from(body.unwrap_or_default())).unwrap())
}

/// What is wrong with `answer`, if it is not what `expect` says.
fn mismatch(expect: Expect, answer: &TestResponse) -> Option<String> {
    let status = answer.status.as_u16();
    let is_problem = answer.header("content-type") == Some("application/problem+json");
    let code = serde_json::from_slice::<Value>(&answer.body)
        .ok()
        .and_then(|body| body["code"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let right = match expect {
        Expect::Status(wanted) => status == wanted,
        Expect::Problem(wanted, wanted_code) => status == wanted && is_problem && code == wanted_code,
    };
    if right && (status < 400 || is_problem) {
        return None;
    }
    let body = String::from_utf8_lossy(&answer.body);
    let shown: String = body.chars().take(300).collect();
    Some(format!(
        "expected {expect}, got {status} {code} ({}): {shown}",
        answer.header("content-type").unwrap_or("no content-type")
    ))
}

/// What is wrong with a 401's challenge (RFC 6750 §3): `Bearer` for a
/// request without a key, `Bearer error="invalid_token"` for a key no
/// service has; and no challenge on any other answer.
fn challenge_mismatch(who: Principal, answer: &TestResponse) -> Option<String> {
    let challenge = answer.header("www-authenticate");
    let wanted = match (answer.status.as_u16(), who) {
        (401, Principal::Nobody) => Some("Bearer"),
        (401, _) => Some(r#"Bearer error="invalid_token""#),
        _ => None,
    };
    (challenge != wanted).then(|| format!("WWW-Authenticate: expected {wanted:?}, got {challenge:?}"))
}

/// acme's values that an answer shows, besides those its request named (a
/// 404 says which id it did not find).
fn leaked<'a>(service: &'a Seeded, sent: &str, answer: &TestResponse) -> Vec<&'a str> {
    let body = String::from_utf8_lossy(&answer.body);
    let headers: String = answer
        .headers
        .values()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join("\n");
    service
        .seeds
        .acme_values()
        .filter(|value| !sent.contains(value))
        .filter(|value| body.contains(value) || headers.contains(value))
        .collect()
}

async fn every_operation_of_every_service_answers_each_principal_as_the_table_says(backend: Backend) {
    let services = world::world(backend).await;
    let table = table::table();
    let mut wrong = Vec::new();
    let mut counted = Vec::new();
    let mut cell = 0;
    for service in &services {
        let rows: Vec<&Row> = table
            .iter()
            .filter(|row| row.service == service.name || row.service == table::EVERY_SERVICE)
            .collect();
        let documented = operations(&service.document().await);
        for (method, route) in &documented {
            if !rows.iter().any(|row| row.method == method && row.route == route) {
                wrong.push(format!("{}: {method} {route} is not in the table", service.name));
            }
        }
        for row in rows.iter().filter(|row| row.documented) {
            if !documented.contains(&(row.method.to_owned(), row.route.to_owned())) {
                wrong.push(format!(
                    "{}: the table's {} {} is not in the service's document",
                    service.name, row.method, row.route
                ));
            }
        }
        for row in &rows {
            for (who, expect) in PRINCIPALS.into_iter().zip(row.expect) {
                cell += 1;
                let (sent, request) = request(service, row, who, cell);
                let cell_name = format!("{} {} {} as {who:?}", service.name, request.method(), request.uri());
                let answer = service.client.send(request).await;
                if let Some(why) = mismatch(expect, &answer).or_else(|| challenge_mismatch(who, &answer)) {
                    wrong.push(format!("{cell_name}: {why}"));
                }
                if !matches!(who, Principal::Acme(_)) {
                    let leaked = leaked(service, &sent, &answer);
                    if !leaked.is_empty() {
                        wrong.push(format!("{cell_name}: the answer shows acme's {leaked:?}"));
                    }
                }
            }
        }
        counted.push(format!(
            "{}: {} operations in {} rows × {} principals = {} cells",
            service.name,
            documented.len(),
            rows.len(),
            PRINCIPALS.len(),
            rows.len() * PRINCIPALS.len()
        ));
    }
    eprintln!("{}", counted.join("\n"));
    assert!(
        wrong.is_empty(),
        "{} of {cell} cells are not as the table says:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

async fn the_console_signs_in_and_acts_for_each_principal_as_its_table_says_and_changes_nothing(backend: Backend) {
    let services = world::world(backend).await;
    let (wrong, cells) = console::cells(&services).await;
    eprintln!("console: {cells} cells");
    assert!(
        wrong.is_empty(),
        "{} of {cells} console cells are not as the table says:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

platform::both_backends!(
    every_operation_of_every_service_answers_each_principal_as_the_table_says,
    the_console_signs_in_and_acts_for_each_principal_as_its_table_says_and_changes_nothing,
);

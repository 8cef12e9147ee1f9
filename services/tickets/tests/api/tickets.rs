//! Tickets' own rules (docs/contract.md §7 Tickets, §10).

use axum::http::Method;
use platform::Backend;
use serde_json::{Value, json};

use crate::support::*;

async fn set_status(app: &TestApp, ticket_id: &str, body: Value) -> TestResponse {
    app.send(json_request(
        Method::PUT,
        &format!("/v1/tickets/{ticket_id}/status"),
        ACME_AGENT,
        None,
        body,
    ))
    .await
}

async fn a_create_for_a_known_source_event_answers_200_with_that_ticket_under_any_key(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app
        .create_ticket(
            "run-1",
            r#"{"project":"ops","title":"Disk full on db-3","source_event_id":"alert-7f3a"}"#,
        )
        .await;
    let second = app
        .create_ticket(
            "run-2",
            r#"{"project":"ops","title":"db-3 disk is full (again?)","source_event_id":"alert-7f3a"}"#,
        )
        .await;

    assert_eq!(first.status, 201);
    assert_eq!(first.json()["outcome"], "created");
    assert_eq!(second.status, 200);
    assert_eq!(second.json()["outcome"], "matched_existing");
    assert_eq!(second.json()["id"], first.json()["id"]);
    assert_eq!(
        second.json()["title"],
        "Disk full on db-3",
        "the existing ticket, unchanged"
    );
    assert_eq!(
        second.replayed(),
        Some("false"),
        "a match is a new operation, not a replay"
    );
    assert_ne!(second.operation_id(), first.operation_id());
    assert_eq!(app.ticket_count().await, 1);

    let listed = app
        .get("/v1/tickets?project=ops&source_event_id=alert-7f3a", ACME_AGENT)
        .await
        .json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
}

async fn matching_never_reopens_a_closed_ticket_and_never_comments(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let body = r#"{"project":"ops","title":"Disk full","source_event_id":"alert-1"}"#;
    let ticket = app.create_ticket("run-1", body).await.json();
    let id = ticket["id"].as_str().unwrap();
    assert_eq!(set_status(&app, id, json!({"status": "closed"})).await.status, 200);

    let matched = app.create_ticket("run-2", body).await;

    assert_eq!(matched.status, 200);
    assert_eq!(matched.json()["status"], "closed");
    assert_eq!(app.count("SELECT COUNT(*) FROM ticket_comments").await, 0);
}

async fn the_same_source_event_in_another_project_or_account_is_another_ticket(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    app.create_ticket("k1", r#"{"project":"ops","title":"x","source_event_id":"e-1"}"#)
        .await;
    let other_project = app
        .create_ticket("k2", r#"{"project":"web","title":"x","source_event_id":"e-1"}"#)
        .await;
    let other_account = app
        .post(
            "/v1/tickets",
            GLOBEX_AGENT,
            Some("k3"),
            r#"{"project":"ops","title":"x","source_event_id":"e-1"}"#,
        )
        .await;

    assert_eq!(other_project.status, 201);
    assert_eq!(other_account.status, 201);
    assert_eq!(app.ticket_count().await, 3);
}

async fn identical_tickets_under_two_keys_are_two_tickets(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let a = app.create_ticket("human-1", ROTATE_CERT).await;
    let b = app.create_ticket("human-2", ROTATE_CERT).await;

    assert_eq!((a.status.as_u16(), b.status.as_u16()), (201, 201));
    assert_ne!(
        a.json()["id"],
        b.json()["id"],
        "the fingerprint is not a dedup key; titles never deduplicate"
    );
    assert_eq!(app.ticket_count().await, 2);
}

async fn each_comment_is_its_own_operation_and_a_retried_comment_is_added_once(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let id = app.create_ticket("k", ROTATE_CERT).await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/tickets/{id}/comments");

    let first = app
        .post(&path, ACME_AGENT, Some("comment-1"), r#"{"body":"Rotated."}"#)
        .await;
    let retried = app
        .post(&path, ACME_AGENT, Some("comment-1"), r#"{"body":"Rotated."}"#)
        .await;
    let second = app
        .post(&path, ACME_AGENT, Some("comment-2"), r#"{"body":"Rotated."}"#)
        .await;

    assert_eq!(first.status, 201);
    assert!(first.json()["id"].as_str().unwrap().starts_with("cmt_"));
    assert_eq!(first.json()["author_id"], "acme-agent");
    assert_eq!(retried.replayed(), Some("true"));
    assert_eq!(retried.body, first.body);
    assert_eq!(second.status, 201);
    let comments = app.get(&path, ACME_AGENT).await.json();
    assert_eq!(comments["data"].as_array().unwrap().len(), 2);
    let location = first.header("location").unwrap().to_owned();
    assert_eq!(app.get(&location, ACME_AGENT).await.json(), first.json());
}

async fn setting_the_current_status_again_changes_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let id = app.create_ticket("k", ROTATE_CERT).await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let resolved = set_status(&app, &id, json!({"status": "resolved", "expected_version": 1})).await;
    let again = set_status(&app, &id, json!({"status": "resolved", "expected_version": 1})).await;

    assert_eq!(resolved.status, 200);
    assert_eq!(resolved.json()["changed"], true);
    assert_eq!(resolved.json()["version"], 2);
    assert_eq!(again.status, 200, "a retried PUT of the same end state is a no-op");
    assert_eq!(again.json()["changed"], false);
    assert_eq!(again.json()["version"], 2);
}

async fn a_stale_expected_version_is_409_version_mismatch(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let id = app.create_ticket("k", ROTATE_CERT).await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    set_status(&app, &id, json!({"status": "acknowledged"})).await;

    let stale = set_status(&app, &id, json!({"status": "resolved", "expected_version": 1})).await;

    stale.assert_problem(409, "version_mismatch");
    assert_eq!(stale.json()["current_version"], 2);
    assert_eq!(
        app.get(&format!("/v1/tickets/{id}"), ACME_AGENT).await.json()["status"],
        "acknowledged"
    );
}

async fn a_closed_ticket_does_not_change_status_and_the_409_names_its_status_once(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let id = app.create_ticket("k", ROTATE_CERT).await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    set_status(&app, &id, json!({"status": "closed"})).await;

    let reopen = set_status(&app, &id, json!({"status": "open"})).await;

    reopen.assert_problem(409, "invalid_state");
    let names = reopen.member_names();
    assert_eq!(names.iter().filter(|name| *name == "status").count(), 1, "{names:?}");
    assert_eq!(reopen.json()["status"], 409, "`status` is the HTTP status");
    assert_eq!(reopen.json()["ticket_status"], "closed");
}

async fn lists_page_through_every_ticket_in_creation_order(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let mut created = Vec::new();
    for n in 0..5 {
        let body = json!({"project": "ops", "title": format!("ticket {n}")}).to_string();
        created.push(app.create_ticket(&format!("k{n}"), &body).await.json()["id"].clone());
    }

    let mut seen = Vec::new();
    let mut path = "/v1/tickets?limit=2".to_owned();
    loop {
        let page = app.get(&path, ACME_AGENT).await.json();
        let data = page["data"].as_array().unwrap();
        assert!(data.len() <= 2);
        seen.extend(data.iter().map(|t| t["id"].clone()));
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/tickets?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, created);
    app.get("/v1/tickets?limit=201", ACME_AGENT)
        .await
        .assert_problem(400, "invalid_request");
    app.get("/v1/tickets?cursor=forged", ACME_AGENT)
        .await
        .assert_problem(400, "invalid_request");
    app.get("/v1/tickets?colour=red", ACME_AGENT)
        .await
        .assert_problem(400, "invalid_request");
}

async fn the_service_serves_health_and_its_openapi_document(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let health = app.get("/healthz", ACME_AGENT).await;
    let openapi = app.get("/openapi.json", ACME_AGENT).await.json();
    let docs = app.get("/docs", ACME_AGENT).await;

    assert_eq!(health.json()["status"], "ok");
    assert!(openapi["openapi"].as_str().unwrap().starts_with("3.1"));
    for path in [
        "/v1/tickets",
        "/v1/tickets/{ticket_id}/comments",
        "/v1/operations/{operation_id}",
    ] {
        assert!(openapi["paths"].get(path).is_some(), "{path} is documented");
    }
    assert!(String::from_utf8_lossy(&docs.body).contains("idempotency_key_reused"));
    let swagger = app.get("/docs/api/", ACME_AGENT).await;
    assert_eq!(
        swagger.status, 200,
        "the docs UI is served from the binary, with no network"
    );
    assert!(swagger.header("content-type").unwrap().starts_with("text/html"));
}

/// Probes go one at a time and share an answer (docs/contract.md §5): many
/// at once still each get one.
async fn health_probes_that_arrive_together_each_hear_that_the_database_is_reachable(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let probes = (0..50).map(|_| app.get("/healthz", ACME_AGENT));
    for health in futures::future::join_all(probes).await {
        assert_eq!(health.status, 200);
        assert_eq!(health.json()["database"], "reachable");
    }
}

async fn a_problems_type_opens_the_page_of_its_code_and_an_unknown_code_is_404(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let refused = app.create_ticket("key-1", r#"{"project":"ops"}"#).await;
    let link = refused.json()["type"].as_str().unwrap().to_owned();

    let page = app.get(&link, ACME_AGENT).await;
    assert_eq!(page.status, 200, "{link}");
    let text = String::from_utf8_lossy(&page.body);
    assert!(text.contains("<h1><code>invalid_request</code></h1>"), "{text}");
    assert!(text.contains("HTTP 400"), "{text}");
    assert!(
        !text.contains("idempotency_key_reused"),
        "the page of this code alone: {text}"
    );
    app.get("/docs/problems/no_such_code", ACME_AGENT)
        .await
        .assert_problem(404, "not_found");
}

/// Every status an operation can answer is in the document: the ones the
/// shared layers answer before a handler runs as problems (the 503 of a
/// connection past the cap among them), and the 431 of headers too large,
/// which the HTTP layer answers with no body.
async fn each_operation_documents_every_status_it_can_answer_with_the_problem_schema(backend: Backend) {
    let app = TestApp::spawn(backend).await;

    let openapi = app.get("/openapi.json", ACME_AGENT).await.json();

    let problem = json!({"$ref": "#/components/schemas/Problem"});
    for (path, item) in openapi["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let responses = operation["responses"].as_object().unwrap();
            for status in ["401", "408", "431", "500", "503"] {
                assert!(responses.contains_key(status), "{method} {path} documents {status}");
            }
            let errors = responses
                .iter()
                .filter(|(status, _)| !status.starts_with('2') && *status != "431");
            for (status, response) in errors {
                assert_eq!(
                    response["content"]["application/problem+json"]["schema"], problem,
                    "{method} {path} {status} is a problem"
                );
            }
        }
    }
    let create = openapi["paths"]["/v1/tickets"]["post"]["responses"]
        .as_object()
        .unwrap();
    for status in ["400", "409", "413", "415", "422"] {
        assert!(create.contains_key(status), "POST /v1/tickets documents {status}");
    }
    let set_status = openapi["paths"]["/v1/tickets/{ticket_id}/status"]["put"]["responses"]
        .as_object()
        .unwrap();
    for status in ["400", "404", "409", "415"] {
        assert!(set_status.contains_key(status), "PUT status documents {status}");
    }
    let codes = &openapi["components"]["schemas"]["Problem"]["properties"]["code"]["enum"];
    for (code, _, _) in platform::problems::PROBLEM_CODES {
        assert!(
            codes.as_array().unwrap().contains(&json!(code)),
            "`{code}` is enumerated"
        );
    }
    assert_eq!(
        openapi["paths"]["/v1/tickets"]["post"]["responses"]["201"]["links"]["get_ticket"]["parameters"]["ticket_id"],
        "$response.body#/id"
    );
    // the lookup takes exactly one of its filters, so the document requires none of them
    let lookup = openapi["paths"]["/v1/operations"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let filters: Vec<(&str, bool)> = lookup
        .iter()
        .filter(|p| ["idempotency_key", "state", "outbox"].contains(&p["name"].as_str().unwrap()))
        .map(|p| (p["name"].as_str().unwrap(), p["required"].as_bool().unwrap_or(false)))
        .collect();
    assert_eq!(
        filters,
        [("idempotency_key", false), ("state", false), ("outbox", false)]
    );
    for settling in ["resolution", "redelivery"] {
        let responses = &openapi["paths"][format!("/v1/operations/{{operation_id}}/{settling}")]["post"]["responses"];
        for status in ["403", "404", "409"] {
            assert!(responses.get(status).is_some(), "POST …/{settling} documents {status}");
        }
    }
    // a member the server refuses is refused by the schema too, in each shape of the body
    let resolution = &openapi["components"]["schemas"]["ResolutionBody"]["oneOf"];
    assert_eq!(resolution.as_array().map(Vec::len), Some(2), "{resolution}");
    for shape in resolution.as_array().unwrap() {
        assert_eq!(shape["additionalProperties"], false, "{shape}");
    }
}

platform::both_backends!(
    a_create_for_a_known_source_event_answers_200_with_that_ticket_under_any_key,
    matching_never_reopens_a_closed_ticket_and_never_comments,
    the_same_source_event_in_another_project_or_account_is_another_ticket,
    identical_tickets_under_two_keys_are_two_tickets,
    each_comment_is_its_own_operation_and_a_retried_comment_is_added_once,
    setting_the_current_status_again_changes_nothing,
    a_stale_expected_version_is_409_version_mismatch,
    a_closed_ticket_does_not_change_status_and_the_409_names_its_status_once,
    lists_page_through_every_ticket_in_creation_order,
    the_service_serves_health_and_its_openapi_document,
    health_probes_that_arrive_together_each_hear_that_the_database_is_reachable,
    a_problems_type_opens_the_page_of_its_code_and_an_unknown_code_is_404,
    each_operation_documents_every_status_it_can_answer_with_the_problem_schema,
);

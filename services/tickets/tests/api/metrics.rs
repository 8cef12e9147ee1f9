//! `GET /metrics`: each outcome of a keyed write counted once under its
//! route, in Prometheus's text format, with no key, account or fingerprint
//! in it — checked by `promtool check metrics` where it is installed (CI
//! installs it).

use std::time::Duration;

use axum::{body::Body, http::Request};
use idempotency::IdempotencyConfig;
use platform::{Backend, on_pool};
use tickets::domain::{CreateTicket, Priority};

use crate::{outcomes::claim_as_another_attempt, support::*};

const URGENT: &str = r#"{"project":"ops","title":"Page the on-call","priority":"urgent"}"#;

/// The value of the first series of `name` whose labels include all of `labels`.
fn value(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .find(|line| labels.iter().all(|label| line.contains(label)))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

async fn scrape(app: &TestApp) -> (String, String) {
    let request = Request::get("/metrics").body(Body::empty()).unwrap();
    let answer = app.send(request).await;
    assert_eq!(answer.status.as_u16(), 200, "no key needed");
    let content_type = answer.header("content-type").unwrap_or_default().to_owned();
    (String::from_utf8(answer.body.to_vec()).unwrap(), content_type)
}

async fn each_outcome_of_a_keyed_write_is_counted_once_under_its_route_with_no_key_account_or_fingerprint(
    backend: Backend,
) {
    let app = TestApp::spawn_with_approvals(backend, IdempotencyConfig::default()).await;
    let created = app.create_ticket("key-created", ROTATE_CERT).await;
    app.create_ticket("key-created", ROTATE_CERT).await;
    app.create_ticket(
        "key-created",
        r#"{"project":"ops","title":"Another","priority":"high"}"#,
    )
    .await
    .assert_problem(422, "idempotency_key_reused");
    app.create_ticket("key-invalid", r#"{"project":"ops"}"#)
        .await
        .assert_problem(400, "invalid_request");
    app.create_ticket("key-urgent", URGENT).await;
    let rotate = CreateTicket {
        project: "ops".into(),
        title: "Rotate staging certificate".into(),
        description: None,
        priority: Priority::High,
        source_event_id: None,
        labels: vec![],
    };
    claim_as_another_attempt(&app, "key-running", &rotate, Duration::from_secs(30)).await;
    app.create_ticket("key-running", ROTATE_CERT)
        .await
        .assert_problem(409, "request_in_progress");
    // an operation whose effect may have happened elsewhere, and no answer stored
    let unknown = claim_as_another_attempt(&app, "key-unknown", &rotate, Duration::from_secs(30)).await;
    on_pool!(app.db.db.write(), |pool| sqlx::query(
        "UPDATE idempotency_operations SET state = 'unknown', lease_token = NULL, locked_until = NULL \
         WHERE operation_id = $1"
    )
    .bind(&unknown)
    .execute(pool)
    .await
    .unwrap()
    .rows_affected());
    app.create_ticket("key-unknown", ROTATE_CERT)
        .await
        .assert_problem(409, "operation_outcome_unknown");
    app.get("/v1/tickets", ACME_AGENT).await;

    let (text, content_type) = scrape(&app).await;

    let requests = "retrysafe_idempotency_requests_total";
    let route = r#"route="/v1/tickets""#;
    for (outcome, count) in [
        ("executed", 1.0),
        ("replayed", 1.0),
        ("key_reused", 1.0),
        ("invalid", 1.0),
        ("awaiting_approval", 1.0),
        ("in_progress", 1.0),
        ("outcome_unknown", 1.0),
    ] {
        let label = format!(r#"outcome="{outcome}""#);
        assert_eq!(
            value(&text, requests, &[route, &label, r#"service="tickets""#]),
            Some(count),
            "{outcome}:\n{text}"
        );
    }
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    assert!(
        value(
            &text,
            "retrysafe_request_duration_seconds_bucket",
            &[r#"route="/v1/tickets""#, r#"method="GET""#, r#"le="+Inf""#]
        )
        .is_some_and(|n| n >= 1.0),
        "a histogram with buckets, not a summary:\n{text}"
    );
    assert!(
        value(
            &text,
            "retrysafe_idempotency_claim_duration_seconds_count",
            &[r#"mode="transaction""#]
        )
        .is_some_and(|n| n >= 1.0)
    );
    assert_eq!(value(&text, "retrysafe_operations", &[r#"state="unknown""#]), Some(1.0));
    assert_eq!(
        value(&text, "retrysafe_operations", &[r#"state="in_progress""#]),
        Some(1.0)
    );
    assert_eq!(value(&text, "retrysafe_approvals", &[r#"state="pending""#]), Some(1.0));
    assert!(value(&text, "retrysafe_db_pool_connections", &[r#"state="in_use""#]).is_some());
    // nothing links the chain here: the inbox keeps the create's and the approval request's
    // four entries, and memory the four answers given from what was stored
    assert_eq!(
        value(&text, "retrysafe_journal_inbox_backlog", &[]),
        Some(8.0),
        "{text}"
    );
    for secret in [
        "key-created",
        "acme",
        created.operation_id(),
        ACME_AGENT,
        "fingerprint",
        "tkt_",
    ] {
        assert!(!text.contains(secret), "`{secret}` in the metrics:\n{text}");
    }
    promtool_accepts(&text);
}

/// `promtool check metrics` on the text, where promtool is installed; in CI
/// it must be.
fn promtool_accepts(text: &str) {
    use std::io::Write;
    let spawned = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) if std::env::var_os("CI").is_some() => panic!("promtool must be installed in CI: {e}"),
        Err(_) => return eprintln!("promtool is not installed: the text format is not checked"),
    };
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let checked = child.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

platform::both_backends!(
    each_outcome_of_a_keyed_write_is_counted_once_under_its_route_with_no_key_account_or_fingerprint,
);

//! docs/contract.md §8 through the API: what each attempt leaves in the
//! journal, who may read it, and a chain that holds under concurrent load.

use std::sync::Arc;

use axum::http::Method;
use futures::future::join_all;
use idempotency::IdempotencyConfig;
use platform::{Backend, on_pool};
use serde_json::{Value, json};

use crate::support::*;

const URGENT: &str = r#"{"project":"payments-api","title":"Checkout is down","priority":"urgent"}"#;

impl TestApp {
    /// The events of one operation, in chain order, as an approver reads them.
    async fn journal_of(&self, operation_id: &str) -> Vec<(String, String)> {
        let page = self
            .get(
                &format!("/v1/audit?operation_id={operation_id}&limit=200"),
                ACME_APPROVER,
            )
            .await;
        assert_eq!(page.status.as_u16(), 200, "{:?}", page.body);
        page.json()["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["event"].as_str().unwrap().to_owned(),
                    e["principal_id"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }
}

fn events(journal: &[(String, String)]) -> Vec<&str> {
    journal.iter().map(|(event, _)| event.as_str()).collect()
}

async fn the_journal_records_every_step_of_an_approved_operation_in_order(backend: Backend) {
    let app = TestApp::spawn_with_approvals(backend, IdempotencyConfig::default()).await;
    let first = app.create_ticket("key-1", URGENT).await;
    let request = first.json();
    app.create_ticket("key-1", URGENT).await;
    let body = json!({"decision": "approve", "fingerprint": request["fingerprint"]}).to_string();
    let approval = format!("/v1/approvals/{}/decision", request["approval_id"].as_str().unwrap());
    assert_eq!(
        app.post(&approval, ACME_APPROVER, None, &body).await.status.as_u16(),
        200
    );
    assert_eq!(app.create_ticket("key-1", URGENT).await.status.as_u16(), 201);
    assert_eq!(app.create_ticket("key-1", URGENT).await.replayed(), Some("true"));

    let journal = app.journal_of(first.operation_id()).await;

    assert_eq!(
        events(&journal),
        [
            "attempted",
            "claimed",
            "approval_requested",
            "replayed",
            "approved",
            "attempted",
            "claimed",
            "completed",
            "replayed",
        ]
    );
    assert_eq!(journal[4].1, "acme-approver", "the decision is the approver's");
    assert!(
        journal
            .iter()
            .filter(|(e, _)| e != "approved")
            .all(|(_, who)| who == "acme-agent")
    );
}

async fn a_replay_is_journaled_as_replayed_and_a_changed_body_as_key_reused(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app.create_ticket("key-1", ROTATE_CERT).await;
    app.create_ticket("key-1", ROTATE_CERT).await;
    app.create_ticket("key-1", &ROTATE_CERT.replace("high", "low")).await;

    let journal = app.journal_of(first.operation_id()).await;

    assert_eq!(events(&journal), ["completed", "replayed", "key_reused"]);
    let entries = app.get("/v1/audit?event=replayed", ACME_APPROVER).await.json();
    let entry = &entries["data"][0];
    assert_eq!(entry["operation_id"], first.operation_id());
    assert_eq!(entry["idempotency_key"], "key-1");
    assert_eq!(entry["route"], "/v1/tickets");
    assert_eq!(entry["fingerprint"].as_str().unwrap().len(), 64);
    assert_eq!(entries["data"].as_array().unwrap().len(), 1);
    let text = String::from_utf8_lossy(&app.get("/v1/audit", ACME_APPROVER).await.body).to_string();
    assert!(
        !text.contains("Rotate staging certificate") && !text.contains("demo-acme-agent"),
        "no bodies and no API keys in the journal"
    );
}

async fn the_journal_is_read_by_approvers_and_admins_of_its_own_account_only(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app.create_ticket("key-1", ROTATE_CERT).await;

    app.get("/v1/audit", ACME_AGENT).await.assert_problem(403, "forbidden");
    let theirs = app
        .get(
            &format!("/v1/audit?operation_id={}", first.operation_id()),
            GLOBEX_APPROVER,
        )
        .await
        .json();

    assert_eq!(theirs["data"], json!([]));
}

async fn the_journal_filters_by_time_range_and_pages_in_chain_order(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    for _ in 0..3 {
        app.create_ticket("key-1", ROTATE_CERT).await; // a create, then two replays
    }
    let all = app.get("/v1/audit", ACME_APPROVER).await.json();
    let middle = all["data"][1]["at"].as_str().unwrap().to_owned();
    app.create_ticket("key-2", ROTATE_CERT).await;

    let until = app
        .get(&format!("/v1/audit?until={middle}"), ACME_APPROVER)
        .await
        .json();
    let since = app
        .get(&format!("/v1/audit?since={middle}&limit=2"), ACME_APPROVER)
        .await
        .json();
    let rest = app
        .get(
            &format!(
                "/v1/audit?since={middle}&limit=2&cursor={}",
                since["next_cursor"].as_str().unwrap()
            ),
            ACME_APPROVER,
        )
        .await
        .json();

    assert!(
        until["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["at"].as_str().unwrap() < middle.as_str())
    );
    let seqs = |page: &Value| -> Vec<i64> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_i64().unwrap())
            .collect()
    };
    let (first_page, second_page) = (seqs(&since), seqs(&rest));
    assert_eq!(first_page.len(), 2);
    assert!(first_page[1] < second_page[0], "pages follow the chain");
    app.get("/v1/audit?since=yesterday", ACME_APPROVER)
        .await
        .assert_problem(400, "invalid_request");
}

async fn the_chain_verifies_after_a_thousand_mixed_concurrent_operations(backend: Backend) {
    let app = Arc::new(TestApp::spawn_with_approvals(backend, IdempotencyConfig::default()).await);
    let workers = join_all((0..20).map(|worker| {
        let app = app.clone();
        tokio::spawn(async move {
            for n in 0..50 {
                let key = format!("key-{worker}-{}", n / 2);
                let (bearer, body) = match n % 5 {
                    // a create and, on the odd n, its retry: a replay
                    0..=2 => (ACME_AGENT, ROTATE_CERT.to_owned()),
                    // the same key with another body: key_reused
                    3 => (ACME_AGENT, ROTATE_CERT.replace("high", "low")),
                    // an urgent ticket: an approval request
                    _ => (GLOBEX_AGENT, URGENT.to_owned()),
                };
                app.post("/v1/tickets", bearer, Some(&key), &body).await;
            }
        })
    }))
    .await;
    for worker in workers {
        worker.unwrap();
    }

    app.app.idempotency.flush_journal().await;
    let entries = journal::all_entries(&app.db.db).await.unwrap();
    journal::verify(&entries, None).expect("one unbroken chain");

    use journal::AuditEvent::*;
    let outcomes = entries
        .iter()
        .filter(|e| matches!(e.event, Completed | Replayed | KeyReused | ApprovalRequested))
        .count();
    assert_eq!(outcomes, 1000, "one entry naming its outcome per request");
}

/// The state changes a caller can make with no key are journaled too:
/// who, through which route, which ticket, and its new status.
async fn a_status_change_without_a_key_is_journaled_with_its_principal_route_and_new_status(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let ticket = app.create_ticket("key-1", ROTATE_CERT).await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let put = |status: &str| {
        json_request(
            Method::PUT,
            &format!("/v1/tickets/{ticket}/status"),
            ACME_AGENT,
            None,
            json!({ "status": status }),
        )
    };

    let changed = app.send(put("resolved")).await;
    let same_again = app.send(put("resolved")).await;
    let page = app.get("/v1/audit?event=state_changed", ACME_APPROVER).await.json();

    assert_eq!(changed.json()["changed"], true);
    assert_eq!(same_again.json()["changed"], false);
    let entries = page["data"].as_array().unwrap();
    assert_eq!(
        entries.len(),
        1,
        "a PUT that changed nothing journals nothing: {entries:?}"
    );
    let entry = &entries[0];
    assert_eq!(entry["principal_id"], "acme-agent");
    assert_eq!(entry["route"], "/v1/tickets/{ticket_id}/status");
    assert_eq!(
        (&entry["resource_type"], &entry["resource_id"], &entry["state"]),
        (&json!("ticket"), &json!(ticket), &json!("resolved"))
    );
    assert_eq!(entry["operation_id"], Value::Null, "no key, no operation");
    app.app.idempotency.flush_journal().await;
    assert!(journal::verify(&journal::all_entries(&app.db.db).await.unwrap(), None).is_ok());
}

/// The head an operator pins: the chain's newest entry, for approvers and
/// admins; before any entry, the genesis hash at 0.
async fn the_journal_head_is_the_chains_newest_entry_and_is_read_like_the_journal(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let empty = app.get("/v1/audit/head", ACME_APPROVER).await;
    app.create_ticket("key-1", ROTATE_CERT).await;

    let head = app.get("/v1/audit/head", ACME_APPROVER).await;
    let entries = journal::all_entries(&app.db.db).await.unwrap();
    let newest = entries.last().expect("the create's entries");

    assert_eq!(empty.json(), json!({"seq": 0, "hash": journal::GENESIS}));
    assert_eq!(head.status.as_u16(), 200);
    assert_eq!(head.json(), json!({"seq": newest.seq, "hash": newest.hash}));
    let pinned: journal::Head = serde_json::from_value(head.json()).unwrap();
    assert!(journal::verify(&entries, Some(&pinned)).is_ok());
    app.get("/v1/audit/head", ACME_AGENT)
        .await
        .assert_problem(403, "forbidden");
}

/// A running service remembers the head it last linked. With the journal's
/// guards dropped and its tail deleted under it, it links nothing and takes
/// no removed entry's number again: it counts the refusal in its metrics,
/// keeps publishing the head it linked, and a new ticket's entries wait.
async fn a_journal_cut_under_the_running_service_is_not_linked_onto(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    for n in 0..3 {
        app.create_ticket(&format!("key-{n}"), ROTATE_CERT).await;
    }
    let linked: journal::Head = serde_json::from_value(app.get("/v1/audit/head", ACME_APPROVER).await.json()).unwrap();
    assert_eq!(linked.seq, 3);
    let unguard: &[&str] = match backend {
        Backend::Postgres => &["ALTER TABLE audit_journal DISABLE TRIGGER USER"],
        Backend::Sqlite => &[
            "DROP TRIGGER audit_journal_no_update",
            "DROP TRIGGER audit_journal_no_delete",
            "DROP TRIGGER audit_journal_no_replace",
            "DROP TRIGGER audit_journal_links_onto_the_entry_before",
        ],
    };
    for statement in unguard.iter().chain(&["DELETE FROM audit_journal WHERE seq > 1"]) {
        on_pool!(app.db.db.write(), |pool| {
            sqlx::raw_sql(sqlx::AssertSqlSafe(*statement))
                .execute(pool)
                .await
                .unwrap();
        });
    }

    assert_eq!(
        app.create_ticket("key-after-the-cut", ROTATE_CERT)
            .await
            .status
            .as_u16(),
        201
    );
    let head = app.get("/v1/audit/head", ACME_APPROVER).await.json();
    let entries = journal::all_entries(&app.db.db).await.unwrap();
    let scrape = axum::http::Request::get("/metrics")
        .body(axum::body::Body::empty())
        .unwrap();
    let metrics = String::from_utf8(app.send(scrape).await.body.to_vec()).unwrap();

    assert_eq!(entries.len(), 1, "nothing is linked onto the cut journal: {entries:?}");
    assert_eq!(
        app.count("SELECT COUNT(*) FROM audit_inbox").await,
        1,
        "the new ticket's entry waits"
    );
    assert_eq!(
        head,
        json!({"seq": linked.seq, "hash": linked.hash}),
        "the published head does not go back"
    );
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("retrysafe_journal_head_behind_total") && !line.ends_with(" 0")),
        "{metrics}"
    );
}

platform::both_backends!(
    a_journal_cut_under_the_running_service_is_not_linked_onto,
    a_status_change_without_a_key_is_journaled_with_its_principal_route_and_new_status,
    the_journal_head_is_the_chains_newest_entry_and_is_read_like_the_journal,
    the_journal_records_every_step_of_an_approved_operation_in_order,
    a_replay_is_journaled_as_replayed_and_a_changed_body_as_key_reused,
    the_journal_is_read_by_approvers_and_admins_of_its_own_account_only,
    the_journal_filters_by_time_range_and_pages_in_chain_order,
    the_chain_verifies_after_a_thousand_mixed_concurrent_operations,
);

//! An approved run re-reads what its approver was promised, below HTTP:
//! the core's layer with approvals as its gate, on SQLite and on PostgreSQL.

use std::sync::atomic::{AtomicUsize, Ordering};

use approvals::{ApprovalSummary, Approvals, Decision};
use axum::{
    body::Bytes,
    http::{StatusCode, request::Parts},
    response::Response,
};
use http_body_util::BodyExt;
use idempotency::{
    Attempt, Effect, Idempotency, IdempotencyConfig, IdempotencyHeaders, IdempotencyKey, OperationState, store,
    transitions::AuditEvent,
};
use platform::{ApiError, Backend, Principal, Role, on_pool, on_tx, testing::TestDb};
use serde_json::json;

/// A migrated database with an `effects` table, the layer on it with
/// approvals as its gate, and acme's agent.
struct Fixture {
    db: TestDb,
    idempotency: Idempotency,
    principal: Principal,
}

async fn fixture(backend: Backend) -> Fixture {
    let db = TestDb::new(backend).await;
    db.db
        .migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS])
        .await
        .unwrap();
    on_pool!(db.db.write(), |pool| sqlx::query(
        "CREATE TABLE effects (id TEXT PRIMARY KEY)"
    )
    .execute(pool)
    .await
    .unwrap()
    .rows_affected());
    let idempotency = Idempotency::new(db.db.clone(), IdempotencyConfig::default())
        .with_sink(journal::Journal::default())
        .with_gate(Approvals);
    let principal = Principal {
        account_id: "acme".into(),
        principal_id: "acme-agent".into(),
        role: Role::Agent,
    };
    Fixture {
        db,
        idempotency,
        principal,
    }
}

async fn insert_effect(tx: &mut platform::Tx) -> Result<(), ApiError> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    on_tx!(tx, |conn| sqlx::query("INSERT INTO effects (id) VALUES ($1)")
        .bind(&id)
        .execute(conn)
        .await?
        .rows_affected());
    Ok(())
}

async fn read(response: Response) -> (StatusCode, Parts, Bytes) {
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let mut request = axum::http::Request::new(());
    *request.headers_mut() = parts.headers;
    (parts.status, request.into_parts().0, bytes)
}

fn header<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

/// What a test's route tells an approver: an action that replaces `replaces`.
fn summary(replaces: &str) -> ApprovalSummary {
    ApprovalSummary {
        action: "replace the thing".into(),
        target: "the thing".into(),
        consequences: format!("replaces {replaces}"),
        identifiers: [("replaces".to_owned(), replaces.to_owned())].into(),
    }
}

impl Fixture {
    fn attempt(&self, key: &str) -> Attempt<'_> {
        Attempt::post(
            "/v1/things",
            &self.principal,
            IdempotencyHeaders {
                key: IdempotencyKey::parse(key).unwrap(),
                wait: None,
            },
        )
    }

    async fn effects(&self) -> i64 {
        on_pool!(self.db.db.read(), |pool| sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM effects"
        )
        .fetch_one(pool)
        .await
        .unwrap())
    }

    /// An attempt on `key` whose policy gives the request to a human, shown `summary`.
    fn attempt_shown(&self, key: &str, summary: &ApprovalSummary) -> Attempt<'_> {
        self.attempt(key).approval(Some(summary.clone()))
    }

    /// An operation asked for on `key` with `summary`, and approved by an approver of the account.
    async fn approved(&self, key: &str, command: &serde_json::Value, summary: &ApprovalSummary) {
        let asked = self
            .idempotency
            .execute(self.attempt_shown(key, summary), command, async |_, _| {
                Err(ApiError::internal("an operation waiting for a human does not run"))
            })
            .await;
        let (status, _, body) = read(asked).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body:?}");
        let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let approver = Principal {
            account_id: "acme".into(),
            principal_id: "acme-approver".into(),
            role: Role::Approver,
        };
        approvals::decide(
            &self.idempotency,
            &approver,
            request["approval_id"].as_str().unwrap(),
            Decision::Approve,
            request["fingerprint"].as_str().unwrap(),
        )
        .await
        .unwrap();
    }

    async fn journaled(&self, event: AuditEvent) -> usize {
        self.idempotency.flush_journal().await;
        let entries = journal::entries(&self.db.db, 0, 1000).await.unwrap();
        entries.iter().filter(|e| e.event == event).count()
    }
}

/// The approved run re-reads what the approver was promised: when the
/// route's policy now writes another summary for the same request, the run
/// is refused as stale, nothing runs, and every later attempt gets that 409.
async fn an_approved_run_whose_summary_no_longer_reads_as_approved_is_refused_as_stale_and_never_runs(
    backend: Backend,
) {
    let f = fixture(backend).await;
    let command = json!({"n": 1});
    f.approved("k", &command, &summary("nothing")).await;
    let runs = AtomicUsize::new(0);
    let retry = async || {
        f.idempotency
            .execute(f.attempt_shown("k", &summary("op_2")), &command, async |tx, _| {
                runs.fetch_add(1, Ordering::SeqCst);
                insert_effect(tx).await?;
                Ok(Effect::json(StatusCode::CREATED, &json!({})))
            })
            .await
    };

    let (status, _, body) = read(retry().await).await;
    let (again, parts, again_body) = read(retry().await).await;

    assert_eq!(status, StatusCode::CONFLICT);
    let refusal: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(refusal["code"], "approval_stale");
    assert_eq!(refusal["state"], "rejected");
    assert!(
        refusal["detail"]
            .as_str()
            .unwrap()
            .starts_with("`replaces` was `nothing` when approved and is `op_2` now"),
        "{refusal}"
    );
    assert_eq!((again, again_body), (status, body), "replayed to every later attempt");
    assert_eq!(header(&parts, "idempotent-replayed"), Some("true"));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the effect never ran");
    assert_eq!(f.effects().await, 0);
    let stored = store::find_by_key(&f.db.db, "acme", "k").await.unwrap().unwrap();
    assert_eq!(stored.state, OperationState::Rejected);
    assert_eq!(f.journaled(AuditEvent::Stale).await, 1);
}

/// A promise that can change after the retry read it is held by the effect,
/// in its own transaction: when the effect answers `approvals::stale`, its
/// writes roll back and the operation is refused as stale, exactly as when
/// the summary itself had changed.
async fn an_effect_that_finds_its_approvals_promise_broken_is_refused_as_stale_and_leaves_nothing(backend: Backend) {
    let f = fixture(backend).await;
    let command = json!({"n": 1});
    f.approved("k", &command, &summary("nothing")).await;
    let retry = async || {
        f.idempotency
            .execute(f.attempt_shown("k", &summary("nothing")), &command, async |tx, _| {
                insert_effect(tx).await?;
                Err(approvals::stale("`op_2` replaced nothing meanwhile"))
            })
            .await
    };

    let (status, first, body) = read(retry().await).await;
    let (again, _, again_body) = read(retry().await).await;

    assert_eq!(status, StatusCode::CONFLICT);
    let refusal: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(refusal["code"], "approval_stale");
    assert_eq!(refusal["state"], "rejected");
    assert_eq!(refusal["operation_id"], header(&first, "operation-id").unwrap());
    assert!(refusal["approval_id"].is_string());
    assert_eq!((again, again_body), (status, body));
    assert_eq!(f.effects().await, 0, "the effect's writes rolled back");
    let stored = store::find_by_key(&f.db.db, "acme", "k").await.unwrap().unwrap();
    assert_eq!(stored.state, OperationState::Rejected);
    assert_eq!(f.journaled(AuditEvent::Stale).await, 1);
}

/// The same summary, as approved: the approved run goes ahead.
async fn an_approved_run_whose_promise_holds_runs_once(backend: Backend) {
    let f = fixture(backend).await;
    let command = json!({"n": 1});
    f.approved("k", &command, &summary("nothing")).await;

    let ran = f
        .idempotency
        .execute(f.attempt_shown("k", &summary("nothing")), &command, async |tx, _| {
            insert_effect(tx).await?;
            Ok(Effect::json(StatusCode::CREATED, &json!({})))
        })
        .await;

    assert_eq!(read(ran).await.0, StatusCode::CREATED);
    assert_eq!(f.effects().await, 1);
}

platform::both_backends!(
    an_approved_run_whose_summary_no_longer_reads_as_approved_is_refused_as_stale_and_never_runs,
    an_effect_that_finds_its_approvals_promise_broken_is_refused_as_stale_and_leaves_nothing,
    an_approved_run_whose_promise_holds_runs_once,
);

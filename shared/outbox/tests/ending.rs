//! What a service ends itself — an event withdrawn before it was ever sent —
//! is reported to the layer's sink, in the transaction that ends it, as the
//! worker's settlements are: a service reporting to a sink of its own gets
//! the end there, and nothing else is written for it.

use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use idempotency::{
    Attempt, BoxFuture, Effect, Idempotency, IdempotencyConfig, IdempotencyHeaders, IdempotencyKey, OPERATION_ID,
    OperationState,
    transitions::{AuditEvent, Record, Sink},
};
use platform::{Backend, Db, Principal, Role, Tx, on_pool, testing::TestDb};
use serde_json::json;

/// A sink that keeps the transitions it is given, in memory.
#[derive(Debug, Default)]
struct Kept(Arc<Mutex<Vec<AuditEvent>>>);

impl Sink for Kept {
    fn record<'a>(&'a self, _tx: &'a mut Tx, records: &'a [Record]) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        self.0.lock().unwrap().extend(records.iter().map(|r| r.event));
        Box::pin(async { Ok(()) })
    }

    fn observe<'a>(&'a self, _db: &'a Db, _record: Record) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

async fn inbox_rows(db: &Db) -> i64 {
    on_pool!(db.read(), |pool| sqlx::query_scalar("SELECT COUNT(*) FROM audit_inbox")
        .fetch_one(pool)
        .await
        .unwrap())
}

async fn a_withdrawn_event_s_end_is_reported_to_the_layer_s_own_sink_and_to_no_inbox(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.db
        .migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS])
        .await
        .unwrap();
    let kept = Kept::default();
    let reported = kept.0.clone();
    let idempotency = Idempotency::new(db.db.clone(), IdempotencyConfig::default()).with_sink(kept);
    let principal = Principal {
        account_id: "acme".into(),
        principal_id: "acme-agent".into(),
        role: Role::Agent,
    };
    let key = IdempotencyHeaders {
        key: IdempotencyKey::parse("rollout-1").unwrap(),
        wait: None,
    };
    let order = json!({"release": "r1"});
    let answer = idempotency
        .execute(Attempt::post("/v1/rollouts", &principal, key), &order, async |_, _| {
            Ok(Effect::json(StatusCode::ACCEPTED, &order).with_handoff(outbox::Event::new("rollout", &order)))
        })
        .await;
    assert_eq!(answer.status(), StatusCode::ACCEPTED);
    let operation_id = answer.headers()[OPERATION_ID].to_str().unwrap().to_owned();
    let inbox_before = inbox_rows(&db.db).await;

    let mut tx = db.db.begin().await.unwrap();
    let withdrawn = outbox::withdraw(&idempotency, &mut tx, "acme", &operation_id, "acme-admin", "cancelled")
        .await
        .unwrap();
    tx.commit().await.unwrap();

    assert!(withdrawn, "an event never sent is withdrawn");
    assert_eq!(reported.lock().unwrap().last(), Some(&AuditEvent::Failed));
    assert_eq!(
        inbox_rows(&db.db).await,
        inbox_before,
        "the end goes to the sink, not straight to the inbox"
    );
    let operation = idempotency::store::find_by_id(&db.db, "acme", &operation_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(operation.state, OperationState::Failed);
}

platform::both_backends!(a_withdrawn_event_s_end_is_reported_to_the_layer_s_own_sink_and_to_no_inbox);

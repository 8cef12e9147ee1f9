//! What every test of the layer below HTTP starts from: a migrated database
//! with an `effects` table, the layer on it, and acme's agent.

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::{
    body::Bytes,
    http::{StatusCode, request::Parts},
    response::Response,
};
use http_body_util::BodyExt;
use idempotency::{
    Attempt, Effect, Fingerprint, Idempotency, IdempotencyConfig, IdempotencyHeaders, IdempotencyKey,
    store::{self, NewOperation},
};
use platform::{ApiError, Backend, Principal, Role, Timestamp, on_pool, on_tx, testing::TestDb};
use serde_json::json;

pub const ROUTE: &str = "/v1/things";

pub struct Fixture {
    pub db: TestDb,
    pub idempotency: Idempotency,
    pub principal: Principal,
}

pub async fn fixture(backend: Backend) -> Fixture {
    migrated(TestDb::new(backend).await).await
}

/// The fixture on `db`, once it has every migration.
pub async fn migrated(db: TestDb) -> Fixture {
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
    let idempotency =
        Idempotency::new(db.db.clone(), IdempotencyConfig::default()).with_sink(journal::Journal::default());
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

impl Fixture {
    pub fn attempt(&self, key: &str) -> Attempt<'_> {
        Attempt::post(
            ROUTE,
            &self.principal,
            IdempotencyHeaders {
                key: IdempotencyKey::parse(key).unwrap(),
                wait: None,
            },
        )
    }

    /// Runs an operation whose effect inserts one row into `effects` and counts its runs.
    pub async fn run(&self, key: &str, command: serde_json::Value, runs: &AtomicUsize) -> (StatusCode, Parts, Bytes) {
        self.run_in(&self.idempotency, key, command, runs).await
    }

    /// [`Self::run`] by the layer of another process.
    pub async fn run_in(
        &self,
        idempotency: &Idempotency,
        key: &str,
        command: serde_json::Value,
        runs: &AtomicUsize,
    ) -> (StatusCode, Parts, Bytes) {
        let response = idempotency
            .execute(self.attempt(key), &command, async |tx, _| {
                runs.fetch_add(1, Ordering::SeqCst);
                insert_effect(tx).await?;
                Ok(Effect::json(StatusCode::CREATED, &json!({"made": command})))
            })
            .await;
        read(response).await
    }

    pub async fn effects(&self) -> i64 {
        on_pool!(self.db.db.read(), |pool| sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM effects"
        )
        .fetch_one(pool)
        .await
        .unwrap())
    }

    pub async fn claim(
        &self,
        key: &str,
        command: &serde_json::Value,
        locked_until: Timestamp,
    ) -> Option<idempotency::OperationRecord> {
        let key = IdempotencyKey::parse(key).unwrap();
        let fingerprint = Fingerprint::of("POST", ROUTE, "acme", command).unwrap();
        let mut tx = self.db.db.begin().await.unwrap();
        let claimed = store::claim(&mut tx, &new_operation(&key, &fingerprint, locked_until))
            .await
            .unwrap();
        match claimed {
            Some(_) => tx.commit().await.unwrap(),
            None => tx.rollback().await.unwrap(),
        }
        claimed
    }
}

pub async fn insert_effect(tx: &mut platform::Tx) -> Result<(), ApiError> {
    let id = uuid_token();
    on_tx!(tx, |conn| sqlx::query("INSERT INTO effects (id) VALUES ($1)")
        .bind(&id)
        .execute(conn)
        .await?
        .rows_affected());
    Ok(())
}

/// A new operation of acme's agent on [`ROUTE`], leased until `locked_until`.
pub fn new_operation<'a>(
    key: &'a IdempotencyKey,
    fingerprint: &'a Fingerprint,
    locked_until: Timestamp,
) -> NewOperation<'a> {
    NewOperation {
        account_id: "acme",
        key,
        operation_id: idempotency::operation::new_operation_id(),
        principal_id: "acme-agent",
        method: "POST",
        route: ROUTE,
        fingerprint,
        lease_token: uuid_token(),
        locked_until,
        now: Timestamp::now(),
    }
}

pub fn uuid_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

pub async fn read(response: Response) -> (StatusCode, Parts, Bytes) {
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts_without_body(parts), bytes)
}

pub fn parts_without_body(parts: axum::http::response::Parts) -> Parts {
    let mut request = axum::http::Request::new(());
    *request.headers_mut() = parts.headers;
    request.into_parts().0
}

pub fn header<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

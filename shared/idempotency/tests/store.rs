//! The idempotency layer below HTTP: claims, replays, mismatches, leases and
//! takeovers, atomicity of effect and completion, and the reaper — each on
//! SQLite and on PostgreSQL.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    body::Bytes,
    http::{StatusCode, request::Parts},
    response::Response,
};
use futures::future::join_all;
use http_body_util::BodyExt;
use idempotency::{
    Attempt, ClaimMode, Effect, Fingerprint, Idempotency, IdempotencyConfig, IdempotencyHeaders, IdempotencyKey,
    OperationState,
    approval::{self, ApprovalSummary, Decision},
    attempts::{AttemptCounter, KEYS_COUNTED_AT_MOST},
    audit::AuditEvent,
    store::{self, NewOperation},
};
use platform::{ApiError, Backend, Principal, Role, Timestamp, on_pool, on_tx, testing::TestDb};
use serde_json::json;
use tokio::sync::Notify;
use tracing::{Instrument, instrument::WithSubscriber};

const ROUTE: &str = "/v1/things";

struct Fixture {
    db: TestDb,
    idempotency: Idempotency,
    principal: Principal,
}

async fn fixture(backend: Backend) -> Fixture {
    migrated(TestDb::new(backend).await).await
}

/// The fixture on `db`, once it has every migration.
async fn migrated(db: TestDb) -> Fixture {
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
    let idempotency = Idempotency::new(db.db.clone(), IdempotencyConfig::default());
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
    fn attempt(&self, key: &str) -> Attempt<'_> {
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
    async fn run(&self, key: &str, command: serde_json::Value, runs: &AtomicUsize) -> (StatusCode, Parts, Bytes) {
        self.run_in(&self.idempotency, key, command, runs).await
    }

    /// [`Self::run`] by the layer of another process.
    async fn run_in(
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

    async fn effects(&self) -> i64 {
        on_pool!(self.db.db.read(), |pool| sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM effects"
        )
        .fetch_one(pool)
        .await
        .unwrap())
    }

    async fn claim(
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
        tx.commit().await.unwrap();
        claimed
    }
}

async fn insert_effect(tx: &mut platform::Tx) -> Result<(), ApiError> {
    let id = uuid_token();
    on_tx!(tx, |conn| sqlx::query("INSERT INTO effects (id) VALUES ($1)")
        .bind(&id)
        .execute(conn)
        .await?
        .rows_affected());
    Ok(())
}

/// A new operation of acme's agent on [`ROUTE`], leased until `locked_until`.
fn new_operation<'a>(
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

fn uuid_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

async fn read(response: Response) -> (StatusCode, Parts, Bytes) {
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts_without_body(parts), bytes)
}

fn parts_without_body(parts: axum::http::response::Parts) -> Parts {
    let mut request = axum::http::Request::new(());
    *request.headers_mut() = parts.headers;
    request.into_parts().0
}

fn header<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

async fn claiming_a_free_key_stores_a_running_operation_with_a_lease(backend: Backend) {
    let f = fixture(backend).await;
    let until = Timestamp::now().plus(Duration::from_secs(30));
    let claimed = f.claim("k", &json!({"n": 1}), until).await.expect("the key was free");

    assert_eq!(claimed.state, OperationState::InProgress);
    assert_eq!(claimed.attempts, 1);
    assert_eq!(claimed.locked_until, Some(until));
    assert!(claimed.lease_token.is_some());
    assert!(claimed.response.is_none());
}

async fn claiming_a_taken_key_writes_nothing(backend: Backend) {
    let f = fixture(backend).await;
    let until = Timestamp::now().plus(Duration::from_secs(30));
    let first = f.claim("k", &json!({"n": 1}), until).await.unwrap();

    let second = f.claim("k", &json!({"n": 2}), until).await;

    assert!(second.is_none());
    let stored = store::find_by_key(&f.db.db, "acme", "k").await.unwrap().unwrap();
    assert_eq!(stored.operation_id, first.operation_id);
    assert_eq!(stored.fingerprint, first.fingerprint);
}

async fn an_operation_runs_its_effect_once_and_replays_its_stored_answer(backend: Backend) {
    let f = fixture(backend).await;
    let runs = AtomicUsize::new(0);
    let (status, first, body) = f.run("k", json!({"n": 1}), &runs).await;
    let (again_status, again, again_body) = f.run("k", json!({"n": 1}), &runs).await;

    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(header(&first, "idempotent-replayed"), Some("false"));
    assert_eq!(again_status, StatusCode::CREATED);
    assert_eq!(again_body, body);
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&again, "operation-id"), header(&first, "operation-id"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.effects().await, 1);
}

async fn a_changed_command_under_the_same_key_is_422_and_runs_nothing(backend: Backend) {
    let f = fixture(backend).await;
    let runs = AtomicUsize::new(0);
    f.run("k", json!({"n": 1}), &runs).await;
    let (status, _, body) = f.run("k", json!({"n": 2}), &runs).await;

    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["code"],
        "idempotency_key_reused"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.effects().await, 1);
}

/// 2^53 + 1 and 2^53 are one double: canonical JSON would give both one
/// fingerprint, so the first is refused instead of confused with the second.
async fn a_command_holding_an_integer_a_double_cannot_hold_is_400_naming_it_and_claims_nothing(backend: Backend) {
    let f = fixture(backend).await;
    let runs = AtomicUsize::new(0);

    let (status, parts, body) = f
        .run("k", json!({"line": {"quantity": 9_007_199_254_740_993_i64}}), &runs)
        .await;
    let (retried, _, _) = f
        .run("k", json!({"line": {"quantity": 9_007_199_254_740_992_i64}}), &runs)
        .await;
    let (fixed, _, _) = f.run("k", json!({"line": {"quantity": 3}}), &runs).await;

    assert_eq!(status, StatusCode::BAD_REQUEST);
    let problem = serde_json::from_slice::<serde_json::Value>(&body).unwrap();
    assert_eq!(problem["code"], "invalid_request");
    assert_eq!(problem["errors"][0]["field"], "line.quantity", "{problem}");
    assert_eq!(header(&parts, "operation-id"), None);
    assert_eq!(retried, StatusCode::BAD_REQUEST, "never a replay of another number");
    assert_eq!(fixed, StatusCode::CREATED, "nothing was claimed by the 400s");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.effects().await, 1);
}

async fn a_duplicate_is_409_while_another_attempt_holds_the_lease(backend: Backend) {
    let f = fixture(backend).await;
    f.claim("k", &json!({"n": 1}), Timestamp::now().plus(Duration::from_secs(30)))
        .await
        .unwrap();
    let runs = AtomicUsize::new(0);

    let (status, parts, body) = f.run("k", json!({"n": 1}), &runs).await;

    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["code"],
        "request_in_progress"
    );
    assert!(header(&parts, "retry-after").is_some());
    assert_eq!(f.effects().await, 0, "whatever the duplicate started was rolled back");
}

async fn of_many_racing_takers_of_an_expired_lease_exactly_one_wins(backend: Backend) {
    let f = fixture(backend).await;
    let stale = f
        .claim("k", &json!({"n": 1}), Timestamp::now().minus(Duration::from_secs(1)))
        .await
        .unwrap();
    let db = f.db.db.clone();

    let takers = join_all((0..16).map(|n| {
        let (db, stale) = (db.clone(), stale.clone());
        tokio::spawn(async move {
            let now = Timestamp::now();
            take_over(
                &db,
                &stale,
                &format!("taker-{n}"),
                now.plus(Duration::from_secs(30)),
                now,
            )
            .await
            .unwrap()
        })
    }))
    .await;

    let winners: Vec<_> = takers.into_iter().filter_map(|t| t.unwrap()).collect();
    assert_eq!(winners.len(), 1, "the lease went to exactly one taker");
    let stored = store::find_by_key(&f.db.db, "acme", "k").await.unwrap().unwrap();
    assert_eq!(stored.lease_token, winners[0].lease_token);
    assert_eq!(stored.operation_id, stale.operation_id);
}

async fn a_lease_that_has_not_run_out_cannot_be_taken_over(backend: Backend) {
    let f = fixture(backend).await;
    let held = f
        .claim("k", &json!({"n": 1}), Timestamp::now().plus(Duration::from_secs(30)))
        .await
        .unwrap();
    let now = Timestamp::now();

    let taken = take_over(&f.db.db, &held, "thief", now.plus(Duration::from_secs(30)), now)
        .await
        .unwrap();

    assert!(taken.is_none());
}

async fn an_attempt_that_lost_its_lease_cannot_complete_the_operation(backend: Backend) {
    let f = fixture(backend).await;
    let command = json!({"n": 1});
    let slow = f
        .claim("k", &command, Timestamp::now().minus(Duration::from_secs(1)))
        .await
        .unwrap();
    let now = Timestamp::now();
    take_over(&f.db.db, &slow, "successor", now.plus(Duration::from_secs(30)), now)
        .await
        .unwrap()
        .unwrap();

    let mut tx = f.db.db.begin().await.unwrap();
    insert_effect(&mut tx).await.unwrap();
    let response = idempotency::StoredResponse {
        status: StatusCode::CREATED,
        content_type: "application/json".into(),
        location: None,
        body: b"{}".to_vec(),
    };
    let completion = store::Completion {
        state: OperationState::Completed,
        response: &response,
        resource: None,
        external_ref: None,
        now: Timestamp::now(),
    };
    let completed = store::complete(
        &mut tx,
        "acme",
        &slow.key,
        slow.lease_token.as_deref().unwrap(),
        &completion,
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();

    assert!(
        !completed,
        "the old holder's completion is refused, so its effect is rolled back"
    );
    assert_eq!(f.effects().await, 0);
}

async fn a_server_error_in_the_effect_rolls_its_writes_back_and_frees_the_key(backend: Backend) {
    let f = fixture(backend).await;
    let response = f
        .idempotency
        .execute(f.attempt("k"), &json!({"n": 1}), async |tx, _| {
            insert_effect(tx).await?;
            Err(ApiError::internal("the disk caught fire"))
        })
        .await;
    let (status, _, body) = read(response).await;

    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        !String::from_utf8_lossy(&body).contains("fire"),
        "internal causes are logged, never sent"
    );
    assert_eq!(f.effects().await, 0);
    assert!(
        store::find_by_key(&f.db.db, "acme", "k").await.unwrap().is_none(),
        "the key is free again"
    );

    let runs = AtomicUsize::new(0);
    let (retry, _, _) = f.run("k", json!({"n": 1}), &runs).await;
    assert_eq!(retry, StatusCode::CREATED);
    assert_eq!(f.effects().await, 1);
}

async fn a_business_failure_rolls_its_writes_back_and_is_replayed(backend: Backend) {
    let f = fixture(backend).await;
    let fail = async || {
        f.idempotency
            .execute(f.attempt("k"), &json!({"n": 1}), async |tx, _| {
                insert_effect(tx).await?;
                Err(ApiError::invalid_state("not now"))
            })
            .await
    };
    let (status, first, body) = read(fail().await).await;
    let (again_status, again, again_body) = read(fail().await).await;

    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(header(&first, "content-type"), Some("application/problem+json"));
    assert_eq!(again_status, StatusCode::CONFLICT);
    assert_eq!(again_body, body);
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(f.effects().await, 0, "a failed operation leaves no effect");
    let stored = store::find_by_key(&f.db.db, "acme", "k").await.unwrap().unwrap();
    assert_eq!(stored.state, OperationState::Failed);
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
        self.idempotency
            .decide_approval(
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
        let entries = idempotency::audit::entries(&self.db.db, 0, 1000).await.unwrap();
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
/// in its own transaction: when the effect answers `approval::stale`, its
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
                Err(approval::stale("`op_2` replaced nothing meanwhile"))
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

/// Makes every operation but the one keyed `except` look made and last
/// touched `at`: its time-ordered id too (`op_` and 12 hex digits of milliseconds).
async fn made_at(db: &platform::Db, at: Timestamp, except: &str) {
    on_pool!(db.write(), |pool| {
        sqlx::query(
            "UPDATE idempotency_operations SET updated_at = $1, operation_id = $2 || substr(operation_id, 16) \
             WHERE idempotency_key <> $3",
        )
        .bind(at)
        .bind(&idempotency::operation::first_operation_id_at(at)[..15])
        .bind(except)
        .execute(pool)
        .await
        .unwrap()
        .rows_affected()
    });
}

async fn the_reaper_removes_finished_operations_past_retention_and_never_running_or_unknown_ones(backend: Backend) {
    let f = fixture(backend).await;
    let runs = AtomicUsize::new(0);
    f.run("finished-old", json!({"n": 1}), &runs).await;
    f.run("finished-new", json!({"n": 2}), &runs).await;
    f.claim(
        "running-old",
        &json!({"n": 3}),
        Timestamp::now().plus(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    f.claim(
        "unknown-old",
        &json!({"n": 4}),
        Timestamp::now().plus(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let two_days_ago = Timestamp::now().minus(Duration::from_secs(48 * 3600));
    on_pool!(f.db.db.write(), |pool| {
        sqlx::query(
            "UPDATE idempotency_operations SET state = 'unknown', lease_token = NULL, locked_until = NULL \
             WHERE idempotency_key = 'unknown-old'",
        )
        .execute(pool)
        .await
        .unwrap()
        .rows_affected()
    });
    made_at(&f.db.db, two_days_ago, "finished-new").await;

    f.idempotency.flush_journal().await;
    let reaped = f.idempotency.reap_once().await.unwrap();

    assert_eq!(reaped, 1);
    for (key, kept) in [
        ("finished-old", false),
        ("finished-new", true),
        ("running-old", true),
        ("unknown-old", true),
    ] {
        let found = store::find_by_key(&f.db.db, "acme", key).await.unwrap();
        assert_eq!(found.is_some(), kept, "{key}");
    }
}

/// Retention never costs the journal an operation: one reaped before a
/// round linked its entry still has it linked (it waits in the inbox, not in
/// the operation's row).
async fn the_reaper_never_takes_an_operations_journal_entries_with_it(backend: Backend) {
    let f = fixture(backend).await;
    let runs = AtomicUsize::new(0);
    f.run("finished-old", json!({"n": 1}), &runs).await;
    made_at(&f.db.db, Timestamp::now().minus(Duration::from_secs(48 * 3600)), "").await;

    assert_eq!(f.idempotency.reap_once().await.unwrap(), 1);
    f.idempotency.flush_journal().await;

    let entries = idempotency::audit::entries(&f.db.db, 0, 100).await.unwrap();
    let events: Vec<(Option<&str>, AuditEvent)> = entries
        .iter()
        .map(|e| (e.idempotency_key.as_deref(), e.event))
        .collect();
    assert_eq!(events, [(Some("finished-old"), AuditEvent::Completed)]);
}

async fn many_concurrent_attempts_with_one_key_commit_the_effect_once(backend: Backend) {
    for claim in [ClaimMode::InTransaction, ClaimMode::Leased] {
        concurrent_attempts_with_one_key(backend, claim).await;
    }
}

async fn concurrent_attempts_with_one_key(backend: Backend, claim: ClaimMode) {
    let mut f = fixture(backend).await;
    f.idempotency = Idempotency::new(
        f.db.db.clone(),
        IdempotencyConfig {
            claim,
            ..IdempotencyConfig::default()
        },
    );
    let f = Arc::new(f);
    let runs = Arc::new(AtomicUsize::new(0));
    let answers = join_all((0..32).map(|_| {
        let (f, runs) = (f.clone(), runs.clone());
        tokio::spawn(async move { f.run("k", json!({"n": 1}), &runs).await.0 })
    }))
    .await;

    assert_eq!(f.effects().await, 1, "{claim:?}: one key, one committed effect");
    if claim == ClaimMode::Leased {
        // a committed claim keeps every other attempt from even starting the effect
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
    for status in answers {
        assert!(matches!(status.unwrap().as_u16(), 201 | 409));
    }
}

/// Two processes on one database, one claiming in the effect's transaction
/// and one under leases, each creating, replaying the other's creates and
/// running chain rounds while the other writes. Every entry must still land,
/// once, in one chain that verifies, and each operation's entries in the
/// order they happened.
async fn two_processes_creating_replaying_and_chaining_on_one_database_keep_one_unbroken_chain(backend: Backend) {
    let f = Arc::new(fixture(backend).await);
    // the other process claims with a lease: its transitions wait in the
    // inbox, for chain rounds that race this process's chained claims
    let other = Arc::new(Idempotency::new(
        platform::Db::connect(&f.db.url, 4).await.unwrap(),
        IdempotencyConfig {
            claim: ClaimMode::Leased,
            ..IdempotencyConfig::default()
        },
    ));
    let runs = Arc::new(AtomicUsize::new(0));

    let answers = join_all((0..40).map(|n| {
        let (f, other, runs) = (f.clone(), other.clone(), runs.clone());
        tokio::spawn(async move {
            let (creator, replayer) = if n % 2 == 0 {
                (&f.idempotency, &*other)
            } else {
                (&*other, &f.idempotency)
            };
            let (key, command) = (format!("k-{n}"), json!({"n": n}));
            let created = f.run_in(creator, &key, command.clone(), &runs).await;
            let replayed = f.run_in(replayer, &key, command, &runs).await;
            replayer.flush_journal().await;
            (created.0, header(&replayed.1, "idempotent-replayed").map(str::to_owned))
        })
    }))
    .await;
    f.idempotency.flush_journal().await;
    other.flush_journal().await;

    for answer in answers {
        assert_eq!(answer.unwrap(), (StatusCode::CREATED, Some("true".to_owned())));
    }
    assert_eq!(f.effects().await, 40);
    let entries = idempotency::audit::entries(&f.db.db, 0, 1000).await.unwrap();
    let verified = idempotency::audit::verify(&entries, None).expect("one chain that verifies");
    assert_eq!(
        verified.entries,
        20 + 20 * 3 + 40,
        "completed for a create in one transaction; attempted, claimed and completed for a leased one; \
         replayed for each replay"
    );
    for n in 0..40 {
        let key = format!("k-{n}");
        let events: Vec<AuditEvent> = entries
            .iter()
            .filter(|e| e.idempotency_key.as_deref() == Some(key.as_str()))
            .map(|e| e.event)
            .collect();
        let created: &[AuditEvent] = if n % 2 == 0 {
            &[AuditEvent::Completed]
        } else {
            &[AuditEvent::Attempted, AuditEvent::Claimed, AuditEvent::Completed]
        };
        let replayed = [AuditEvent::Replayed];
        assert_eq!(
            events,
            [created, &replayed].concat(),
            "{key}: the create's entries first, in order"
        );
    }
}

/// A claim's journal entry commits with it: a claim whose transaction rolled
/// back leaves none, and the next claim's entry, carrying its attempt
/// number, links onto the chain as it is.
async fn a_claim_that_rolled_back_journals_nothing_and_the_next_claim_links_onto_the_chain(backend: Backend) {
    let f = fixture(backend).await;
    let answer = idempotency::StoredResponse {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        content_type: "application/problem+json".into(),
        location: None,
        body: b"{}".to_vec(),
    };
    let claim_finished = async |key: &str| {
        let key = IdempotencyKey::parse(key).unwrap();
        let fingerprint = Fingerprint::of("POST", ROUTE, "acme", &json!({"n": 1})).unwrap();
        let new = new_operation(&key, &fingerprint, Timestamp::now());
        let started = Timestamp::now();
        let mut tx = f.db.db.begin().await.unwrap();
        let claimed = store::claim_finished(&mut tx, &new, &store::Completion::failed(&answer), started)
            .await
            .unwrap();
        (tx, claimed)
    };

    let runs = AtomicUsize::new(0);
    f.run("before", json!({"n": 0}), &runs).await;
    f.idempotency.flush_journal().await;

    let (first, claimed) = claim_finished("rolled-back").await;
    assert!(claimed);
    first.rollback().await.unwrap();
    let (second, claimed) = claim_finished("committed").await;
    assert!(claimed);
    second.commit().await.unwrap();
    f.idempotency.flush_journal().await;

    let entries = idempotency::audit::entries(&f.db.db, 0, 100).await.unwrap();
    assert_eq!(idempotency::audit::verify(&entries, None).map(|v| v.entries), Ok(2));
    let claims: Vec<(Option<&str>, AuditEvent, Option<i64>)> = entries
        .iter()
        .map(|e| (e.idempotency_key.as_deref(), e.event, e.attempt))
        .collect();
    assert_eq!(
        claims,
        [
            (Some("before"), AuditEvent::Completed, Some(1)),
            (Some("committed"), AuditEvent::Failed, Some(1))
        ],
        "after the first create's entry, the committed claim's; none of the rolled-back one's"
    );
    assert!(
        store::find_by_key(&f.db.db, "acme", "rolled-back")
            .await
            .unwrap()
            .is_none()
    );
}

/// A reader of the journal runs a chain round first. If it goes away
/// mid-round (a client hung up on `GET /v1/audit`), the observations the round
/// took out of memory must still reach the chain.
async fn a_journal_round_whose_caller_went_away_still_links_what_it_took(backend: Backend) {
    let f = fixture(backend).await;
    let runs = AtomicUsize::new(0);
    f.run("k", json!({"n": 1}), &runs).await;
    let (_, replay, _) = f.run("k", json!({"n": 1}), &runs).await;
    assert_eq!(header(&replay, "idempotent-replayed"), Some("true"));

    // Polled exactly once (that poll hands the round, which takes the queued
    // observations, to a task), then dropped. A zero timeout would not do:
    // its timer fires on the driver's next tick, and a round quicker than
    // that would finish uncut.
    let hung_up = futures::FutureExt::now_or_never(f.idempotency.flush_journal());
    assert!(hung_up.is_none(), "the round was cut short");
    f.idempotency.flush_journal().await;

    let entries = idempotency::audit::entries(&f.db.db, 0, 100).await.unwrap();
    let events: Vec<AuditEvent> = entries.iter().map(|e| e.event).collect();
    assert_eq!(events, [AuditEvent::Completed, AuditEvent::Replayed]);
}

async fn an_effect_that_outlives_the_lease_is_rolled_back_and_frees_the_key(backend: Backend) {
    let mut f = fixture(backend).await;
    let config = IdempotencyConfig {
        lease: Duration::from_millis(300),
        ..IdempotencyConfig::default()
    };
    f.idempotency = Idempotency::new(f.db.db.clone(), config);
    let response = f
        .idempotency
        .execute(f.attempt("k"), &json!({"n": 1}), async |tx, _| {
            insert_effect(tx).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(Effect::json(StatusCode::CREATED, &json!({})))
        })
        .await;
    let (status, _, _) = read(response).await;

    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(f.effects().await, 0, "the hung transaction was rolled back");
    let runs = AtomicUsize::new(0);
    let (retry, _, _) = f.run("k", json!({"n": 1}), &runs).await;
    assert_eq!(retry, StatusCode::CREATED, "the key was free for the retry");
    assert_eq!(f.effects().await, 1);
}

impl Fixture {
    /// An attempt with `key` that sends `Prefer: wait` for `wait`.
    fn waiting_attempt(&self, key: &str, wait: Duration) -> Attempt<'_> {
        Attempt::post(
            ROUTE,
            &self.principal,
            IdempotencyHeaders {
                key: IdempotencyKey::parse(key).unwrap(),
                wait: Some(wait),
            },
        )
    }
}

async fn a_waiting_duplicate_answers_by_its_deadline_even_when_the_holder_s_lease_runs_out_meanwhile(backend: Backend) {
    let mut f = fixture(backend).await;
    let config = IdempotencyConfig {
        claim: ClaimMode::Leased,
        // the duplicate arrives well within the lease, however loaded the
        // machine, and the lease runs out halfway through its wait
        lease: Duration::from_secs(2),
        ..IdempotencyConfig::default()
    };
    f.idempotency = Idempotency::new(f.db.db.clone(), config);
    let (started, release) = (Notify::new(), Notify::new());
    // slow work under the lease (a call to another system), held until the test lets it go
    let slow_call = async |_: &str| {
        started.notify_one();
        release.notified().await;
        Ok::<_, ApiError>(())
    };
    let effect = async |tx: &mut platform::Tx, _: &str, (): ()| {
        insert_effect(tx).await?;
        Ok(Effect::json(StatusCode::CREATED, &json!({})))
    };
    let command = json!({"n": 1});

    let first = f
        .idempotency
        .execute_calling_out(f.attempt("k"), &command, slow_call, effect);
    let duplicate = async {
        started.notified().await;
        let never_called =
            async |_: &str| -> Result<(), ApiError> { panic!("a duplicate that waits never runs the operation") };
        let waited = f.idempotency.execute_calling_out(
            f.waiting_attempt("k", Duration::from_secs(4)),
            &command,
            never_called,
            effect,
        );
        let answer = tokio::time::timeout(Duration::from_secs(10), waited).await;
        release.notify_one();
        answer
    };
    let (first, duplicate) = tokio::join!(first, duplicate);

    let duplicate = duplicate.expect("the waiter answered within its wait, not when the run it found ended");
    let (status, parts, body) = read(duplicate).await;
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(problem["code"], "request_in_progress");
    assert!(problem["status_url"].is_string());
    assert!(header(&parts, "retry-after").is_some());
    let (first, _, _) = read(first).await;
    assert_eq!(first, StatusCode::CREATED, "the holder's run went on and finished");
    assert_eq!(f.effects().await, 1);
}

/// A `MakeWriter` that keeps what a test's log subscriber writes.
#[derive(Clone, Default)]
struct CapturedLog(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLog {
    type Writer = CapturedLog;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

async fn a_duplicate_that_waits_through_many_polls_names_its_operation_once_in_its_log_line(backend: Backend) {
    let f = fixture(backend).await;
    let command = json!({"n": 1});
    let held = f
        .claim("k", &command, Timestamp::now().plus(Duration::from_secs(30)))
        .await
        .unwrap();
    let log = CapturedLog::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .finish();
    let dispatch = tracing::Dispatch::new(subscriber);
    // the request span as the service's telemetry makes it
    let span = tracing::dispatcher::with_default(&dispatch, || {
        tracing::info_span!(
            "request",
            operation_id = tracing::field::Empty,
            fingerprint = tracing::field::Empty,
            outcome = tracing::field::Empty,
        )
    });

    let request = async {
        let response = f
            .idempotency
            .execute(
                f.waiting_attempt("k", Duration::from_millis(500)),
                &command,
                async |_, _| Ok(Effect::json(StatusCode::CREATED, &json!({}))),
            )
            .await;
        tracing::info!("request finished");
        response
    };
    let (status, _, _) = read(request.instrument(span).with_subscriber(dispatch).await).await;

    assert_eq!(status, StatusCode::CONFLICT, "it waited the whole time");
    let written = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let line = written
        .lines()
        .find(|line| line.contains("request finished"))
        .unwrap_or_else(|| panic!("no request line in {written}"));
    assert_eq!(line.matches("operation_id=").count(), 1, "{line}");
    assert_eq!(line.matches("fingerprint=").count(), 1, "{line}");
    assert!(line.contains(&held.operation_id), "{line}");
}

platform::both_backends!(
    an_effect_that_outlives_the_lease_is_rolled_back_and_frees_the_key,
    a_waiting_duplicate_answers_by_its_deadline_even_when_the_holder_s_lease_runs_out_meanwhile,
    a_duplicate_that_waits_through_many_polls_names_its_operation_once_in_its_log_line,
    claiming_a_free_key_stores_a_running_operation_with_a_lease,
    claiming_a_taken_key_writes_nothing,
    an_operation_runs_its_effect_once_and_replays_its_stored_answer,
    a_changed_command_under_the_same_key_is_422_and_runs_nothing,
    a_command_holding_an_integer_a_double_cannot_hold_is_400_naming_it_and_claims_nothing,
    a_duplicate_is_409_while_another_attempt_holds_the_lease,
    of_many_racing_takers_of_an_expired_lease_exactly_one_wins,
    a_lease_that_has_not_run_out_cannot_be_taken_over,
    an_attempt_that_lost_its_lease_cannot_complete_the_operation,
    a_server_error_in_the_effect_rolls_its_writes_back_and_frees_the_key,
    a_business_failure_rolls_its_writes_back_and_is_replayed,
    the_reaper_removes_finished_operations_past_retention_and_never_running_or_unknown_ones,
    the_reaper_never_takes_an_operations_journal_entries_with_it,
    many_concurrent_attempts_with_one_key_commit_the_effect_once,
    two_processes_creating_replaying_and_chaining_on_one_database_keep_one_unbroken_chain,
    a_claim_that_rolled_back_journals_nothing_and_the_next_claim_links_onto_the_chain,
    a_journal_round_whose_caller_went_away_still_links_what_it_took,
    an_approved_run_whose_summary_no_longer_reads_as_approved_is_refused_as_stale_and_never_runs,
    an_effect_that_finds_its_approvals_promise_broken_is_refused_as_stale_and_leaves_nothing,
    an_approved_run_whose_promise_holds_runs_once,
    attempt_counts_wait_in_memory_for_a_bounded_number_of_keys_and_past_it_are_written_first,
);

/// Attempts are counted in memory for a bounded number of keys: a count for
/// one key more writes those waiting first, so memory never holds more, and
/// no count is lost.
async fn attempt_counts_wait_in_memory_for_a_bounded_number_of_keys_and_past_it_are_written_first(backend: Backend) {
    let f = fixture(backend).await;
    let until = Timestamp::now().plus(Duration::from_secs(30));
    for key in ["first", "last"] {
        f.claim(key, &json!({"n": 1}), until).await.unwrap();
    }
    let attempts = async |key: &str| {
        store::find_by_key(&f.db.db, "acme", key)
            .await
            .unwrap()
            .unwrap()
            .attempts
    };
    let counter = AttemptCounter::default();

    counter.count(&f.db.db, "acme", "first").await;
    // keys of operations reaped meanwhile count too, and write nothing
    for n in 1..KEYS_COUNTED_AT_MOST {
        counter.count(&f.db.db, "acme", &format!("reaped-{n}")).await;
    }
    let (held_at_the_bound, written_at_the_bound) = (counter.pending(), attempts("first").await);
    counter.count(&f.db.db, "acme", "last").await;
    let (held_past_the_bound, written_past_the_bound) = (counter.pending(), attempts("first").await);
    counter.flush(&f.db.db).await.unwrap();

    assert_eq!(
        (held_at_the_bound, written_at_the_bound),
        (KEYS_COUNTED_AT_MOST, 1),
        "counts wait in memory up to the bound"
    );
    assert_eq!(
        (held_past_the_bound, written_past_the_bound),
        (1, 2),
        "one key more writes what waits first"
    );
    assert_eq!(
        (attempts("first").await, attempts("last").await),
        (2, 2),
        "no count is lost"
    );
}

/// A takeover in a transaction of its own, as an attempt makes it.
async fn take_over(
    db: &platform::Db,
    operation: &idempotency::OperationRecord,
    token: &str,
    locked_until: Timestamp,
    now: Timestamp,
) -> Result<Option<idempotency::OperationRecord>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let taken = store::take_over(&mut tx, operation, token, locked_until, now).await?;
    tx.commit().await?;
    Ok(taken)
}

//! Claiming a key, replaying its answer, refusing a changed request, and
//! rolling back an effect that failed.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::http::StatusCode;
use futures::future::join_all;
use idempotency::{
    ClaimMode, Effect, Fingerprint, Idempotency, IdempotencyConfig, IdempotencyKey, OperationState,
    store::{self, NewOperation},
};
use platform::{ApiError, Backend, Timestamp};
use serde_json::json;

use crate::support::*;

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

/// Only the key's own unique violation means "taken": another one is an error,
/// never read as a duplicate to answer.
async fn a_claim_that_breaks_another_unique_key_is_an_error_not_a_taken_key(backend: Backend) {
    let f = fixture(backend).await;
    let until = Timestamp::now().plus(Duration::from_secs(30));
    let first = f.claim("k", &json!({"n": 1}), until).await.unwrap();
    let key = IdempotencyKey::parse("another-key").unwrap();
    let fingerprint = Fingerprint::of("POST", ROUTE, "acme", &json!({"n": 2})).unwrap();
    let new = NewOperation {
        operation_id: first.operation_id.clone(),
        ..new_operation(&key, &fingerprint, until)
    };

    let mut tx = f.db.db.begin().await.unwrap();
    let claimed = store::claim(&mut tx, &new).await;
    tx.rollback().await.unwrap();

    let error = claimed.expect_err("an operation id already used is not a taken key");
    assert!(platform::db::is_unique_violation(&error), "{error}");
    assert!(
        store::find_by_key(&f.db.db, "acme", "another-key")
            .await
            .unwrap()
            .is_none()
    );
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
    )
    .with_sink(journal::Journal::default());
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

/// A service that adopts the core alone gives its layer no sink: nothing it
/// writes waits for a journal that will never read it, in either claim mode.
async fn a_layer_with_no_journal_leaves_nothing_in_the_journals_inbox(backend: Backend) {
    let mut f = fixture(backend).await;
    let runs = AtomicUsize::new(0);
    for claim in [ClaimMode::InTransaction, ClaimMode::Leased] {
        let config = IdempotencyConfig {
            claim,
            ..IdempotencyConfig::default()
        };
        f.idempotency = Idempotency::new(f.db.db.clone(), config);
        let key = format!("alone-{claim:?}");
        assert_eq!(f.run(&key, json!({"n": 1}), &runs).await.0, StatusCode::CREATED);
        assert_eq!(f.run(&key, json!({"n": 1}), &runs).await.0, StatusCode::CREATED);
        f.idempotency.flush_journal().await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each key ran once");
    let inbox: i64 = platform::on_pool!(f.db.db.read(), |pool| sqlx::query_scalar(
        "SELECT COUNT(*) FROM audit_inbox"
    )
    .fetch_one(pool)
    .await
    .unwrap());
    assert_eq!(inbox, 0, "no row waits for a journal");
}

/// A route whose policy asks for an approval on a layer that has no gate is
/// a server error that claims nothing and runs nothing: once the service
/// takes its gate, a retry starts afresh.
async fn an_approval_asked_of_a_layer_without_a_gate_is_a_server_error_that_claims_nothing(backend: Backend) {
    let f = fixture(backend).await;
    let asked = f.attempt("k").approval(Some("a human must look"));

    let answer = f
        .idempotency
        .execute(asked, &json!({"n": 1}), async |tx, _| {
            insert_effect(tx).await?;
            Ok(Effect::json(StatusCode::CREATED, &json!({})))
        })
        .await;

    assert_eq!(read(answer).await.0, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(store::find_by_key(&f.db.db, "acme", "k").await.unwrap().is_none());
    assert_eq!(f.effects().await, 0);
}

platform::both_backends!(
    a_layer_with_no_journal_leaves_nothing_in_the_journals_inbox,
    claiming_a_free_key_stores_a_running_operation_with_a_lease,
    claiming_a_taken_key_writes_nothing,
    a_claim_that_breaks_another_unique_key_is_an_error_not_a_taken_key,
    an_operation_runs_its_effect_once_and_replays_its_stored_answer,
    a_changed_command_under_the_same_key_is_422_and_runs_nothing,
    a_command_holding_an_integer_a_double_cannot_hold_is_400_naming_it_and_claims_nothing,
    a_server_error_in_the_effect_rolls_its_writes_back_and_frees_the_key,
    a_business_failure_rolls_its_writes_back_and_is_replayed,
    many_concurrent_attempts_with_one_key_commit_the_effect_once,
    an_approval_asked_of_a_layer_without_a_gate_is_a_server_error_that_claims_nothing,
);

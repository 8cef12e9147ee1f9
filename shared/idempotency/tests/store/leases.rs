//! Leases: a duplicate while one is held, takeovers once it runs out, and
//! what a waiting duplicate answers.

use std::{
    sync::{Arc, atomic::AtomicUsize},
    time::Duration,
};

use axum::http::StatusCode;
use futures::future::join_all;
use idempotency::{
    Attempt, ClaimMode, Effect, Idempotency, IdempotencyConfig, IdempotencyHeaders, IdempotencyKey, OperationState,
    store,
};
use platform::{ApiError, Backend, Timestamp};
use serde_json::json;
use tokio::sync::Notify;
use tracing::{Instrument, instrument::WithSubscriber};

use crate::support::*;

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

async fn an_effect_that_outlives_the_lease_is_rolled_back_and_frees_the_key(backend: Backend) {
    let mut f = fixture(backend).await;
    let config = IdempotencyConfig {
        lease: Duration::from_millis(300),
        ..IdempotencyConfig::default()
    };
    f.idempotency = Idempotency::new(f.db.db.clone(), config).with_sink(journal::Journal::default());
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
    f.idempotency = Idempotency::new(f.db.db.clone(), config).with_sink(journal::Journal::default());
    let (started, release) = (Notify::new(), Notify::new());
    // slow work under the lease (a call to another system), held until the test lets it go
    let slow_call = async |_: &idempotency::OperationIdentity<'_>| {
        started.notify_one();
        release.notified().await;
        Ok::<_, ApiError>(())
    };
    let effect = async |tx: &mut platform::Tx, _: &idempotency::OperationIdentity<'_>, (): ()| {
        insert_effect(tx).await?;
        Ok(Effect::json(StatusCode::CREATED, &json!({})))
    };
    let command = json!({"n": 1});

    let first = f
        .idempotency
        .execute_calling_out(f.attempt("k"), &command, slow_call, effect);
    let duplicate = async {
        started.notified().await;
        let never_called = async |_: &idempotency::OperationIdentity<'_>| -> Result<(), ApiError> {
            panic!("a duplicate that waits never runs the operation")
        };
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

/// Its work went to the outbox: `in_progress` with no lease, answered, and settled only when
/// that work ends. No retry may take it as a dead holder's, however its lease fields read.
async fn an_operation_whose_work_was_handed_on_is_never_taken_over(backend: Backend) {
    let f = fixture(backend).await;
    let claimed = f
        .claim("k", &json!({"n": 1}), Timestamp::now().minus(Duration::from_secs(1)))
        .await
        .unwrap();
    let response = idempotency::StoredResponse {
        status: StatusCode::ACCEPTED,
        content_type: "application/json".into(),
        location: None,
        body: b"{}".to_vec(),
    };
    let handed_on = store::Completion {
        state: OperationState::InProgress,
        response: &response,
        resource: None,
        external_ref: None,
        now: Timestamp::now(),
    };
    let mut tx = f.db.db.begin().await.unwrap();
    let token = claimed.lease_token.as_deref().unwrap();
    assert!(
        store::complete(&mut tx, "acme", &claimed.key, token, &handed_on)
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    let waiting = store::find_by_key(&f.db.db, "acme", "k").await.unwrap().unwrap();
    assert_eq!(
        (waiting.state, waiting.lease_token.as_deref()),
        (OperationState::InProgress, None)
    );

    let now = Timestamp::now();
    let taken = take_over(&f.db.db, &waiting, "thief", now.plus(Duration::from_secs(30)), now)
        .await
        .unwrap();

    assert!(
        taken.is_none(),
        "handed-on work is settled by the outbox, never run again"
    );
    // a duplicate that read the operation while its lease had run out, before it was handed on
    let read_before = take_over(&f.db.db, &claimed, "late", now.plus(Duration::from_secs(30)), now)
        .await
        .unwrap();
    assert!(
        read_before.is_none(),
        "what a duplicate read before the hand-off takes nothing"
    );
    let stored = store::find_by_key(&f.db.db, "acme", "k").await.unwrap().unwrap();
    assert_eq!(stored.lease_token, None);
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
    let taken = store::hold(&mut tx, operation, token, locked_until, now).await?;
    tx.commit().await?;
    Ok(taken)
}

platform::both_backends!(
    an_effect_that_outlives_the_lease_is_rolled_back_and_frees_the_key,
    a_waiting_duplicate_answers_by_its_deadline_even_when_the_holder_s_lease_runs_out_meanwhile,
    a_duplicate_that_waits_through_many_polls_names_its_operation_once_in_its_log_line,
    a_duplicate_is_409_while_another_attempt_holds_the_lease,
    of_many_racing_takers_of_an_expired_lease_exactly_one_wins,
    a_lease_that_has_not_run_out_cannot_be_taken_over,
    an_attempt_that_lost_its_lease_cannot_complete_the_operation,
    an_operation_whose_work_was_handed_on_is_never_taken_over,
);

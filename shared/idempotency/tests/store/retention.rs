//! Retention and the journal: the reaper, the chain under two processes,
//! and attempt counts.

use std::{
    sync::{Arc, atomic::AtomicUsize},
    time::Duration,
};

use axum::http::StatusCode;
use futures::future::join_all;
use idempotency::{
    ClaimMode, Fingerprint, Idempotency, IdempotencyConfig, IdempotencyKey,
    attempts::{AttemptCounter, KEYS_COUNTED_AT_MOST},
    store,
    transitions::AuditEvent,
};
use platform::{Backend, Timestamp, on_pool};
use serde_json::json;

use crate::support::*;

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

    let entries = journal::entries(&f.db.db, 0, 100).await.unwrap();
    let events: Vec<(Option<&str>, AuditEvent)> = entries
        .iter()
        .map(|e| (e.idempotency_key.as_deref(), e.event))
        .collect();
    assert_eq!(events, [(Some("finished-old"), AuditEvent::Completed)]);
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
    let other = Arc::new(
        Idempotency::new(
            platform::Db::connect(&f.db.url, 4).await.unwrap(),
            IdempotencyConfig {
                claim: ClaimMode::Leased,
                ..IdempotencyConfig::default()
            },
        )
        .with_sink(journal::Journal::default()),
    );
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
    let entries = journal::entries(&f.db.db, 0, 1000).await.unwrap();
    let verified = journal::verify(&entries, None).expect("one chain that verifies");
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
    let runs = AtomicUsize::new(0);
    f.run("before", json!({"n": 0}), &runs).await;
    f.idempotency.flush_journal().await;

    let (first, claimed) = claim_finished(&f, "rolled-back").await;
    assert!(claimed);
    first.rollback().await.unwrap();
    let (second, claimed) = claim_finished(&f, "committed").await;
    assert!(claimed);
    second.commit().await.unwrap();
    f.idempotency.flush_journal().await;

    let entries = journal::entries(&f.db.db, 0, 100).await.unwrap();
    assert_eq!(journal::verify(&entries, None).map(|v| v.entries), Ok(2));
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

/// A finished claim of a key already taken writes nothing, its journal record
/// included, and its transaction rolls back cleanly.
async fn a_finished_claim_of_a_taken_key_writes_nothing_not_even_its_journal_record(backend: Backend) {
    let f = fixture(backend).await;
    let (first, claimed) = claim_finished(&f, "k").await;
    assert!(claimed);
    first.commit().await.unwrap();

    let (second, claimed) = claim_finished(&f, "k").await;
    assert!(!claimed, "the key was taken");
    second.rollback().await.unwrap();
    f.idempotency.flush_journal().await;

    let entries = journal::entries(&f.db.db, 0, 100).await.unwrap();
    assert_eq!(journal::verify(&entries, None).map(|v| v.entries), Ok(1));
    assert_eq!(
        entries[0].event,
        AuditEvent::Failed,
        "the first claim's entry, and only it"
    );
}

/// A finished claim of `key`, its answer a 422, with the journal as its sink, in
/// a transaction left open: the transaction, and whether the key was claimed.
async fn claim_finished(f: &Fixture, key: &str) -> (platform::Tx, bool) {
    let answer = idempotency::StoredResponse {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        content_type: "application/problem+json".into(),
        location: None,
        body: b"{}".to_vec(),
    };
    let key = IdempotencyKey::parse(key).unwrap();
    let fingerprint = Fingerprint::of("POST", ROUTE, "acme", &json!({"n": 1})).unwrap();
    let new = new_operation(&key, &fingerprint, Timestamp::now());
    let started = Timestamp::now();
    let mut tx = f.db.db.begin().await.unwrap();
    let journal = journal::Journal::default();
    let claimed = store::claim_finished(&mut tx, &new, &store::Completion::failed(&answer), started, &journal)
        .await
        .unwrap();
    (tx, claimed)
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

    let entries = journal::entries(&f.db.db, 0, 100).await.unwrap();
    let events: Vec<AuditEvent> = entries.iter().map(|e| e.event).collect();
    assert_eq!(events, [AuditEvent::Completed, AuditEvent::Replayed]);
}

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

platform::both_backends!(
    the_reaper_removes_finished_operations_past_retention_and_never_running_or_unknown_ones,
    the_reaper_never_takes_an_operations_journal_entries_with_it,
    two_processes_creating_replaying_and_chaining_on_one_database_keep_one_unbroken_chain,
    a_claim_that_rolled_back_journals_nothing_and_the_next_claim_links_onto_the_chain,
    a_finished_claim_of_a_taken_key_writes_nothing_not_even_its_journal_record,
    a_journal_round_whose_caller_went_away_still_links_what_it_took,
    attempt_counts_wait_in_memory_for_a_bounded_number_of_keys_and_past_it_are_written_first,
);

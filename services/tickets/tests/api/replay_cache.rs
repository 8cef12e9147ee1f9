//! The replay cache (docs/design.md §4): each process answers a retry it
//! remembers from memory, with no query, until it sees its database go away
//! (that half is `database_gone.rs`, on PostgreSQL); with
//! `RETRYSAFE_REPLAY_CACHE=0` the database decides every retry.
//!
//! The tests take an operation's rows away behind the service's back, as a
//! failover to a standby that lacked them would: what answers the retry then
//! shows whether memory or the database decided it.

use idempotency::IdempotencyConfig;
use platform::{Backend, on_pool};

use crate::support::*;

/// Deletes the ticket and the operation `created` answered for, straight
/// from the database.
async fn take_rows_away(app: &TestApp, created: &TestResponse) {
    let (ticket_id, operation_id) = (created.str("id"), created.operation_id().to_owned());
    on_pool!(app.db.db.write(), |pool| {
        sqlx::query("DELETE FROM tickets WHERE id = $1")
            .bind(&ticket_id)
            .execute(pool)
            .await
            .unwrap();
        sqlx::query("DELETE FROM idempotency_operations WHERE operation_id = $1")
            .bind(&operation_id)
            .execute(pool)
            .await
            .unwrap();
    });
}

async fn a_replica_that_saw_no_outage_answers_a_retry_it_remembers_from_memory(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let first = app.create_ticket("remembered", ROTATE_CERT).await;
    assert_eq!(first.status, 201);
    take_rows_away(&app, &first).await;

    let retry = app.create_ticket("remembered", ROTATE_CERT).await;

    assert_eq!(retry.replayed(), Some("true"), "memory answered, not the database");
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.operation_id(), first.operation_id());
}

async fn with_no_replay_cache_the_database_decides_every_retry(backend: Backend) {
    let config = IdempotencyConfig {
        replay_cache_entries: 0,
        ..IdempotencyConfig::default()
    };
    let app = TestApp::spawn_with(backend, config).await;
    let first = app.create_ticket("not-remembered", ROTATE_CERT).await;
    assert_eq!(first.status, 201);
    take_rows_away(&app, &first).await;

    let retry = app.create_ticket("not-remembered", ROTATE_CERT).await;

    assert_eq!(retry.status, 201);
    assert_eq!(retry.replayed(), Some("false"), "the database has no such operation");
    assert_ne!(retry.operation_id(), first.operation_id());
    assert_eq!(app.ticket_count().await, 1);
}

platform::both_backends!(
    a_replica_that_saw_no_outage_answers_a_retry_it_remembers_from_memory,
    with_no_replay_cache_the_database_decides_every_retry,
);

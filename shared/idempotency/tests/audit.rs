//! The audit journal: a hash chain that verifies, that concurrent writers
//! cannot fork, and that the database refuses to change — on both backends.

use std::sync::Arc;

use futures::future::join_all;
use idempotency::audit::{self, AuditEvent, Record, verify};
use platform::{Backend, on_pool, testing::TestDb};

async fn journal(backend: Backend) -> TestDb {
    let db = TestDb::new(backend).await;
    db.db
        .migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS])
        .await
        .unwrap();
    db
}

fn record(event: AuditEvent, operation_id: &str) -> Record<'_> {
    Record {
        account_id: "acme",
        principal_id: "acme-agent",
        operation_id: Some(operation_id),
        idempotency_key: Some("key-1"),
        fingerprint: Some("47e978280e3d7237bb05e4813696c25d3052e82abe735d4f35ac1c37b3365e77"),
        route: Some("/v1/tickets"),
        event: Some(event),
        external_ref: None,
    }
}

async fn appended_entries_form_a_chain_that_verifies(backend: Backend) {
    let db = journal(backend).await;
    for event in [
        AuditEvent::Attempted,
        AuditEvent::Claimed,
        AuditEvent::Completed,
        AuditEvent::Replayed,
    ] {
        audit::append_now(&db.db, &record(event, "op_1")).await.unwrap();
    }

    let entries = audit::entries(&db.db, 0, 100).await.unwrap();

    assert_eq!(entries.len(), 4);
    assert_eq!(entries[0].prev_hash, audit::GENESIS);
    assert_eq!(entries[1].prev_hash, entries[0].hash);
    assert_eq!(verify(&entries), Ok(4));
}

async fn a_changed_or_missing_entry_is_named_by_verification(backend: Backend) {
    let db = journal(backend).await;
    for n in 0..5 {
        audit::append_now(&db.db, &record(AuditEvent::Attempted, &format!("op_{n}")))
            .await
            .unwrap();
    }
    let entries = audit::entries(&db.db, 0, 100).await.unwrap();

    let mut edited = entries.clone();
    edited[2].event = AuditEvent::Failed;
    assert_eq!(
        verify(&edited).unwrap_err().seq,
        3,
        "the edited entry no longer hashes to its hash"
    );

    let mut missing = entries.clone();
    missing.remove(1);
    assert_eq!(verify(&missing).unwrap_err().seq, 3, "the entry after the gap is named");
}

async fn concurrent_writers_never_fork_the_chain(backend: Backend) {
    let db = Arc::new(journal(backend).await);
    let writers = join_all((0..32).map(|n| {
        let db = db.clone();
        tokio::spawn(async move {
            let operation_id = format!("op_{n}");
            for event in [AuditEvent::Attempted, AuditEvent::Claimed, AuditEvent::Completed] {
                audit::append_now(&db.db, &record(event, &operation_id)).await.unwrap();
            }
        })
    }))
    .await;
    for writer in writers {
        writer.unwrap();
    }

    let entries = audit::entries(&db.db, 0, 1000).await.unwrap();

    assert_eq!(entries.len(), 96);
    assert_eq!(
        verify(&entries),
        Ok(96),
        "one chain, every entry linked to the one before"
    );
}

async fn the_database_refuses_to_update_delete_or_truncate_the_journal(backend: Backend) {
    let db = journal(backend).await;
    audit::append_now(&db.db, &record(AuditEvent::Attempted, "op_1"))
        .await
        .unwrap();

    let update = on_pool!(db.db.write(), |pool| sqlx::query(
        "UPDATE audit_journal SET event = 'failed'"
    )
    .execute(pool)
    .await
    .map(|r| r.rows_affected()));
    let delete = on_pool!(db.db.write(), |pool| sqlx::query("DELETE FROM audit_journal")
        .execute(pool)
        .await
        .map(|r| r.rows_affected()));

    assert!(update.unwrap_err().to_string().contains("append-only"));
    assert!(delete.unwrap_err().to_string().contains("append-only"));
    if backend == Backend::Postgres {
        let truncate = on_pool!(db.db.write(), |pool| sqlx::query("TRUNCATE audit_journal")
            .execute(pool)
            .await
            .map(|r| r.rows_affected()));
        assert!(truncate.unwrap_err().to_string().contains("append-only"));
    }
    assert_eq!(
        verify(&audit::entries(&db.db, 0, 10).await.unwrap()),
        Ok(1),
        "the entry is untouched"
    );
}

async fn a_second_successor_of_one_entry_is_refused_by_the_database(backend: Backend) {
    let db = journal(backend).await;
    let first = audit::append_now(&db.db, &record(AuditEvent::Attempted, "op_1"))
        .await
        .unwrap();
    audit::append_now(&db.db, &record(AuditEvent::Claimed, "op_1"))
        .await
        .unwrap();

    // a writer that skipped the lock and linked to the same predecessor
    let fork = on_pool!(db.db.write(), |pool| sqlx::query(
        "INSERT INTO audit_journal (seq, account_id, principal_id, event, at, prev_hash, hash) \
         VALUES (99, 'acme', 'mallory', 'completed', $1, $2, $3)"
    )
    .bind(first.at)
    .bind(&first.hash)
    .bind("f".repeat(64))
    .execute(pool)
    .await
    .map(|r| r.rows_affected()));

    assert!(platform::db::is_unique_violation(&fork.unwrap_err()));
}

async fn an_exported_journal_verifies_offline_and_a_tampered_line_is_named(backend: Backend) {
    let db = journal(backend).await;
    for n in 0..3 {
        audit::append_now(&db.db, &record(AuditEvent::Completed, &format!("op_{n}")))
            .await
            .unwrap();
    }
    assert_eq!(audit::verify_database(&db.db).await.unwrap(), Ok(3));
    let exported = audit::to_json_lines(&audit::entries(&db.db, 0, 100).await.unwrap());

    let read_back = audit::from_json_lines(&exported).unwrap();
    let tampered = exported.replacen(
        "\"principal_id\":\"acme-agent\"",
        "\"principal_id\":\"acme-approver\"",
        1,
    );

    assert_eq!(verify(&read_back), Ok(3));
    assert_eq!(verify(&audit::from_json_lines(&tampered).unwrap()).unwrap_err().seq, 1);
}

platform::both_backends!(
    an_exported_journal_verifies_offline_and_a_tampered_line_is_named,
    appended_entries_form_a_chain_that_verifies,
    a_changed_or_missing_entry_is_named_by_verification,
    concurrent_writers_never_fork_the_chain,
    the_database_refuses_to_update_delete_or_truncate_the_journal,
    a_second_successor_of_one_entry_is_refused_by_the_database,
);

//! The audit journal: a hash chain that verifies, that concurrent writers
//! cannot fork, and that the database refuses to change — on both backends.

use std::sync::Arc;

use futures::future::join_all;
use idempotency::audit::{self, AuditEvent, ChainBreak, Head, Record, verify};
use platform::{Backend, Timestamp, on_pool, testing::TestDb};

async fn journal(backend: Backend) -> TestDb {
    let db = TestDb::new(backend).await;
    db.db
        .migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS])
        .await
        .unwrap();
    db
}

fn record(event: AuditEvent, operation_id: &str) -> [Record; 1] {
    [Record {
        account_id: "acme".into(),
        principal_id: "acme-agent".into(),
        operation_id: Some(operation_id.into()),
        idempotency_key: Some("key-1".into()),
        fingerprint: Some("47e978280e3d7237bb05e4813696c25d3052e82abe735d4f35ac1c37b3365e77".into()),
        route: Some("/v1/tickets".into()),
        event,
        external_ref: None,
        at: Timestamp::now(),
    }]
}

/// How many entries a chain holds, if it verifies with no pinned head.
fn holds(entries: &[audit::AuditEntry]) -> Result<u64, ChainBreak> {
    verify(entries, None).map(|v| v.entries)
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
    assert_eq!(holds(&entries), Ok(4));
}

/// A round after an outage may link thousands of entries at once, more than
/// one statement carries; they still go in as one unbroken chain, in order.
async fn a_round_of_thousands_of_entries_links_them_all_in_order(backend: Backend) {
    let db = journal(backend).await;
    let journal = audit::Journal::default();
    let waiting = 4_500;
    journal.observe((0..waiting).flat_map(|n| record(AuditEvent::Replayed, &format!("op_{n}"))));

    assert_eq!(journal.chain_pending(&db.db).await.unwrap(), waiting);

    let entries = audit::entries(&db.db, 0, 10_000).await.unwrap();
    assert_eq!(holds(&entries), Ok(waiting as u64));
    let operations: Vec<String> = entries.iter().filter_map(|e| e.operation_id.clone()).collect();
    let observed: Vec<String> = (0..waiting).map(|n| format!("op_{n}")).collect();
    assert_eq!(operations, observed);
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
        holds(&edited).unwrap_err().seq,
        3,
        "the edited entry no longer hashes to its hash"
    );

    let mut missing = entries.clone();
    missing.remove(1);
    assert_eq!(holds(&missing).unwrap_err().seq, 3, "the entry after the gap is named");
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
        holds(&entries),
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
        holds(&audit::entries(&db.db, 0, 10).await.unwrap()),
        Ok(1),
        "the entry is untouched"
    );
}

async fn an_entry_that_does_not_link_onto_the_entry_before_it_is_refused_by_the_database(backend: Backend) {
    let db = journal(backend).await;
    let first = audit::append_now(&db.db, &record(AuditEvent::Attempted, "op_1"))
        .await
        .unwrap()
        .remove(0);
    let second = audit::append_now(&db.db, &record(AuditEvent::Claimed, "op_1"))
        .await
        .unwrap()
        .remove(0);
    // a writer that skipped the lock: (seq, prev_hash) of each entry it tries
    let insert = async |seq: i64, prev_hash: &str| {
        on_pool!(db.db.write(), |pool| sqlx::query(
            "INSERT INTO audit_journal (seq, account_id, principal_id, event, at, prev_hash, hash) \
             VALUES ($1, 'acme', 'mallory', 'completed', $2, $3, $4)"
        )
        .bind(seq)
        .bind(first.at)
        .bind(prev_hash)
        .bind("f".repeat(64))
        .execute(pool)
        .await
        .map(|r| r.rows_affected()))
    };

    let fork_at_the_next_seq = insert(3, &first.hash).await;
    let fork_at_a_taken_seq = insert(2, &first.hash).await;
    let gap = insert(4, &second.hash).await;
    let new_genesis = insert(3, audit::GENESIS).await;

    assert!(
        fork_at_the_next_seq
            .unwrap_err()
            .to_string()
            .contains("must link onto the entry before it")
    );
    assert!(platform::db::is_unique_violation(&fork_at_a_taken_seq.unwrap_err()));
    assert!(
        gap.unwrap_err()
            .to_string()
            .contains("must link onto the entry before it")
    );
    assert!(
        new_genesis
            .unwrap_err()
            .to_string()
            .contains("must link onto the entry before it")
    );
    assert_eq!(
        insert(3, &second.hash).await.unwrap(),
        1,
        "the entry that follows is taken"
    );
}

async fn an_exported_journal_verifies_offline_and_a_tampered_line_is_named(backend: Backend) {
    let db = journal(backend).await;
    for n in 0..3 {
        audit::append_now(&db.db, &record(AuditEvent::Completed, &format!("op_{n}")))
            .await
            .unwrap();
    }
    assert_eq!(holds(&audit::all_entries(&db.db).await.unwrap()), Ok(3));
    let exported = audit::to_json_lines(&audit::entries(&db.db, 0, 100).await.unwrap());

    let read_back = audit::from_json_lines(&exported).unwrap();
    let tampered = exported.replacen(
        "\"principal_id\":\"acme-agent\"",
        "\"principal_id\":\"acme-approver\"",
        1,
    );

    assert_eq!(holds(&read_back), Ok(3));
    assert_eq!(holds(&audit::from_json_lines(&tampered).unwrap()).unwrap_err().seq, 1);
}

async fn every_tampered_copy_of_an_exported_journal_is_caught(backend: Backend) {
    let db = journal(backend).await;
    for n in 0..6 {
        audit::append_now(&db.db, &record(AuditEvent::Completed, &format!("op_{n}")))
            .await
            .unwrap();
    }
    let exported = audit::to_json_lines(&audit::all_entries(&db.db).await.unwrap());
    let original = audit::from_json_lines(&exported).unwrap();
    let head = verify(&original, None).unwrap().head.expect("a head");
    assert_eq!(head.seq, 6);
    let pinned: Head = head.to_string().parse().unwrap();
    assert_eq!(verify(&original, Some(&pinned)).map(|v| v.entries), Ok(6));

    let mut changed_field = original.clone();
    changed_field[3].operation_id = Some("op_forged".into());
    let mut removed_middle = original.clone();
    removed_middle.remove(2);
    let mut cut_tail = original.clone();
    cut_tail.truncate(4);
    // a tail cut and the chain re-hashed from the cut: consistent in itself
    let mut rewritten = original[..4].to_vec();
    let mut forged = rewritten[3].clone();
    forged.seq = 5;
    forged.prev_hash = rewritten[3].hash.clone();
    forged.hash = forged.computed_hash();
    let mut forged_next = forged.clone();
    forged_next.seq = 6;
    forged_next.prev_hash = forged.hash.clone();
    forged_next.hash = forged_next.computed_hash();
    rewritten.extend([forged, forged_next]);

    let caught = |entries: &[audit::AuditEntry]| verify(entries, Some(&pinned)).unwrap_err().seq;
    assert_eq!(caught(&changed_field), 4, "the changed entry is named");
    assert_eq!(caught(&removed_middle), 4, "the entry after the hole is named");
    assert_eq!(caught(&cut_tail), 6, "a cut tail is caught below the pinned head");
    assert!(
        verify(&cut_tail, None).is_ok(),
        "without a pin a cut tail looks whole: pin the head"
    );
    assert_eq!(
        caught(&rewritten),
        6,
        "a rewritten tail does not end in the pinned head"
    );
}

platform::both_backends!(
    every_tampered_copy_of_an_exported_journal_is_caught,
    an_exported_journal_verifies_offline_and_a_tampered_line_is_named,
    appended_entries_form_a_chain_that_verifies,
    a_round_of_thousands_of_entries_links_them_all_in_order,
    a_changed_or_missing_entry_is_named_by_verification,
    concurrent_writers_never_fork_the_chain,
    the_database_refuses_to_update_delete_or_truncate_the_journal,
    an_entry_that_does_not_link_onto_the_entry_before_it_is_refused_by_the_database,
);

/// PostgreSQL checks a statement's entries all at once, in a query the
/// planner plans (SQLite's row trigger reads the one entry before by its
/// rowid, with nothing to plan). Written as a join, the planner could hash
/// the whole journal to check one round, and did while its statistics lagged
/// behind the journal. The check must look each entry's predecessor up by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rounds_link_check_looks_up_the_entries_before_by_key_instead_of_reading_the_whole_journal() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = journal(Backend::Postgres).await;
    let platform::db::Pool::Postgres(pool) = db.db.write() else {
        unreachable!("a PostgreSQL database")
    };
    // entries $1..=$2, each linked onto the one before (seq 1 onto the genesis
    // hash); the hashes are stand-ins, which the database does not recompute
    let append = "INSERT INTO audit_journal (seq, account_id, principal_id, event, at, prev_hash, hash) \
         SELECT s, 'acme', 'acme-agent', 'completed', now(), \
                CASE WHEN s = 1 THEN $3 ELSE lpad(to_hex(s - 1), 64, '0') END, lpad(to_hex(s), 64, '0') \
         FROM generate_series($1::bigint, $2::bigint) AS s";
    let genesis = audit::GENESIS;
    sqlx::query(append)
        .bind(1_i64)
        .bind(5_000_i64)
        .bind(genesis)
        .execute(pool)
        .await
        .unwrap();
    // reads of the table by this connection, the trigger's included, not yet reported
    let reads = "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relname = 'audit_journal'";
    let mut tx = pool.begin().await.unwrap();
    let before: (i64, i64) = sqlx::query_as(reads).fetch_one(&mut *tx).await.unwrap();
    let appended = sqlx::query(append)
        .bind(5_001_i64)
        .bind(5_500_i64)
        .bind(genesis)
        .execute(&mut *tx)
        .await
        .unwrap()
        .rows_affected();
    let after: (i64, i64) = sqlx::query_as(reads).fetch_one(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let (seq_scans, index_scans) = (after.0 - before.0, after.1 - before.1);

    assert_eq!(appended, 500);
    assert_eq!(seq_scans, 0, "the check read the journal from the start");
    assert!(index_scans >= 500, "one probe per appended entry: {index_scans}");
}

/// PostgreSQL's inbox is a queue: every create puts records in, every round
/// deletes them, and each round's read scans every dead row left behind until
/// a VACUUM. The journal vacuums it itself, every few thousand records, so
/// the read stays small whether autovacuum runs or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_journal_vacuums_the_inbox_it_empties_every_few_thousand_records() {
    if !platform::testing::backend_available(Backend::Postgres).await {
        return;
    }
    let db = journal(Backend::Postgres).await;
    let vacuums = async || -> i64 {
        on_pool!(db.db.read(), |pool| sqlx::query_scalar(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'audit_inbox'"
        )
        .fetch_one(pool)
        .await
        .unwrap())
    };
    let journal = audit::Journal::default();
    let before = vacuums().await;
    let mut recorded = 0;
    for batch in 0..6 {
        let mut tx = db.db.begin().await.unwrap();
        let records: Vec<Record> = (0..1_000)
            .flat_map(|n| record(AuditEvent::Claimed, &format!("op_{batch}_{n}")))
            .collect();
        audit::record(&mut tx, &records).await.unwrap();
        tx.commit().await.unwrap();
        recorded += records.len();
        assert_eq!(journal.chain_pending(&db.db).await.unwrap(), 1_000);
    }

    assert_eq!(recorded, 6_000);
    assert_eq!(
        vacuums().await - before,
        1,
        "one vacuum after 5,000 deleted records, none before"
    );
    assert_eq!(holds(&audit::entries(&db.db, 0, 10_000).await.unwrap()), Ok(6_000));
    let options: Vec<String> = on_pool!(db.db.read(), |pool| sqlx::query_scalar(
        "SELECT unnest(reloptions) FROM pg_class WHERE relname = 'audit_inbox'"
    )
    .fetch_all(pool)
    .await
    .unwrap());
    assert!(
        options.contains(&"vacuum_truncate=false".to_owned()),
        "a vacuum that shrank the inbox would lock every create out meanwhile: {options:?}"
    );
}

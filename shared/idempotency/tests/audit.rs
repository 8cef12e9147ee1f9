//! The audit journal: a hash chain that verifies, that concurrent writers
//! cannot fork, and that the database refuses to change — on both backends.

use std::sync::Arc;

use futures::future::join_all;
use idempotency::audit::{self, AuditEntry, AuditEvent, ChainBreak, Head, Record, verify};
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
        attempt: None,
        change: None,
        evidence: None,
    }]
}

/// Appends `records` the one way anything reaches the chain: recorded in the
/// inbox, in a transaction of their own, then linked by a round of a journal
/// of its own, as another process's would be. Returns the whole chain.
async fn append(db: &TestDb, records: &[Record]) -> Vec<AuditEntry> {
    let mut tx = db.db.begin().await.unwrap();
    audit::record(&mut tx, records).await.unwrap();
    tx.commit().await.unwrap();
    audit::Journal::default()
        .chain_pending(&db.db, &platform::metrics::Metrics::new("test"))
        .await
        .unwrap();
    audit::all_entries(&db.db).await.unwrap()
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
        append(&db, &record(event, "op_1")).await;
    }

    let entries = audit::entries(&db.db, 0, 100).await.unwrap();

    assert_eq!(entries.len(), 4);
    assert_eq!(entries[0].prev_hash, audit::GENESIS);
    assert_eq!(entries[1].prev_hash, entries[0].hash);
    assert_eq!(holds(&entries), Ok(4));
}

/// After an outage thousands of entries may wait, more than one statement
/// carries and more than one round takes; they still go in as one unbroken
/// chain, in the order they were observed.
async fn thousands_of_waiting_entries_are_linked_in_rounds_as_one_chain_in_order(backend: Backend) {
    let db = journal(backend).await;
    let journal = audit::Journal::default();
    let waiting = 12_500;
    for n in 0..waiting {
        let [replayed] = record(AuditEvent::Replayed, &format!("op_{n}"));
        journal.observe(&db.db, replayed).await;
    }

    assert_eq!(
        journal
            .chain_pending(&db.db, &platform::metrics::Metrics::new("test"))
            .await
            .unwrap(),
        waiting
    );

    let entries = audit::all_entries(&db.db).await.unwrap();
    assert_eq!(holds(&entries), Ok(waiting as u64));
    let operations: Vec<String> = entries.iter().filter_map(|e| e.operation_id.clone()).collect();
    let observed: Vec<String> = (0..waiting).map(|n| format!("op_{n}")).collect();
    assert_eq!(operations, observed);
}

async fn a_changed_or_missing_entry_is_named_by_verification(backend: Backend) {
    let db = journal(backend).await;
    for n in 0..5 {
        append(&db, &record(AuditEvent::Attempted, &format!("op_{n}"))).await;
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

/// Observations are not starved by a busy inbox: with more transitions
/// recorded before every round than a round takes, every round full, an
/// observation is linked once the rounds have taken what waited when it was
/// first passed over — after the transition it saw.
async fn observations_are_linked_after_what_they_saw_while_the_inbox_stays_full(backend: Backend) {
    let db = journal(backend).await;
    let journal = audit::Journal::default();
    let metrics = platform::metrics::Metrics::new("test");
    let round_size = 5_000;
    let transitions = async |first: usize| {
        let records: Vec<Record> = (first..first + round_size)
            .flat_map(|n| record(AuditEvent::Completed, &format!("op_{n}")))
            .collect();
        let mut tx = db.db.begin().await.unwrap();
        audit::record(&mut tx, &records).await.unwrap();
        tx.commit().await.unwrap();
    };
    transitions(0).await;
    let [replayed] = record(AuditEvent::Replayed, "op_0");
    journal.observe(&db.db, replayed).await;

    let mut rounds = Vec::new();
    // the first full round passes the observation over, the second links it
    for n in 1..=2 {
        transitions(n * round_size).await;
        rounds.push(journal.chain_round(&db.db, &metrics).await.unwrap());
    }

    let entries = audit::all_entries(&db.db).await.unwrap();
    assert!(
        rounds.iter().all(|round| round.full),
        "every round was full: {rounds:?}"
    );
    let of_op_0: Vec<AuditEvent> = entries
        .iter()
        .filter(|e| e.operation_id.as_deref() == Some("op_0"))
        .map(|e| e.event)
        .collect();
    assert_eq!(of_op_0, [AuditEvent::Completed, AuditEvent::Replayed]);
    assert_eq!(journal.queued(), 0);
    assert_eq!(holds(&entries), Ok(entries.len() as u64));
}

/// An observation never goes into the chain before the transition it saw,
/// even when more transitions wait than one round takes.
async fn an_observation_is_never_linked_before_the_transition_it_saw(backend: Backend) {
    let db = journal(backend).await;
    let waiting: Vec<Record> = (0..5_001)
        .flat_map(|n| record(AuditEvent::Completed, &format!("op_{n}")))
        .collect();
    let mut tx = db.db.begin().await.unwrap();
    audit::record(&mut tx, &waiting).await.unwrap();
    tx.commit().await.unwrap();
    let journal = audit::Journal::default();
    let [replayed] = record(AuditEvent::Replayed, "op_5000");
    journal.observe(&db.db, replayed).await;

    assert_eq!(
        journal
            .chain_pending(&db.db, &platform::metrics::Metrics::new("test"))
            .await
            .unwrap(),
        5_002
    );

    let entries = audit::all_entries(&db.db).await.unwrap();
    let last: Vec<AuditEvent> = entries
        .iter()
        .filter(|e| e.operation_id.as_deref() == Some("op_5000"))
        .map(|e| e.event)
        .collect();
    assert_eq!(last, [AuditEvent::Completed, AuditEvent::Replayed]);
    assert_eq!(holds(&entries), Ok(5_002));
}

/// The attempt number an entry carries is covered by its hash.
async fn an_entrys_attempt_number_is_covered_by_its_hash(backend: Backend) {
    let db = journal(backend).await;
    let [completed] = record(AuditEvent::Completed, "op_1");

    let entries = append(&db, &[completed.by_attempt(1)]).await;

    assert_eq!(entries[0].attempt, Some(1));
    assert_eq!(holds(&entries), Ok(1));
    let mut edited = entries.clone();
    edited[0].attempt = Some(2);
    assert_eq!(holds(&edited).unwrap_err().seq, 1);
}

/// Thirty-two writers, each with its own journal's rounds as separate
/// processes would have, link onto one chain.
async fn concurrent_writers_and_rounds_never_fork_the_chain(backend: Backend) {
    let db = Arc::new(journal(backend).await);
    let writers = join_all((0..32).map(|n| {
        let db = db.clone();
        tokio::spawn(async move {
            let operation_id = format!("op_{n}");
            for event in [AuditEvent::Attempted, AuditEvent::Claimed, AuditEvent::Completed] {
                append(&db, &record(event, &operation_id)).await;
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
    append(&db, &record(AuditEvent::Attempted, "op_1")).await;

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
    let first = append(&db, &record(AuditEvent::Attempted, "op_1")).await.pop().unwrap();
    let second = append(&db, &record(AuditEvent::Claimed, "op_1")).await.pop().unwrap();
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
    let taken = fork_at_a_taken_seq.unwrap_err();
    assert!(
        platform::db::is_unique_violation(&taken) || taken.to_string().contains("never replaced"),
        "{taken}"
    );
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
        append(&db, &record(AuditEvent::Completed, &format!("op_{n}"))).await;
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
        append(&db, &record(AuditEvent::Completed, &format!("op_{n}"))).await;
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
    thousands_of_waiting_entries_are_linked_in_rounds_as_one_chain_in_order,
    a_changed_or_missing_entry_is_named_by_verification,
    concurrent_writers_and_rounds_never_fork_the_chain,
    an_entrys_attempt_number_is_covered_by_its_hash,
    an_observation_is_never_linked_before_the_transition_it_saw,
    the_database_refuses_to_update_delete_or_truncate_the_journal,
    an_entry_that_does_not_link_onto_the_entry_before_it_is_refused_by_the_database,
    the_database_refuses_an_insert_that_would_replace_an_entry,
    an_entry_changed_inserted_or_moved_behind_the_triggers_back_is_named_by_verification,
    a_tail_cut_behind_the_triggers_back_is_caught_only_against_a_pinned_head,
    observations_never_outgrow_their_bound_while_the_chain_is_held_and_each_is_journaled_once,
    a_chainer_refuses_to_link_onto_a_journal_cut_under_it_until_its_tail_is_restored,
    observations_are_linked_after_what_they_saw_while_the_inbox_stays_full,
);

/// Runs `sql` on the journal's database, each statement on its own.
async fn run(db: &TestDb, sql: &[&str]) -> Result<(), sqlx::Error> {
    for statement in sql {
        on_pool!(db.db.write(), |pool| {
            sqlx::raw_sql(sqlx::AssertSqlSafe(*statement)).execute(pool).await?;
        });
    }
    Ok(())
}

/// Inserts `entry` as it is, columns and all, with `verb` (`INSERT`,
/// `INSERT OR REPLACE`, `REPLACE`) and an optional conflict clause.
async fn insert_as_is(
    db: &TestDb,
    verb: &str,
    entry: &audit::AuditEntry,
    on_conflict: &str,
) -> Result<u64, sqlx::Error> {
    let sql = format!(
        "{verb} INTO audit_journal (seq, account_id, principal_id, operation_id, idempotency_key, fingerprint, \
         route, event, external_ref, at, prev_hash, hash) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
         {on_conflict}"
    );
    Ok(on_pool!(db.db.write(), |pool| sqlx::query(sqlx::AssertSqlSafe(
        sql.as_str()
    ))
    .bind(entry.seq)
    .bind(&entry.account_id)
    .bind(&entry.principal_id)
    .bind(entry.operation_id.as_deref())
    .bind(entry.idempotency_key.as_deref())
    .bind(entry.fingerprint.as_deref())
    .bind(entry.route.as_deref())
    .bind(entry.event.as_str())
    .bind(entry.external_ref.as_deref())
    .bind(entry.at)
    .bind(&entry.prev_hash)
    .bind(&entry.hash)
    .execute(pool)
    .await?
    .rows_affected()))
}

/// `entry` rewritten as `mallory` would: another event, hashed again so it
/// holds in itself.
fn forged(entry: &audit::AuditEntry, seq: i64, prev_hash: &str) -> audit::AuditEntry {
    let mut forged = entry.clone();
    forged.seq = seq;
    forged.principal_id = "mallory".into();
    forged.event = AuditEvent::Approved;
    forged.prev_hash = prev_hash.to_owned();
    forged.hash = forged.computed_hash();
    forged
}

/// SQLite's REPLACE deletes the entry it conflicts with without firing the
/// delete trigger, and an upsert rewrites one in place: the database refuses
/// both, so the newest entry cannot be swapped for a forged one that links
/// onto the entry before it and verifies.
async fn the_database_refuses_an_insert_that_would_replace_an_entry(backend: Backend) {
    let db = journal(backend).await;
    for n in 0..2 {
        append(&db, &record(AuditEvent::Completed, &format!("op_{n}"))).await;
    }
    let before = audit::all_entries(&db.db).await.unwrap();
    let replacement = forged(&before[1], 2, &before[0].hash);

    let mut refused = vec![
        insert_as_is(
            &db,
            "INSERT",
            &replacement,
            "ON CONFLICT (seq) DO UPDATE SET principal_id = excluded.principal_id, event = excluded.event, \
             hash = excluded.hash",
        )
        .await,
    ];
    if backend == Backend::Sqlite {
        refused.push(insert_as_is(&db, "INSERT OR REPLACE", &replacement, "").await);
        refused.push(insert_as_is(&db, "REPLACE", &replacement, "").await);
    }

    for attempt in refused {
        let error = attempt.expect_err("an entry is never replaced");
        assert!(error.to_string().contains("append-only"), "{error}");
    }
    assert_eq!(
        audit::all_entries(&db.db).await.unwrap(),
        before,
        "the journal is untouched"
    );
}

/// A journal of six entries whose append-only triggers are gone, as someone
/// with the rights to change the schema would leave it, and its head, pinned
/// before the triggers went.
async fn journal_without_its_guards(backend: Backend) -> (TestDb, Vec<audit::AuditEntry>, Head) {
    let db = journal(backend).await;
    for n in 0..6 {
        append(&db, &record(AuditEvent::Completed, &format!("op_{n}"))).await;
    }
    let entries = audit::all_entries(&db.db).await.unwrap();
    let pinned = audit::head(&db.db).await.unwrap();
    unguard(&db).await;
    (db, entries, pinned)
}

/// Drops the journal's append-only triggers.
async fn unguard(db: &TestDb) {
    let unguard: &[&str] = match db.db.backend() {
        Backend::Postgres => &["ALTER TABLE audit_journal DISABLE TRIGGER USER"],
        Backend::Sqlite => &[
            "DROP TRIGGER audit_journal_no_update",
            "DROP TRIGGER audit_journal_no_delete",
            "DROP TRIGGER audit_journal_no_replace",
            "DROP TRIGGER audit_journal_links_onto_the_entry_before",
        ],
    };
    run(db, unguard).await.unwrap();
}

/// What the database can no longer refuse once its triggers are dropped, a
/// verification of the database still names: the first entry that was
/// changed, inserted or moved.
async fn an_entry_changed_inserted_or_moved_behind_the_triggers_back_is_named_by_verification(backend: Backend) {
    let broken_at = async |tamper: &[&str]| {
        let (db, _, pinned) = journal_without_its_guards(backend).await;
        run(&db, tamper).await.unwrap();
        let entries = audit::all_entries(&db.db).await.unwrap();
        assert_eq!(
            verify(&entries, Some(&pinned)).unwrap_err().seq,
            holds(&entries).unwrap_err().seq,
            "the same entry is named with or without a pin"
        );
        holds(&entries).unwrap_err().seq
    };
    let modified = broken_at(&["UPDATE audit_journal SET principal_id = 'mallory' WHERE seq = 3"]).await;
    let reordered = broken_at(&[
        "UPDATE audit_journal SET seq = -seq WHERE seq IN (3, 4)",
        "UPDATE audit_journal SET seq = 7 + seq WHERE seq < 0",
    ])
    .await;

    let (db, entries, _) = journal_without_its_guards(backend).await;
    // entries 3… move up one, and a forged entry that links onto entry 2 takes seq 3
    run(
        &db,
        &[
            "UPDATE audit_journal SET seq = -seq WHERE seq >= 3",
            "UPDATE audit_journal SET seq = 1 - seq WHERE seq < 0",
        ],
    )
    .await
    .unwrap();
    insert_as_is(&db, "INSERT", &forged(&entries[1], 3, &entries[1].hash), "")
        .await
        .unwrap();
    let inserted = holds(&audit::all_entries(&db.db).await.unwrap()).unwrap_err();

    assert_eq!(modified, 3, "the changed entry no longer hashes to its hash");
    assert_eq!(reordered, 3, "the first of the swapped pair does not link onto entry 2");
    assert_eq!(
        (inserted.seq, inserted.reason),
        (4, "its prev_hash is not the hash of the entry before it"),
        "the entry after the forged one no longer links onto it"
    );
}

/// A cut tail leaves a chain that holds in itself: only the pinned head,
/// published by the service, shows that entries are gone. The `audit` tool
/// reads the database and says so.
async fn a_tail_cut_behind_the_triggers_back_is_caught_only_against_a_pinned_head(backend: Backend) {
    let (db, _, pinned) = journal_without_its_guards(backend).await;
    run(&db, &["DELETE FROM audit_journal WHERE seq > 4"]).await.unwrap();
    let entries = audit::all_entries(&db.db).await.unwrap();
    let audit_tool = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_audit"))
            .args(["verify", "--database-url", &db.url])
            .args(args)
            .output()
            .expect("the audit tool runs");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string())
    };

    let cut = verify(&entries, Some(&pinned)).unwrap_err();
    let (unpinned_ok, _) = audit_tool(&[]);
    let (pinned_ok, said) = audit_tool(&["--pin", &pinned.to_string()]);

    assert_eq!(holds(&entries), Ok(4), "without a pin the cut chain holds");
    assert_eq!(cut.seq, 6, "the pinned entry is named");
    assert!(cut.reason.contains("tail was cut"), "{cut}");
    assert!(unpinned_ok);
    assert!(!pinned_ok && said.contains("entry 6") && said.contains("cut"), "{said}");
}

/// The hash here is computed outside this code, from the formula alone:
/// `sha256(prev_hash ‖ RFC 8785 JSON of every field but hash)`, the fields an
/// entry lacks (`attempt`, the resource) left out. A verifier written from
/// docs/contract.md §8 agrees with this one. (No database: the same on both
/// backends.)
#[test]
fn an_entry_hashed_by_the_published_formula_verifies() {
    let line = r#"{"seq":1,"account_id":"acme","principal_id":"acme-agent","operation_id":"op_1","idempotency_key":"key-1","fingerprint":null,"route":"/v1/tickets","event":"completed","external_ref":null,"at":"2026-12-01T09:30:00.000000Z","prev_hash":"0000000000000000000000000000000000000000000000000000000000000000","hash":"f5b9292f95ff433ebc0a1b0bbc03ba67b6374ce128faac3e7519711666c47ea3"}"#;

    let entries = audit::from_json_lines(line).unwrap();

    assert_eq!(holds(&entries), Ok(1));
    assert_eq!(entries[0].state, None);
}

/// The chain held from outside, as a stalled round of another process
/// would hold it. On PostgreSQL another session takes the chain's advisory
/// lock: rounds wait for it, and inbox writes go on. On SQLite a round and an
/// inbox write need the same one writer, so a held chain is a held writer:
/// another connection's `BEGIN IMMEDIATE`, which every write waits for.
enum HeldChain {
    Postgres(sqlx::PgConnection),
    Sqlite(sqlx::SqliteConnection),
}

impl HeldChain {
    async fn hold(db: &TestDb) -> HeldChain {
        use sqlx::Connection;
        match db.db.backend() {
            Backend::Postgres => {
                let mut session = sqlx::PgConnection::connect(&db.url).await.unwrap();
                sqlx::query("SELECT pg_advisory_lock($1)")
                    .bind(audit::CHAIN_LOCK)
                    .execute(&mut session)
                    .await
                    .unwrap();
                HeldChain::Postgres(session)
            }
            Backend::Sqlite => {
                let mut writer = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
                sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut writer).await.unwrap();
                HeldChain::Sqlite(writer)
            }
        }
    }

    async fn release(self) {
        use sqlx::Connection;
        match self {
            HeldChain::Postgres(session) => session.close().await.unwrap(),
            HeldChain::Sqlite(mut writer) => {
                sqlx::raw_sql("COMMIT").execute(&mut writer).await.unwrap();
                writer.close().await.unwrap();
            }
        }
    }
}

/// A process holds a bounded number of observations. While the chain is
/// held from outside and a flood of replays comes in, what does not fit is
/// written to the inbox (PostgreSQL), or its producers wait for the writer
/// the chain is held by (SQLite) — never dropped, never more held. Once the
/// chain is free every replay is journaled exactly once, in one chain that
/// verifies.
async fn observations_never_outgrow_their_bound_while_the_chain_is_held_and_each_is_journaled_once(backend: Backend) {
    let db = Arc::new(journal(backend).await);
    let journal = audit::Journal::default();
    let held = HeldChain::hold(&db).await;
    // the chainer goes on trying meanwhile, as a service's does
    let chainer = tokio::spawn({
        let (journal, db) = (journal.clone(), db.clone());
        async move {
            journal
                .chain_continuously(&db.db, &platform::metrics::Metrics::new("test"))
                .await
        }
    });
    let (producers, per_producer) = (4, 25_000);
    let producing = join_all((0..producers).map(|p| {
        let (journal, db) = (journal.clone(), db.clone());
        tokio::spawn(async move {
            let mut most = 0;
            for n in 0..per_producer {
                let [replayed] = record(AuditEvent::Replayed, &format!("op_{p}_{n}"));
                journal.observe(&db.db, replayed).await;
                most = most.max(journal.queued());
            }
            most
        })
    }));
    let (most_held, linked_while_held) = match held {
        HeldChain::Postgres(_) => {
            let most_held = producing.await.into_iter().map(Result::unwrap).max();
            let linked_while_held = audit::all_entries(&db.db).await.unwrap().len();
            held.release().await;
            (most_held, linked_while_held)
        }
        HeldChain::Sqlite(_) => {
            // the producers fill what the process may hold, then wait for the writer
            while journal.queued() < audit::OBSERVATIONS_HELD_AT_MOST {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            let linked_while_held = audit::all_entries(&db.db).await.unwrap().len();
            held.release().await;
            let most_held = producing.await.into_iter().map(Result::unwrap).max();
            (most_held, linked_while_held)
        }
    };
    chainer.abort();
    journal
        .chain_pending(&db.db, &platform::metrics::Metrics::new("test"))
        .await
        .unwrap();

    let entries = audit::all_entries(&db.db).await.unwrap();
    let most_held = most_held.unwrap();
    assert!(
        most_held <= audit::OBSERVATIONS_HELD_AT_MOST,
        "{most_held} observations held, more than {}",
        audit::OBSERVATIONS_HELD_AT_MOST
    );
    assert_eq!(linked_while_held, 0, "nothing was linked while the chain was held");
    let replayed: std::collections::HashSet<&str> = entries
        .iter()
        .filter(|e| e.event == AuditEvent::Replayed)
        .filter_map(|e| e.operation_id.as_deref())
        .collect();
    assert_eq!(entries.len(), producers * per_producer, "each replay once");
    assert_eq!(replayed.len(), producers * per_producer, "every replay");
    assert_eq!(holds(&entries), Ok((producers * per_producer) as u64));
    assert_eq!(journal.queued(), 0);
}

/// A running chainer remembers the entry it last linked. A journal cut under
/// it (its guards dropped, its tail deleted) is refused: nothing is linked,
/// no entry number is taken again, the refusal is counted, and what waits
/// keeps waiting. Once the tail is restored, linking goes on from it.
async fn a_chainer_refuses_to_link_onto_a_journal_cut_under_it_until_its_tail_is_restored(backend: Backend) {
    let db = journal(backend).await;
    let journal = audit::Journal::default();
    let metrics = platform::metrics::Metrics::new("test");
    for n in 0..6 {
        let mut tx = db.db.begin().await.unwrap();
        audit::record(&mut tx, &record(AuditEvent::Completed, &format!("op_{n}")))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        journal.chain_pending(&db.db, &metrics).await.unwrap();
    }
    let linked = audit::all_entries(&db.db).await.unwrap();
    let pinned = audit::head(&db.db).await.unwrap();
    unguard(&db).await;
    run(&db, &["DELETE FROM audit_journal WHERE seq > 4"]).await.unwrap();

    let mut tx = db.db.begin().await.unwrap();
    audit::record(&mut tx, &record(AuditEvent::Completed, "op_after_the_cut"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let refused = journal.chain_pending(&db.db, &metrics).await;
    let after_the_cut = audit::all_entries(&db.db).await.unwrap();
    let waiting = on_pool!(db.db.read(), |pool| sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM audit_inbox"
    )
    .fetch_one(pool)
    .await
    .unwrap());

    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(after_the_cut, linked[..4], "no entry number is taken again");
    assert_eq!(waiting, 1, "the new transition waits in the inbox");
    let counted = metrics
        .render()
        .lines()
        .find(|line| line.starts_with("retrysafe_journal_head_behind_total"))
        .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(counted.is_some_and(|n| n >= 1.0), "{}", metrics.render());

    // the operator restores the tail; the chainer links onto it again
    for entry in &linked[4..] {
        insert_as_is(&db, "INSERT", entry, "").await.unwrap();
    }
    journal.chain_pending(&db.db, &metrics).await.unwrap();
    let restored = audit::all_entries(&db.db).await.unwrap();
    assert_eq!(verify(&restored, Some(&pinned)).map(|v| v.entries), Ok(7));
    assert_eq!(restored[6].operation_id.as_deref(), Some("op_after_the_cut"));
}

/// An exported entry carries nothing its hash does not cover: a line with an
/// added member (`extra`, a made-up `amount`) is refused, naming its entry
/// and the member, though every member the hash covers is unchanged. (No
/// database: the same on both backends.)
#[test]
fn an_exported_entry_with_a_member_no_hash_covers_is_refused() {
    let line = r#"{"seq":1,"account_id":"acme","principal_id":"acme-agent","operation_id":"op_1","idempotency_key":"key-1","fingerprint":null,"route":"/v1/tickets","event":"completed","external_ref":null,"at":"2026-12-01T09:30:00.000000Z","prev_hash":"0000000000000000000000000000000000000000000000000000000000000000","hash":"f5b9292f95ff433ebc0a1b0bbc03ba67b6374ce128faac3e7519711666c47ea3"}"#;
    assert_eq!(holds(&audit::from_json_lines(line).unwrap()), Ok(1));

    for (member, added) in [("extra", r#","extra":"x"}"#), ("amount", r#","amount":100000}"#)] {
        let refused = audit::from_json_lines(&line.replacen('}', added, 1));
        let said = refused.expect_err("a member no hash covers is refused");
        assert!(
            said.contains("entry 1") && said.contains(&format!("`{member}`")),
            "{said}"
        );
    }
}

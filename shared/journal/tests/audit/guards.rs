//! What the database refuses, and what verification names when its guards
//! are taken away.

use journal::{self as audit, AuditEvent, Head, verify};
use platform::{Backend, on_pool, testing::TestDb};

use crate::support::*;

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

/// Runs `sql` on the journal's database, each statement on its own.
pub async fn run(db: &TestDb, sql: &[&str]) -> Result<(), sqlx::Error> {
    for statement in sql {
        on_pool!(db.db.write(), |pool| {
            sqlx::raw_sql(sqlx::AssertSqlSafe(*statement)).execute(pool).await?;
        });
    }
    Ok(())
}

/// Inserts `entry` as it is, columns and all, with `verb` (`INSERT`,
/// `INSERT OR REPLACE`, `REPLACE`) and an optional conflict clause.
pub async fn insert_as_is(
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
    .bind(entry.event.into_str())
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
pub async fn unguard(db: &TestDb) {
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

platform::both_backends!(
    the_database_refuses_to_update_delete_or_truncate_the_journal,
    an_entry_that_does_not_link_onto_the_entry_before_it_is_refused_by_the_database,
    the_database_refuses_an_insert_that_would_replace_an_entry,
    an_entry_changed_inserted_or_moved_behind_the_triggers_back_is_named_by_verification,
    a_tail_cut_behind_the_triggers_back_is_caught_only_against_a_pinned_head,
);

//! Entries that form one chain, linked in rounds, that verifies, online and
//! exported.

use std::sync::Arc;

use futures::future::join_all;
use journal::{self as audit, AuditEvent, Head, Record, verify};
use platform::Backend;
use sha2::{Digest, Sha256};

use crate::support::*;

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

/// Every field set, in text canonical JSON must escape and sort with care: the
/// hash the published formula gives with the reference RFC 8785
/// implementation (`serde_json_canonicalizer`, not this crate's) is the one
/// this code verifies, so chains hashed before and after verify alike. (No
/// database: the same on both backends.)
#[test]
fn an_entry_with_every_field_set_hashes_as_the_reference_canonical_json_gives() {
    let mut entry = serde_json::json!({
        "seq": 1,
        "account_id": "acme",
        "principal_id": "acme-admin",
        "operation_id": "op_1",
        "idempotency_key": "key \"1\" / \u{2028} é \u{1f600} \u{fb33}",
        "fingerprint": "ab".repeat(32),
        "route": "/v1/payments/{payment_id}/captures",
        "event": "resolved",
        "external_ref": "pi_1",
        "at": "2026-12-01T09:30:00.000000Z",
        "attempt": 3,
        "resource_type": "payment",
        "resource_id": "pay_1",
        "state": "succeeded",
        "evidence": "the provider's statement,\tline 2",
        "prev_hash": audit::GENESIS,
    });
    let reference = serde_json_canonicalizer::to_vec(&entry).expect("the reference writes any value");
    let hash = Sha256::new()
        .chain_update(audit::GENESIS)
        .chain_update(reference)
        .finalize();
    entry["hash"] = hex::encode(hash).into();

    let entries = audit::from_json_lines(&entry.to_string()).unwrap();

    assert_eq!(holds(&entries), Ok(1));
    assert_eq!(entries[0].attempt, Some(3));
}

/// Canonical JSON writes every number as a double, so past 2^53 − 1 two
/// sequence numbers or attempts would hash alike: an exported entry holding
/// one is refused, naming its member, where one at the bound reads. (No
/// database: the same on both backends.)
#[test]
fn an_exported_entry_with_an_integer_canonical_json_cannot_hold_exactly_is_refused() {
    let line = r#"{"seq":1,"account_id":"acme","principal_id":"acme-agent","operation_id":"op_1","idempotency_key":"key-1","fingerprint":null,"route":"/v1/tickets","event":"completed","external_ref":null,"at":"2026-12-01T09:30:00.000000Z","prev_hash":"0000000000000000000000000000000000000000000000000000000000000000","hash":"f5b9292f95ff433ebc0a1b0bbc03ba67b6374ce128faac3e7519711666c47ea3"}"#;
    let at_the_bound = line.replacen(r#""seq":1"#, r#""seq":9007199254740991"#, 1);
    assert!(audit::from_json_lines(&at_the_bound).is_ok());

    for (member, past_the_bound) in [
        ("seq", line.replacen(r#""seq":1"#, r#""seq":9007199254740992"#, 1)),
        ("attempt", line.replacen('}', r#","attempt":-9007199254740992}"#, 1)),
    ] {
        let said = audit::from_json_lines(&past_the_bound).expect_err("an inexact integer is refused");
        assert!(
            said.contains(&format!("`{member}` must be at most 9007199254740991")),
            "{said}"
        );
    }
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

platform::both_backends!(
    every_tampered_copy_of_an_exported_journal_is_caught,
    an_exported_journal_verifies_offline_and_a_tampered_line_is_named,
    appended_entries_form_a_chain_that_verifies,
    thousands_of_waiting_entries_are_linked_in_rounds_as_one_chain_in_order,
    a_changed_or_missing_entry_is_named_by_verification,
    concurrent_writers_and_rounds_never_fork_the_chain,
    an_entrys_attempt_number_is_covered_by_its_hash,
    an_observation_is_never_linked_before_the_transition_it_saw,
    observations_are_linked_after_what_they_saw_while_the_inbox_stays_full,
);

//! The `audit` command line, as an operator runs it: export a database's
//! journal, verify it and pin its head, and catch a tampered copy.

use std::process::Command;

use journal::{self as audit, AuditEvent, Record};
use platform::{Backend, Timestamp, testing::TestDb};

fn audit_tool(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_audit"))
        .args(args)
        .output()
        .expect("the audit tool runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

async fn the_audit_tool_exports_verifies_pins_and_names_the_first_broken_entry(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.db
        .migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS])
        .await
        .unwrap();
    let mut tx = db.db.begin().await.unwrap();
    for n in 0..5 {
        let record = Record {
            account_id: "acme".into(),
            principal_id: "acme-agent".into(),
            operation_id: Some(format!("op_{n}")),
            idempotency_key: Some(format!("key-{n}")),
            fingerprint: None,
            route: Some("/v1/tickets".into()),
            event: AuditEvent::Completed,
            external_ref: None,
            at: Timestamp::now(),
            attempt: None,
            change: None,
            evidence: None,
        };
        audit::record(&mut tx, &[record]).await.unwrap();
    }
    tx.commit().await.unwrap();
    audit::Journal::default()
        .chain_pending(&db.db, &platform::metrics::Metrics::new("test"))
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("audit-tool-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();

    let (exported, lines) = audit_tool(&["export", "--database-url", &db.url]);
    assert!(exported, "{lines}");
    assert_eq!(lines.lines().count(), 5);
    let (verified, report) = audit_tool(&["verify", "--database-url", &db.url]);
    assert!(verified, "{report}");
    let head = report
        .lines()
        .find_map(|l| l.strip_prefix("head "))
        .expect("the head is printed")
        .to_owned();
    assert!(head.starts_with("5:"), "{head}");

    let file = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().to_string()
    };
    let whole = file("whole.jsonl", &lines);
    let all: Vec<&str> = lines.lines().collect();
    let changed = file("changed.jsonl", &lines.replacen("\"op_2\"", "\"op_9\"", 1));
    let removed = file(
        "removed.jsonl",
        &format!("{}\n{}\n{}\n{}\n", all[0], all[1], all[3], all[4]),
    );
    let cut = file("cut.jsonl", &format!("{}\n{}\n{}\n", all[0], all[1], all[2]));
    // a member the hash does not cover, on entry 3: every hashed member is as it was
    let unhashed = file(
        "unhashed.jsonl",
        &format!(
            "{}\n{}\n{},\"amount\":100000}}\n{}\n{}\n",
            all[0],
            all[1],
            &all[2][..all[2].len() - 1],
            all[3],
            all[4]
        ),
    );

    assert!(audit_tool(&["verify", "--file", &whole, "--pin", &head]).0);
    let (ok, said) = audit_tool(&["verify", "--file", &changed, "--pin", &head]);
    assert!(!ok && said.contains("entry 3"), "{said}");
    let (ok, said) = audit_tool(&["verify", "--file", &removed, "--pin", &head]);
    assert!(!ok && said.contains("entry 4"), "{said}");
    let (ok, said) = audit_tool(&["verify", "--file", &cut, "--pin", &head]);
    assert!(!ok && said.contains("entry 5") && said.contains("cut"), "{said}");
    let (ok, said) = audit_tool(&["verify", "--file", &unhashed, "--pin", &head]);
    assert!(!ok && said.contains("entry 3") && said.contains("`amount`"), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}

platform::both_backends!(the_audit_tool_exports_verifies_pins_and_names_the_first_broken_entry);

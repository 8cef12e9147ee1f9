//! A journal's database, and how a test writes to it.

use journal::{self as audit, AuditEntry, AuditEvent, ChainBreak, Record, verify};
use platform::{Backend, Timestamp, testing::TestDb};

pub async fn journal(backend: Backend) -> TestDb {
    let db = TestDb::new(backend).await;
    db.db
        .migrate(&[&platform::MIGRATIONS, &idempotency::MIGRATIONS])
        .await
        .unwrap();
    db
}

pub fn record(event: AuditEvent, operation_id: &str) -> [Record; 1] {
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
pub async fn append(db: &TestDb, records: &[Record]) -> Vec<AuditEntry> {
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
pub fn holds(entries: &[audit::AuditEntry]) -> Result<u64, ChainBreak> {
    verify(entries, None).map(|v| v.entries)
}

//! A chain held from outside: observations stay bounded, and a chainer
//! never links onto a journal cut under it.

use std::sync::Arc;

use futures::future::join_all;
use journal::{self as audit, AuditEvent, verify};
use platform::{Backend, on_pool, testing::TestDb};

use crate::{
    guards::{insert_as_is, run, unguard},
    support::*,
};

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

platform::both_backends!(
    observations_never_outgrow_their_bound_while_the_chain_is_held_and_each_is_journaled_once,
    a_chainer_refuses_to_link_onto_a_journal_cut_under_it_until_its_tail_is_restored,
);

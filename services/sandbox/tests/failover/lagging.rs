//! The article's hazard, told as a story: a timeout is not a failure, and
//! an acknowledged answer is only as durable as the database that gave it.
//!
//! 1. A standby follows the primary; then the path between them goes quiet
//!    (the test cuts the replication's forwarder), and the standby lags.
//! 2. An agent creates tickets and captures payments, each under its own key.
//! 3. The primary dies with SIGKILL; the standby is promoted; the services'
//!    address moves to it.
//! 4. The agent retries every key, with the same key and body, as it must.
//!
//! **Asynchronous standby:** every write was acknowledged at once, and every
//! capture charged at the provider. The standby never had those claims, so
//! each retry finds its key unclaimed and runs again: a ticket under an id
//! the agent was never told, and a second charge, because the capture's new
//! operation sends the provider a new idempotency key it cannot recognise.
//!
//! **Synchronous standby:** no write was acknowledged: each commit waited for
//! the standby, so the agent's requests timed out, and nothing was sent to
//! the provider (the outbox's own take waits for the standby too). The
//! retries run each write once, on the promoted standby.

use std::time::Duration;

use platform::testing::{
    ACME_AGENT,
    standby::{ReplicatedPair, Replication},
};
use serde_json::json;

use super::world::{Service, Services, Write};

const TICKETS: usize = 6;
const CAPTURES: usize = 3;

/// The agent's writes: its tickets, then its captures.
async fn writes(services: &Services) -> Vec<Write> {
    let mut writes: Vec<Write> = (0..TICKETS)
        .map(|n| Write {
            service: Service::Tickets,
            path: "/v1/tickets".into(),
            bearer: ACME_AGENT,
            key: format!("ticket-{n}"),
            body: json!({"project": "ops", "title": format!("Alert {n}"), "priority": "high",
                         "source_event_id": format!("event-{n}")}),
        })
        .collect();
    for n in 0..CAPTURES {
        let intent_id = services.intent(ACME_AGENT, &format!("order-{n}")).await;
        writes.push(Write {
            service: Service::Payments,
            path: format!("/v1/payment_intents/{intent_id}/capture"),
            bearer: ACME_AGENT,
            key: format!("capture-{n}"),
            body: json!({}),
        });
    }
    writes
}

/// What the story ends with: how many acknowledged answers the failover
/// lost, how many tickets the agent's keys made, and how many charges.
struct Ending {
    acknowledged: usize,
    lost: usize,
    tickets: i64,
    charges: u64,
}

async fn the_story(replication: Replication) -> Option<Ending> {
    if !ReplicatedPair::can_start().await {
        return None;
    }
    let pair = ReplicatedPair::start(replication, &["tickets", "payments"]).await;
    let services = Services::start(&pair).await;
    let writes = writes(&services).await;
    pair.wait_until_caught_up().await;

    // 1. the standby falls behind
    pair.replication.cut().await;
    // 2. the agent writes; it gives up on an answer after two seconds
    let mut acknowledged = Vec::new();
    for write in &writes {
        if let Ok(answer) = tokio::time::timeout(Duration::from_secs(2), services.send(write)).await {
            assert!(answer.status.is_success(), "{}: {}", write.key, answer.status);
            acknowledged.push((write.key.clone(), answer));
        }
    }
    let charged_before = services
        .charges_settled_at(acknowledged.len() as u64 - TICKETS.min(acknowledged.len()) as u64)
        .await;
    // 3. the primary dies, the standby is promoted, the address moves
    pair.kill_primary();
    pair.promote_standby().await;
    services.database.point_at(pair.standby);
    // 4. every key again
    let mut lost = 0;
    for write in &writes {
        let retry = services.answered(write).await;
        assert!(retry.status.is_success(), "{}: {}", write.key, retry.status);
        if let Some((_, first)) = acknowledged.iter().find(|(key, _)| *key == write.key)
            && (retry.replayed() != Some("true") || retry.body != first.body)
        {
            lost += 1;
        }
    }
    let charges = services.charges_settled_at(CAPTURES as u64 + charged_before).await;
    let tickets = services.tickets.get("/v1/tickets?limit=200", ACME_AGENT).await.json()["data"]
        .as_array()
        .map_or(0, |listed| listed.len() as i64);
    services.journals_verify().await;
    Some(Ending {
        acknowledged: acknowledged.len(),
        lost,
        tickets,
        charges,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_a_lagging_asynchronous_standby_a_failover_loses_acknowledged_claims_and_the_retries_charge_twice() {
    let Some(ending) = the_story(Replication::Asynchronous).await else {
        return;
    };
    eprintln!(
        "asynchronous standby: {} of {} writes acknowledged, {} of them lost in the failover; {} tickets now, {} charges for {CAPTURES} orders",
        ending.acknowledged,
        TICKETS + CAPTURES,
        ending.lost,
        ending.tickets,
        ending.charges
    );
    assert_eq!(
        ending.acknowledged,
        TICKETS + CAPTURES,
        "an asynchronous primary acknowledges at once"
    );
    assert_eq!(ending.lost, ending.acknowledged, "the standby had none of them");
    assert_eq!(
        ending.charges,
        2 * CAPTURES as u64,
        "every order charged twice: the hazard"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_a_lagging_synchronous_standby_nothing_is_acknowledged_until_it_is_safe_and_every_write_happens_once() {
    let Some(ending) = the_story(Replication::Synchronous).await else {
        return;
    };
    eprintln!(
        "synchronous standby: {} of {} writes acknowledged before the failover, {} lost; {} tickets now, {} charges for {CAPTURES} orders",
        ending.acknowledged,
        TICKETS + CAPTURES,
        ending.lost,
        ending.tickets,
        ending.charges
    );
    assert_eq!(ending.lost, 0, "nothing acknowledged is lost");
    assert_eq!(ending.tickets, TICKETS as i64, "one ticket per key");
    assert_eq!(ending.charges, CAPTURES as u64, "one charge per order");
}

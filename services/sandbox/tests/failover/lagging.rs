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
//! the agent was never told, and a capture of its own. But the capture's new
//! operation sends the provider the key of the first — the key is derived
//! from what the agent sent, not from the operation — so the provider charges
//! nothing more: its body, reference included, is the first one's too, so
//! the provider answers with the first charge, and the capture run again
//! ends `succeeded` with it (docs/design.md §12).
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
/// lost, how many tickets the agent's keys made, how many charges, and how
/// many captures the retries sent the provider under another key than the
/// acknowledged first answer named, and how many of the captures the
/// retries answered with ended `succeeded` with a charge.
struct Ending {
    acknowledged: usize,
    lost: usize,
    tickets: i64,
    charges: u64,
    new_provider_keys: usize,
    captured: usize,
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
    let captures_acknowledged = acknowledged.len() as u64 - TICKETS.min(acknowledged.len()) as u64;
    services.charges_settled_at(captures_acknowledged).await;
    let sent_before = services.provider.stats().requests;
    // 3. the primary dies, the standby is promoted, the address moves
    pair.kill_primary();
    pair.promote_standby().await;
    services.database.point_at(pair.standby);
    // 4. every key again
    let (mut lost, mut new_provider_keys, mut ran_again) = (0, 0, 0);
    let mut captures = Vec::new();
    for write in &writes {
        let retry = services.answered(write).await;
        assert!(retry.status.is_success(), "{}: {}", write.key, retry.status);
        let replayed = retry.replayed() == Some("true");
        if write.service == Service::Payments {
            captures.push(retry.str("id"));
            if !replayed {
                ran_again += 1;
            }
        }
        let Some((_, first)) = acknowledged.iter().find(|(key, _)| *key == write.key) else {
            continue;
        };
        if !replayed || retry.body != first.body {
            lost += 1;
        }
        if write.service == Service::Payments
            && retry.json()["provider_idempotency_key"] != first.json()["provider_idempotency_key"]
        {
            new_provider_keys += 1;
        }
    }
    // every capture that ran again reaches the provider, charged or not
    services.provider_asked_at(sent_before + ran_again).await;
    let charges = services.provider.stats().charges_made;
    let mut captured = 0;
    for capture_id in &captures {
        let capture = services.capture_ended(capture_id).await;
        if capture["state"] == "succeeded" && capture["provider_charge_id"].is_string() {
            captured += 1;
        }
    }
    let tickets = services.tickets.get("/v1/tickets?limit=200", ACME_AGENT).await.json()["data"]
        .as_array()
        .map_or(0, |listed| listed.len() as i64);
    services.journals_verify().await;
    Some(Ending {
        acknowledged: acknowledged.len(),
        lost,
        tickets,
        charges,
        new_provider_keys,
        captured,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_a_lagging_asynchronous_standby_a_failover_loses_acknowledged_claims_but_the_retries_charge_each_order_once()
 {
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
        ending.tickets, TICKETS as i64,
        "made again, under ids the agent was never told"
    );
    assert_eq!(
        ending.new_provider_keys, 0,
        "each capture run again is sent under its first key"
    );
    assert_eq!(
        ending.charges, CAPTURES as u64,
        "the provider recognises each retry: one charge per order"
    );
    assert_eq!(
        ending.captured, CAPTURES,
        "each capture run again ends with the first charge, as the agent's answer flow expects"
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
    assert_eq!(ending.captured, CAPTURES, "every capture ends with its charge");
}

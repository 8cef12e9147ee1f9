//! A failover under a storm of writes: agents create tickets and capture
//! payments under many keys; the primary is killed in the middle; its
//! synchronous standby is promoted and the address moved to it; then every
//! agent retries every key it has, with the same key and body, as the
//! contract asks. Every answer a client received is still there: the retry
//! of an acknowledged key is a replay of the same bytes; there is one ticket
//! per key and per `source_event_id`, one charge per captured order at the
//! provider, and each journal verifies. Run with the kill at three moments.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::future::join_all;
use platform::testing::{
    ACME_AGENT, GLOBEX_AGENT,
    standby::{ReplicatedPair, Replication},
};
use serde_json::json;

use super::world::{Service, Services, Write};

const AGENTS: usize = 4;
const TICKETS_PER_AGENT: usize = 30;
const CAPTURES_PER_AGENT: usize = 6;

/// The payment intents the agents capture, made before the storm.
async fn intents(services: &Services) -> Vec<(&'static str, String)> {
    let mut made = Vec::new();
    for agent in 0..AGENTS {
        let bearer = agent_bearer(agent);
        for n in 0..CAPTURES_PER_AGENT {
            made.push((bearer, services.intent(bearer, &format!("order-{agent}-{n}")).await));
        }
    }
    made
}

fn agent_bearer(agent: usize) -> &'static str {
    if agent.is_multiple_of(2) {
        ACME_AGENT
    } else {
        GLOBEX_AGENT
    }
}

/// Each agent's writes: its tickets, with a capture after every fifth.
fn plan(intents: &[(&'static str, String)]) -> Vec<Vec<Write>> {
    (0..AGENTS)
        .map(|agent| {
            let bearer = agent_bearer(agent);
            let mut captures = intents
                .iter()
                .filter(|(owner, _)| *owner == bearer)
                .skip((agent / 2) * CAPTURES_PER_AGENT)
                .take(CAPTURES_PER_AGENT);
            let mut writes = Vec::new();
            for n in 0..TICKETS_PER_AGENT {
                writes.push(Write {
                    service: Service::Tickets,
                    path: "/v1/tickets".into(),
                    bearer,
                    key: format!("ticket-{agent}-{n}"),
                    body: json!({"project": "ops", "title": format!("Alert {agent}-{n}"), "priority": "high",
                                 "source_event_id": format!("event-{agent}-{n}")}),
                });
                if n % 5 == 4
                    && let Some((_, intent_id)) = captures.next()
                {
                    writes.push(Write {
                        service: Service::Payments,
                        path: format!("/v1/payment_intents/{intent_id}/capture"),
                        bearer,
                        key: format!("capture-{intent_id}"),
                        body: json!({}),
                    });
                }
            }
            writes
        })
        .collect()
}

/// The storm, the kill after `kill_after` acknowledged answers, the
/// promotion, and every key retried; then what must hold.
async fn failover_keeps_every_acknowledged_answer(kill_after: usize) {
    if !ReplicatedPair::can_start().await {
        return;
    }
    let pair = ReplicatedPair::start(Replication::Synchronous, &["tickets", "payments"]).await;
    let services = Arc::new(Services::start(&pair).await);
    let intents = intents(&services).await;
    let plans = plan(&intents);

    // the storm: every agent sends each of its writes once, whatever happens;
    // the one whose answer is the `kill_after`th kills the primary at once
    let pair = Arc::new(pair);
    let (acknowledged, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let killed = Arc::new(tokio::sync::Notify::new());
    let agents: Vec<_> = plans
        .iter()
        .cloned()
        .map(|writes| {
            let (services, pair, killed) = (services.clone(), pair.clone(), killed.clone());
            let (acknowledged, refused) = (acknowledged.clone(), refused.clone());
            tokio::spawn(async move {
                let mut answers = BTreeMap::new();
                for write in writes {
                    let answer = services.send(&write).await;
                    assert_ne!(
                        answer.status, 500,
                        "never a 500 while the database fails over: {}",
                        write.key
                    );
                    if answer.status == 503 {
                        assert!(answer.header("retry-after").is_some(), "a 503 says when to come back");
                        refused.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    answers.insert(write.key.clone(), answer);
                    if acknowledged.fetch_add(1, Ordering::SeqCst) + 1 == kill_after {
                        pair.kill_primary();
                        killed.notify_one();
                    }
                }
                answers
            })
        })
        .collect();
    // the standby is promoted a moment later, and the address moved to it
    killed.notified().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    pair.promote_standby().await;
    services.database.point_at(pair.standby);
    let mut received = BTreeMap::new();
    for agent in join_all(agents).await {
        received.extend(agent.expect("an agent ran to its end"));
    }

    // every agent retries every key it has
    let writes: Vec<Write> = plans.into_iter().flatten().collect();
    let retries = join_all(writes.iter().map(|write| services.answered(write))).await;
    let mut tickets_made = Vec::new();
    for (write, retry) in writes.iter().zip(&retries) {
        match received.get(&write.key) {
            Some(first) => {
                assert_eq!(
                    retry.replayed(),
                    Some("true"),
                    "the retry of acknowledged `{}` is a replay",
                    write.key
                );
                assert_eq!(retry.status, first.status, "`{}`", write.key);
                assert_eq!(
                    retry.body, first.body,
                    "the stored answer of `{}`, byte for byte",
                    write.key
                );
            }
            None => assert!(
                retry.status.as_u16() < 500,
                "`{}` is answered after the failover",
                write.key
            ),
        }
        if write.service == Service::Tickets {
            assert_eq!(
                retry.status,
                201,
                "`{}`: {}",
                write.key,
                String::from_utf8_lossy(&retry.body)
            );
            tickets_made.push(retry.str("id"));
        }
    }

    // one ticket per key, and each the one its key's answer names
    tickets_made.sort();
    tickets_made.dedup();
    assert_eq!(tickets_made.len(), AGENTS * TICKETS_PER_AGENT, "one ticket per key");
    let mut listed_in_all = 0;
    for bearer in [ACME_AGENT, GLOBEX_AGENT] {
        let listed = services.tickets.get("/v1/tickets?limit=200", bearer).await.json();
        let listed = listed["data"].as_array().expect("a list of tickets");
        listed_in_all += listed.len();
        for ticket in listed {
            assert!(
                tickets_made.contains(&ticket["id"].as_str().unwrap().to_owned()),
                "no ticket but those the answers name: {ticket}"
            );
        }
    }
    assert_eq!(listed_in_all, tickets_made.len(), "no second ticket under any key");

    // one charge per captured order, once the outbox has delivered every capture
    let captures = writes.iter().filter(|w| w.service == Service::Payments).count() as u64;
    assert_eq!(
        services.charges_settled_at(captures).await,
        captures,
        "one charge per capture"
    );
    services.journals_verify().await;
    eprintln!(
        "failover after {kill_after} acknowledged answers: {} writes, {} acknowledged in the storm, {} refused with 503, \
         {} replays checked byte for byte, {} tickets, {} charges",
        writes.len(),
        received.len(),
        refused.load(Ordering::SeqCst),
        received.len(),
        tickets_made.len(),
        services.provider.stats().charges_made
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_early_in_a_storm_loses_no_acknowledged_answer_and_makes_each_effect_once() {
    failover_keeps_every_acknowledged_answer(10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_in_the_middle_of_a_storm_loses_no_acknowledged_answer_and_makes_each_effect_once() {
    failover_keeps_every_acknowledged_answer(70).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_late_in_a_storm_loses_no_acknowledged_answer_and_makes_each_effect_once() {
    failover_keeps_every_acknowledged_answer(130).await;
}

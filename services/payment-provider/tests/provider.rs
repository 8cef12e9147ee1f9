//! The simulated provider over real HTTP: its own idempotency, its lookups,
//! each switchable fault, and the count of charges it really made.

use std::time::Duration;

use futures::future::join_all;
use payment_provider::{Faults, Provider};
use serde_json::{Value, json};

struct Running {
    url: String,
    provider: Provider,
    http: reqwest::Client,
}

async fn start() -> Running {
    start_with(Provider::default()).await
}

async fn start_with(provider: Provider) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = payment_provider::router(provider.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(800))
        .build()
        .unwrap();
    Running { url, provider, http }
}

impl Running {
    async fn charge(&self, key: &str, body: &Value) -> Result<(u16, Option<String>, Value), reqwest::Error> {
        let answer = self
            .http
            .post(format!("{}/v1/charges", self.url))
            .bearer_auth("sk_merchant_1")
            .header("idempotency-key", key)
            .json(body)
            .send()
            .await?;
        let status = answer.status().as_u16();
        let replayed = answer
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap().to_owned());
        Ok((status, replayed, answer.json().await?))
    }

    async fn lookup(&self, query: &str) -> Value {
        self.http
            .get(format!("{}/v1/charges?{query}", self.url))
            .bearer_auth("sk_merchant_1")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

fn capture(reference: &str, amount_minor: i64) -> Value {
    json!({"amount_minor": amount_minor, "currency": "EUR", "merchant_reference": reference})
}

#[tokio::test]
async fn the_same_key_and_body_is_one_charge_and_a_changed_body_charges_nothing() {
    let provider = start().await;

    let (first, replayed, charge) = provider.charge("cap_1", &capture("cap_1", 1250)).await.unwrap();
    let (again, replayed_again, same) = provider.charge("cap_1", &capture("cap_1", 1250)).await.unwrap();
    let (changed, _, problem) = provider.charge("cap_1", &capture("cap_1", 9999)).await.unwrap();
    let lowercase = json!({"amount_minor": 1250, "currency": "eur", "merchant_reference": "cap_1"});
    let (same_in_lowercase, _, _) = provider.charge("cap_1", &lowercase).await.unwrap();

    assert_eq!((first, replayed.as_deref()), (201, Some("false")));
    assert_eq!((again, replayed_again.as_deref()), (201, Some("true")));
    assert_eq!(same, charge, "the same charge, answered again");
    assert_eq!(
        (changed, problem["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );
    assert_eq!(
        same_in_lowercase, 201,
        "a currency code in lowercase is the same request"
    );
    assert_eq!(provider.provider.stats().charges_made, 1);
}

#[tokio::test]
async fn sixteen_racing_copies_of_one_charge_make_one_charge() {
    let provider = start().await;

    let body = capture("cap_race", 500);
    let copies = join_all((0..16).map(|_| provider.charge("cap_race", &body))).await;

    let ids: std::collections::HashSet<String> = copies
        .into_iter()
        .map(|c| c.unwrap().2["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(provider.provider.stats().charges_made, 1);
}

#[tokio::test]
async fn a_charge_is_found_by_its_key_and_by_its_merchant_reference_and_only_by_its_merchant() {
    let provider = start().await;
    let (_, _, charge) = provider.charge("key-a", &capture("cap_42", 700)).await.unwrap();

    let by_key = provider.lookup("idempotency_key=key-a").await;
    let by_reference = provider.lookup("merchant_reference=cap_42").await;
    let unknown = provider.lookup("idempotency_key=key-b").await;
    let other_merchant: Value = provider
        .http
        .get(format!("{}/v1/charges?idempotency_key=key-a", provider.url))
        .bearer_auth("sk_merchant_2")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    assert_eq!(by_key["data"][0], charge);
    assert_eq!(by_reference["data"][0], charge);
    assert_eq!(unknown["data"], json!([]));
    assert_eq!(other_merchant["data"], json!([]), "each merchant has its own charges");
}

#[tokio::test]
async fn a_failure_before_accepting_charges_nothing_and_the_retry_charges_once() {
    let provider = start().await;
    provider.provider.set_faults(Faults {
        fail_next: 1,
        ..Faults::default()
    });

    let (failed, _, problem) = provider.charge("cap_1", &capture("cap_1", 100)).await.unwrap();
    assert_eq!((failed, problem["code"].as_str()), (503, Some("provider_unavailable")));
    assert_eq!(provider.provider.stats().charges_made, 0);
    assert_eq!(provider.lookup("idempotency_key=cap_1").await["data"], json!([]));

    let (retried, _, _) = provider.charge("cap_1", &capture("cap_1", 100)).await.unwrap();
    assert_eq!(retried, 201);
    assert_eq!(provider.provider.stats().charges_made, 1);
}

#[tokio::test]
async fn a_charge_answered_as_still_processing_was_charged_once_and_its_retry_replays_it() {
    let provider = start().await;
    let statuses = [409, 425, 429, 500, 503];
    provider.provider.set_faults(Faults {
        answer_after_accepting: statuses.to_vec(),
        ..Faults::default()
    });

    for (i, expected) in statuses.into_iter().enumerate() {
        let key = format!("cap_{i}");
        let (status, _, problem) = provider.charge(&key, &capture(&key, 100)).await.unwrap();
        assert_eq!(status, expected);
        assert!(problem["code"].is_string(), "a body that says why: {problem}");
        assert_ne!(problem["code"], "idempotency_key_reused");
        let found = provider.lookup(&format!("idempotency_key={key}")).await;
        assert_eq!(
            found["data"][0]["status"], "succeeded",
            "{expected}: charged all the same"
        );
        let (retried, replayed, _) = provider.charge(&key, &capture(&key, 100)).await.unwrap();
        assert_eq!((retried, replayed.as_deref()), (201, Some("true")));
    }
    assert_eq!(provider.provider.stats().charges_made, 5);
}

#[tokio::test]
async fn a_declined_charge_is_a_402_that_charges_nothing() {
    let provider = start().await;
    provider.provider.set_faults(Faults {
        decline_next: 1,
        ..Faults::default()
    });

    let (declined, _, problem) = provider.charge("cap_1", &capture("cap_1", 100)).await.unwrap();

    assert_eq!((declined, problem["code"].as_str()), (402, Some("charge_declined")));
    assert_eq!(provider.provider.stats().charges_made, 0);
    assert_eq!(provider.lookup("idempotency_key=cap_1").await["data"], json!([]));
}

#[tokio::test]
async fn an_accepted_charge_whose_answer_is_dropped_is_found_by_lookup_and_replayed_to_the_retry() {
    let provider = start().await;
    provider.provider.set_faults(Faults {
        drop_next: 1,
        ..Faults::default()
    });

    let lost = provider.charge("cap_1", &capture("cap_1", 100)).await;
    assert!(lost.unwrap_err().is_timeout(), "the caller never gets an answer");

    let found = provider.lookup("idempotency_key=cap_1").await;
    assert_eq!(found["data"][0]["status"], "succeeded", "it was charged all the same");
    let (retried, replayed, charge) = provider.charge("cap_1", &capture("cap_1", 100)).await.unwrap();
    assert_eq!((retried, replayed.as_deref()), (201, Some("true")));
    assert_eq!(charge["id"], found["data"][0]["id"]);
    assert_eq!(provider.provider.stats().charges_made, 1);
    let events: Vec<String> = provider.provider.events().into_iter().map(|e| e.what).collect();
    assert!(events.iter().any(|e| e.starts_with("charged ch_")), "{events:?}");
    assert!(
        events.iter().any(|e| e.starts_with("the answer is dropped")),
        "{events:?}"
    );
    assert!(events.iter().any(|e| e.starts_with("replayed ch_")), "{events:?}");
}

#[tokio::test]
async fn faults_are_switched_over_http_and_latency_and_slow_acceptance_delay_the_answer() {
    let provider = start().await;
    let set = provider
        .http
        .put(format!("{}/admin/faults", provider.url))
        .json(&json!({"latency_ms": 150, "accept_delay_ms": 150}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status().as_u16(), 200);
    let refused = provider
        .http
        .put(format!("{}/admin/faults", provider.url))
        .json(&json!({"latency_ms": "soon"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 400);

    let started = std::time::Instant::now();
    let (status, _, _) = provider.charge("cap_1", &capture("cap_1", 100)).await.unwrap();

    assert_eq!(status, 201);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    let stats: Value = provider
        .http
        .get(format!("{}/admin/stats", provider.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["charges_made"], 1);
}

#[tokio::test]
async fn only_a_request_that_is_stored_uses_up_a_dropped_answer() {
    let provider = start().await;
    provider.charge("cap_1", &capture("cap_1", 100)).await.unwrap();
    provider.provider.set_faults(Faults {
        drop_next: 1,
        ..Faults::default()
    });

    // a replay and a refused key reuse store nothing: they are answered, and the fault waits
    let (replayed, _, _) = provider.charge("cap_1", &capture("cap_1", 100)).await.unwrap();
    let (reused, _, _) = provider.charge("cap_1", &capture("cap_1", 999)).await.unwrap();
    let stored = provider.charge("cap_2", &capture("cap_2", 100)).await;

    assert_eq!((replayed, reused), (201, 422));
    assert!(
        stored.unwrap_err().is_timeout(),
        "the first new charge is the one whose answer is dropped"
    );
    assert_eq!(provider.provider.stats().charges_made, 2);
}

#[tokio::test]
async fn a_lookup_names_a_key_or_a_reference_whatever_is_stored() {
    let provider = start().await;
    let empty = provider
        .http
        .get(format!("{}/v1/charges", provider.url))
        .bearer_auth("sk_merchant_1")
        .send()
        .await
        .unwrap();

    assert_eq!(empty.status().as_u16(), 400, "refused even with no charges stored");
}

#[tokio::test]
async fn refunds_never_exceed_their_charge_and_are_idempotent_too() {
    let provider = start().await;
    let (_, _, charge) = provider.charge("cap_1", &capture("cap_1", 1000)).await.unwrap();
    let refund = |key: &'static str, amount: i64| {
        let body = json!({"charge_id": charge["id"], "amount_minor": amount, "merchant_reference": key});
        let request = provider
            .http
            .post(format!("{}/v1/refunds", provider.url))
            .bearer_auth("sk_merchant_1")
            .header("idempotency-key", key)
            .json(&body);
        async move { request.send().await.unwrap().status().as_u16() }
    };

    assert_eq!(refund("rf_1", 600).await, 201);
    assert_eq!(refund("rf_1", 600).await, 201, "the same refund again");
    assert_eq!(refund("rf_2", 600).await, 409, "600 + 600 > 1000");
    assert_eq!(refund("rf_3", 400).await, 201);
    assert_eq!(refund("rf_4", i64::MAX).await, 409, "no amount overflows the check");
    assert_eq!(provider.provider.stats().refunds_made, 2);
}

#[tokio::test]
async fn a_charge_needs_a_key_a_merchant_and_a_valid_body() {
    let provider = start().await;
    let no_key = provider
        .http
        .post(format!("{}/v1/charges", provider.url))
        .bearer_auth("sk_merchant_1")
        .json(&capture("cap_1", 100))
        .send()
        .await
        .unwrap();
    let no_merchant = provider
        .http
        .post(format!("{}/v1/charges", provider.url))
        .header("idempotency-key", "k")
        .json(&capture("cap_1", 100))
        .send()
        .await
        .unwrap();
    let (negative, _, problem) = provider.charge("k", &capture("cap_1", -5)).await.unwrap();

    assert_eq!(no_key.status().as_u16(), 400);
    assert_eq!(no_merchant.status().as_u16(), 401);
    assert_eq!((negative, problem["code"].as_str()), (400, Some("invalid_request")));
    assert_eq!(provider.provider.stats().charges_made, 0);
}

#[tokio::test]
async fn with_a_state_file_a_restarted_provider_still_knows_a_charge_whose_answer_was_lost() {
    let state_file = std::env::temp_dir().join(format!("payment-provider-{}.json", uuid::Uuid::new_v4()));
    let before = start_with(Provider::open(Some(state_file.clone())).unwrap()).await;
    before.provider.set_faults(Faults {
        drop_next: 1,
        ..Faults::default()
    });
    assert!(
        before.charge("cap_1", &capture("cap_1", 1250)).await.is_err(),
        "no answer"
    );
    let charged = before.lookup("merchant_reference=cap_1").await["data"][0].clone();

    let after = start_with(Provider::open(Some(state_file.clone())).unwrap()).await;
    let (status, replayed, retried) = after.charge("cap_1", &capture("cap_1", 1250)).await.unwrap();
    let found = after.lookup("idempotency_key=cap_1").await;
    let faults = after
        .http
        .get(format!("{}/admin/faults", after.url))
        .send()
        .await
        .unwrap();

    assert_eq!((status, replayed.as_deref()), (201, Some("true")), "{retried}");
    assert_eq!(retried["id"], charged["id"]);
    assert_eq!(found["data"].as_array().unwrap().len(), 1);
    assert_eq!(after.provider.stats().charges_made, 1);
    assert_eq!(
        faults.json::<Faults>().await.unwrap(),
        Faults::default(),
        "faults are configuration, not kept"
    );
    std::fs::remove_file(&state_file).unwrap();
}

#[test]
fn help_prints_the_usage_and_says_what_a_state_file_keeps() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_payment-provider"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(output.stdout).unwrap();

    assert!(output.status.success());
    assert!(help.contains("Usage: payment-provider"), "{help}");
    assert!(help.contains("--state-file"), "{help}");
    assert!(help.contains("memory only"), "{help}");
}

//! The load generator: N clients in a loop for a fixed time, each request's
//! latency recorded; and the alternation that puts two sides of a comparison
//! under the same conditions.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures::future::{BoxFuture, join_all};

use crate::{BODY, report::Figure};

/// One run of one workload.
#[derive(Debug, Clone)]
pub struct Sample {
    pub requests: usize,
    pub failures: usize,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl Sample {
    fn from(mut latencies: Vec<Duration>, failures: usize, elapsed: Duration) -> Sample {
        latencies.sort();
        let at = |q: f64| {
            latencies
                .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
                .map(|d| d.as_secs_f64() * 1000.0)
                .unwrap_or(f64::NAN)
        };
        Sample {
            requests: latencies.len(),
            failures,
            rps: latencies.len() as f64 / elapsed.as_secs_f64(),
            p50_ms: at(0.50),
            p99_ms: at(0.99),
        }
    }
}

/// The median of each number over the runs.
pub fn median_figure(samples: &[Sample]) -> Figure {
    let median = |f: fn(&Sample) -> f64| {
        let mut values: Vec<f64> = samples.iter().map(f).collect();
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    Figure {
        rps: median(|s| s.rps),
        p50_ms: median(|s| s.p50_ms),
        p99_ms: median(|s| s.p99_ms),
        runs: samples.len(),
    }
}

/// One request of a workload, by client number and that client's request number;
/// `true` when it got the answer the workload expects.
pub trait Request: Fn(usize, u64) -> BoxFuture<'static, bool> + Clone + Send + Sync + 'static {}
impl<F: Fn(usize, u64) -> BoxFuture<'static, bool> + Clone + Send + Sync + 'static> Request for F {}

pub struct Load {
    client: reqwest::Client,
    run: Duration,
    /// Makes every generated key unique across runs and workloads.
    next_key: Arc<AtomicU64>,
}

impl Load {
    pub fn new(run: Duration) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("an HTTP client");
        Load {
            client,
            run,
            next_key: Arc::new(AtomicU64::new(0)),
        }
    }

    /// `concurrency` clients sending `request` back to back for the run's duration.
    pub async fn run(&self, concurrency: usize, request: impl Request) -> Sample {
        let started = Instant::now();
        let deadline = started + self.run;
        let clients = (0..concurrency).map(|client| {
            let request = request.clone();
            tokio::spawn(async move {
                let (mut latencies, mut failures, mut n) = (Vec::new(), 0, 0);
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    if !request(client, n).await {
                        failures += 1;
                    }
                    latencies.push(sent.elapsed());
                    n += 1;
                }
                (latencies, failures)
            })
        });
        let mut all = Vec::new();
        let mut failures = 0;
        for result in join_all(clients).await {
            let (latencies, failed) = result.expect("a client task");
            all.extend(latencies);
            failures += failed;
        }
        let sample = Sample::from(all, failures, started.elapsed());
        if sample.failures > 0 {
            eprintln!("  {} of {} requests failed", sample.failures, sample.requests);
        }
        sample
    }

    /// Both sides under the same conditions: one warm-up run each, then
    /// `rounds` rounds, the side that goes first alternating.
    pub async fn side_by_side(
        &self,
        rounds: usize,
        concurrency: usize,
        a: impl Request,
        b: impl Request,
    ) -> (Vec<Sample>, Vec<Sample>) {
        self.run(concurrency, a.clone()).await;
        self.run(concurrency, b.clone()).await;
        let (mut a_samples, mut b_samples) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            if round % 2 == 0 {
                a_samples.push(self.run(concurrency, a.clone()).await);
                b_samples.push(self.run(concurrency, b.clone()).await);
            } else {
                b_samples.push(self.run(concurrency, b.clone()).await);
                a_samples.push(self.run(concurrency, a.clone()).await);
            }
        }
        (a_samples, b_samples)
    }

    /// Ticket creates, each with a key of its own: every request is a first attempt.
    pub fn creates(&self, base: &str, tag: &str) -> impl Request {
        let (client, next_key) = (self.client.clone(), self.next_key.clone());
        let (url, prefix) = (format!("{base}/v1/tickets"), format!("{tag}-{}", std::process::id()));
        move |_, _| {
            let key = format!("{prefix}-{}", next_key.fetch_add(1, Ordering::Relaxed));
            let request = post(&client, &url, &key, BODY.to_owned());
            Box::pin(async move { request.send().await.is_ok_and(|r| r.status().as_u16() == 201) })
        }
    }

    /// Makes `count` tickets and returns their keys, for [`Load::replays`].
    pub async fn prepare_replays(&self, base: &str, count: usize) -> Arc<Vec<String>> {
        let url = format!("{base}/v1/tickets");
        let keys: Vec<String> = (0..count)
            .map(|n| format!("replay-{}-{n}", std::process::id()))
            .collect();
        for key in &keys {
            let response = post(&self.client, &url, key, BODY.to_owned())
                .send()
                .await
                .expect("the service answers");
            assert_eq!(response.status().as_u16(), 201);
        }
        Arc::new(keys)
    }

    /// Retries of finished creates: every request is answered from the stored answer.
    pub fn replays(&self, base: &str, keys: Arc<Vec<String>>) -> impl Request {
        let (client, url) = (self.client.clone(), format!("{base}/v1/tickets"));
        move |client_number, n| {
            let key = &keys[(client_number * 31 + n as usize) % keys.len()];
            let request = post(&client, &url, key, BODY.to_owned());
            Box::pin(async move {
                request.send().await.is_ok_and(|r| {
                    r.status().as_u16() == 201 && r.headers().get("idempotent-replayed").is_some_and(|v| v == "true")
                })
            })
        }
    }

    /// `copies` requests with one key and one body, released at once. Returns
    /// the latencies and every answer's status.
    pub async fn storm(&self, base: &str, copies: usize, title: &str) -> (Sample, Vec<u16>) {
        let url = format!("{base}/v1/tickets");
        let key = format!(
            "storm-{}-{}",
            std::process::id(),
            self.next_key.fetch_add(1, Ordering::Relaxed)
        );
        let body = serde_json::json!({"project": "ops", "title": title}).to_string();
        let gate = Arc::new(tokio::sync::Barrier::new(copies));
        let started = Instant::now();
        let copies = (0..copies).map(|_| {
            let (gate, request) = (gate.clone(), post(&self.client, &url, &key, body.clone()));
            tokio::spawn(async move {
                gate.wait().await;
                let sent = Instant::now();
                let status = request.send().await.map(|r| r.status().as_u16()).unwrap_or(0);
                (sent.elapsed(), status)
            })
        });
        let answers: Vec<(Duration, u16)> = join_all(copies)
            .await
            .into_iter()
            .map(|r| r.expect("a storm task"))
            .collect();
        let failures = answers.iter().filter(|(_, s)| !matches!(s, 201 | 409)).count();
        let statuses = answers.iter().map(|(_, s)| *s).collect();
        (
            Sample::from(
                answers.into_iter().map(|(d, _)| d).collect(),
                failures,
                started.elapsed(),
            ),
            statuses,
        )
    }
}

fn post(client: &reqwest::Client, url: &str, key: &str, body: String) -> reqwest::RequestBuilder {
    client
        .post(url)
        .bearer_auth("demo-acme-agent")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body)
}

//! The load generator: N clients in a loop for a fixed time, each request's
//! latency recorded; and the alternation that puts two sides of a comparison
//! under the same conditions.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures::future::{BoxFuture, join_all};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

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

/// The middle of `values` (the upper one of an even count).
pub fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
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

/// What a workload sends, and what it expects back.
#[derive(Clone)]
pub enum Workload {
    /// HTTP requests to a service at `addr`.
    Http {
        addr: std::net::SocketAddr,
        request: Arc<dyn Fn(usize, u64) -> http::Request<Full<Bytes>> + Send + Sync>,
        expect: fn(&http::response::Parts) -> bool,
    },
    /// The service's own code called in-process.
    Direct(Arc<dyn Fn(usize, u64) -> BoxFuture<'static, bool> + Send + Sync>),
}

pub struct Load {
    run: Duration,
    /// Makes every generated key unique across runs and workloads.
    next_key: Arc<AtomicU64>,
}

impl Load {
    pub fn new(run: Duration) -> Self {
        Load {
            run,
            next_key: Arc::new(AtomicU64::new(0)),
        }
    }

    /// `concurrency` clients sending back to back for the run's duration.
    /// Over HTTP each client keeps one keep-alive connection of its own, as a
    /// lean load tool (wrk, oha) does: the generator must cost the machine
    /// far less than the service it measures.
    pub async fn run(&self, concurrency: usize, workload: &Workload) -> Sample {
        let started = Instant::now();
        let deadline = started + self.run;
        let clients = (0..concurrency).map(|client| {
            let workload = workload.clone();
            tokio::spawn(async move {
                let (mut latencies, mut failures, mut n) = (Vec::new(), Vec::new(), 0);
                let mut connection = None;
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    let failure = match &workload {
                        Workload::Direct(call) => (!call(client, n).await).then(|| "an error".to_owned()),
                        Workload::Http { addr, request, expect } => {
                            match send(&mut connection, *addr, request(client, n)).await {
                                Some(answer) if expect(&answer) => None,
                                Some(answer) => Some(format!("status {}", answer.status.as_u16())),
                                None => Some("no answer".to_owned()),
                            }
                        }
                    };
                    if let Some(failure) = failure {
                        failures.push((failure, sent.elapsed()));
                    }
                    latencies.push(sent.elapsed());
                    n += 1;
                }
                (latencies, failures)
            })
        });
        let mut all = Vec::new();
        let mut failures = Vec::new();
        for result in join_all(clients).await {
            let (latencies, failed) = result.expect("a client task");
            all.extend(latencies);
            failures.extend(failed);
        }
        let sample = Sample::from(all, failures.len(), started.elapsed());
        if sample.failures > 0 {
            // what failed and how long it took to: a timeout and a refusal look alike in a count
            let mut kinds: BTreeMap<&str, (usize, Duration)> = BTreeMap::new();
            for (failure, took) in &failures {
                let kind = kinds.entry(failure.as_str()).or_default();
                kind.0 += 1;
                kind.1 = kind.1.max(*took);
            }
            let kinds: Vec<String> = kinds
                .iter()
                .map(|(failure, (count, slowest))| format!("{failure} ×{count} (the slowest after {slowest:.1?})"))
                .collect();
            eprintln!(
                "  {} of {} requests failed: {}",
                sample.failures,
                sample.requests,
                kinds.join(", ")
            );
        }
        sample
    }

    /// Both sides under the same conditions: one warm-up run each, then
    /// `rounds` rounds, the side that goes first alternating.
    pub async fn side_by_side(
        &self,
        rounds: usize,
        concurrency: usize,
        a: &Workload,
        b: &Workload,
    ) -> (Vec<Sample>, Vec<Sample>) {
        let mut samples = self.alternated(rounds, concurrency, &[a, b]).await.into_iter();
        (samples.next().unwrap(), samples.next().unwrap())
    }

    /// Any number of workloads under the same conditions: one warm-up run
    /// each, then `rounds` rounds, in order in even rounds and in reverse in
    /// odd ones, so that no workload keeps a place a drift favours. Each
    /// workload's samples, in the order given.
    pub async fn alternated(&self, rounds: usize, concurrency: usize, workloads: &[&Workload]) -> Vec<Vec<Sample>> {
        for workload in workloads {
            self.run(concurrency, workload).await;
        }
        let mut samples = vec![Vec::new(); workloads.len()];
        for round in 0..rounds {
            let mut order: Vec<usize> = (0..workloads.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                samples[i].push(self.run(concurrency, workloads[i]).await);
            }
        }
        samples
    }

    /// Ticket creates, each with a key of its own: every request is a first attempt.
    pub fn creates(&self, addr: std::net::SocketAddr, tag: &str) -> Workload {
        let next_key = self.next_key.clone();
        let prefix = format!("{tag}-{}", std::process::id());
        Workload::Http {
            addr,
            request: Arc::new(move |_, _| {
                post(
                    &format!("{prefix}-{}", next_key.fetch_add(1, Ordering::Relaxed)),
                    BODY.to_owned(),
                )
            }),
            expect: |r| r.status == 201,
        }
    }

    /// Creates at `path` of another service, each with a key of its own and
    /// the body `body(n)` made unique by `n` (an order, a service name…).
    pub fn writes(
        &self,
        addr: std::net::SocketAddr,
        path: &'static str,
        tag: &str,
        body: fn(u64) -> String,
        expect: fn(&http::response::Parts) -> bool,
    ) -> Workload {
        let next_key = self.next_key.clone();
        let prefix = format!("{tag}-{}", std::process::id());
        Workload::Http {
            addr,
            request: Arc::new(move |_, _| {
                let n = next_key.fetch_add(1, Ordering::Relaxed);
                post_to(path, &format!("{prefix}-{n}"), body(n))
            }),
            expect,
        }
    }

    /// Makes `count` tickets and returns their keys, for [`Load::replays`].
    pub async fn prepare_replays(&self, addr: std::net::SocketAddr, count: usize) -> Arc<Vec<String>> {
        let keys: Vec<String> = (0..count)
            .map(|n| format!("replay-{}-{n}", std::process::id()))
            .collect();
        let mut connection = None;
        for key in &keys {
            let response = send(&mut connection, addr, post(key, BODY.to_owned()))
                .await
                .expect("the service answers");
            assert_eq!(response.status, 201);
        }
        Arc::new(keys)
    }

    /// Retries of finished creates: every request is answered from the stored answer.
    pub fn replays(&self, addr: std::net::SocketAddr, keys: Arc<Vec<String>>) -> Workload {
        Workload::Http {
            addr,
            request: Arc::new(move |client, n| post(&keys[(client * 31 + n as usize) % keys.len()], BODY.to_owned())),
            expect: |r| r.status == 201 && r.headers.get("idempotent-replayed").is_some_and(|v| v == "true"),
        }
    }

    /// `GET /healthz`: the least a request to the service costs over HTTP
    /// (its probe's answer is reused for a while, so mostly no query).
    pub fn healthz(&self, addr: std::net::SocketAddr) -> Workload {
        Workload::Http {
            addr,
            request: Arc::new(|_, _| {
                http::Request::get("/healthz")
                    .header("host", "127.0.0.1")
                    .body(Full::new(Bytes::new()))
                    .expect("a valid request")
            }),
            expect: |r| r.status == 200,
        }
    }

    /// `copies` requests with one key and one body, each on its own
    /// connection, released at once. Returns the latencies and every status.
    pub async fn storm(&self, addr: std::net::SocketAddr, copies: usize, title: &str) -> (Sample, Vec<u16>) {
        let key = format!(
            "storm-{}-{}",
            std::process::id(),
            self.next_key.fetch_add(1, Ordering::Relaxed)
        );
        let body = serde_json::json!({"project": "ops", "title": title}).to_string();
        let gate = Arc::new(tokio::sync::Barrier::new(copies));
        let started = Instant::now();
        let copies = (0..copies).map(|_| {
            let (gate, request) = (gate.clone(), post(&key, body.clone()));
            tokio::spawn(async move {
                let mut connection = connect(addr).await;
                gate.wait().await;
                let sent = Instant::now();
                let status = send(&mut connection, addr, request)
                    .await
                    .map(|r| r.status.as_u16())
                    .unwrap_or(0);
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

type Connection = Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>;

async fn connect(addr: std::net::SocketAddr) -> Connection {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(connection);
    Some(sender)
}

/// Sends on the client's connection (made, or made again after an error),
/// and reads the whole answer.
async fn send(
    connection: &mut Connection,
    addr: std::net::SocketAddr,
    request: http::Request<Full<Bytes>>,
) -> Option<http::response::Parts> {
    if connection.as_ref().is_none_or(|c| c.is_closed()) {
        *connection = connect(addr).await;
    }
    let sender = connection.as_mut()?;
    sender.ready().await.ok()?;
    match sender.send_request(request).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            // read the body to the end, so the connection is ready for the next request
            body.collect().await.ok()?;
            Some(parts)
        }
        Err(_) => {
            *connection = None;
            None
        }
    }
}

fn post(key: &str, body: String) -> http::Request<Full<Bytes>> {
    post_to("/v1/tickets", key, body)
}

fn post_to(path: &str, key: &str, body: String) -> http::Request<Full<Bytes>> {
    http::Request::post(path)
        .header("host", "127.0.0.1")
        .header("authorization", "Bearer demo-acme-agent")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(body)))
        .expect("a valid request")
}

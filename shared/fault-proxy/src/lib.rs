//! A loopback HTTP proxy that stands between an agent and a service and
//! breaks the network the way the test plan of the article (docs/article.md) asks: the service does
//! the work and answers, and the answer is **dropped on its way back** — the
//! agent times out not knowing that its write happened. Faults are switched
//! at run time ([`FaultProxy::set_faults`]); every request that passes is
//! noted ([`FaultProxy::passed`]) with its key and what became of it.
//!
//! In front of several replicas of a service ([`FaultProxy::spread`]) it is
//! the load balancer a service must survive: a request with an
//! `Idempotency-Key` goes to another replica than the one that last served
//! that key, so a retry never lands where the first attempt did; other
//! requests go round the replicas in turn.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, Method, StatusCode},
    response::{IntoResponse, Response},
};
use serde::Serialize;

/// What the proxy does to the next requests. Counters count down as they hit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProxyFaults {
    /// The next N requests reach the service, which answers; the answer is
    /// never sent on (the agent times out).
    pub drop_next_answers: u32,
    /// The next N requests answer 502 without reaching the service.
    pub fail_next: u32,
    /// Added before forwarding every request.
    pub delay_ms: u64,
}

/// One request that passed, and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct Passed {
    pub at: String,
    pub method: String,
    pub path: String,
    pub idempotency_key: Option<String>,
    /// The service's status, when it answered.
    pub status: Option<u16>,
    /// What the proxy did: `forwarded`, `answer dropped`, `502 before the service`.
    pub fate: String,
    /// Which replica it was sent to (0 is the first), if it was sent.
    pub replica: Option<usize>,
}

#[derive(Debug, Default)]
struct Inner {
    faults: ProxyFaults,
    passed: Vec<Passed>,
    /// The replica the next request without a key goes to.
    next: usize,
    /// The replica that last served each key.
    last_for_key: HashMap<String, usize>,
}

/// A running proxy.
#[derive(Debug, Clone)]
pub struct FaultProxy {
    /// Where the agent sends: `http://127.0.0.1:<port>`.
    pub url: String,
    /// The replicas it spreads requests over; one, for a single service.
    upstreams: Vec<String>,
    inner: Arc<Mutex<Inner>>,
    http: reqwest::Client,
}

/// How long a dropped answer is held before the connection is let go: far
/// past any agent's timeout.
const DROPPED_ANSWER_HOLD: Duration = Duration::from_secs(120);

impl FaultProxy {
    /// Starts a proxy to `upstream` (`http://127.0.0.1:7001`) on a free loopback port.
    pub async fn start(upstream: impl Into<String>) -> std::io::Result<FaultProxy> {
        FaultProxy::spread(vec![upstream.into()]).await
    }

    /// Starts a proxy in front of `replicas` of one service (see the module's doc).
    pub async fn spread(replicas: Vec<String>) -> std::io::Result<FaultProxy> {
        assert!(!replicas.is_empty(), "a proxy needs a service behind it");
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let proxy = FaultProxy {
            url: format!("http://{}", listener.local_addr()?),
            upstreams: replicas.iter().map(|u| u.trim_end_matches('/').to_owned()).collect(),
            inner: Arc::default(),
            http: reqwest::Client::new(),
        };
        let router = Router::new().fallback(forward).with_state(proxy.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Ok(proxy)
    }

    pub fn set_faults(&self, faults: ProxyFaults) {
        self.lock().faults = faults;
    }

    /// Every request that passed, in order.
    pub fn passed(&self) -> Vec<Passed> {
        self.lock().passed.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The replica a request goes to: for a key, another than the one that
    /// last served it; otherwise the next in turn.
    fn pick(&self, headers: &HeaderMap) -> usize {
        let replicas = self.upstreams.len();
        let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
        let mut inner = self.lock();
        let replica = match key.and_then(|k| inner.last_for_key.get(k)) {
            Some(last) => (last + 1) % replicas,
            None => {
                let next = inner.next;
                inner.next = (next + 1) % replicas;
                next
            }
        };
        if let Some(key) = key {
            inner.last_for_key.insert(key.to_owned(), replica);
        }
        replica
    }

    fn note(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        replica: Option<usize>,
        status: Option<u16>,
        fate: &str,
    ) {
        self.lock().passed.push(Passed {
            at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            method: method.to_string(),
            path: path.to_owned(),
            idempotency_key: headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            status,
            fate: fate.to_owned(),
            replica,
        });
    }
}

/// A request on the wire reaches the service even if the agent that sent it
/// dies meanwhile: the forwarding runs as a task of its own, which the agent
/// hanging up does not cancel.
async fn forward(State(proxy): State<FaultProxy>, request: Request) -> Response {
    match tokio::spawn(pass(proxy, request)).await {
        Ok(response) => response,
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

async fn pass(proxy: FaultProxy, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let (fail, drop_answer, delay) = {
        let mut inner = proxy.lock();
        let faults = &mut inner.faults;
        let fail = faults.fail_next > 0;
        if fail {
            faults.fail_next -= 1;
        }
        // only a request that reaches the service uses up a dropped answer
        let drop_answer = !fail && faults.drop_next_answers > 0;
        if drop_answer {
            faults.drop_next_answers -= 1;
        }
        (fail, drop_answer, faults.delay_ms)
    };
    if fail {
        proxy.note(
            &parts.method,
            &path,
            &parts.headers,
            None,
            None,
            "502 before the service",
        );
        return (StatusCode::BAD_GATEWAY, "fault: the proxy failed before the service").into_response();
    }
    tokio::time::sleep(Duration::from_millis(delay)).await;
    let body: Bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(body) => body,
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    let replica = proxy.pick(&parts.headers);
    let mut upstream = proxy
        .http
        .request(parts.method.clone(), format!("{}{path}", proxy.upstreams[replica]))
        .body(body);
    for (name, value) in &parts.headers {
        if name != "host" {
            upstream = upstream.header(name, value);
        }
    }
    let answered = match upstream.send().await {
        Ok(answered) => answered,
        Err(e) => {
            proxy.note(
                &parts.method,
                &path,
                &parts.headers,
                Some(replica),
                None,
                "the service could not be reached",
            );
            return (StatusCode::BAD_GATEWAY, e.to_string()).into_response();
        }
    };
    let status = answered.status();
    let headers = answered.headers().clone();
    let body = answered.bytes().await.unwrap_or_default();
    if drop_answer {
        proxy.note(
            &parts.method,
            &path,
            &parts.headers,
            Some(replica),
            Some(status.as_u16()),
            "answer dropped",
        );
        tracing::warn!(%path, "fault: the service answered, and the answer is dropped");
        // held until the agent has long given up, then let go unanswered
        tokio::time::sleep(DROPPED_ANSWER_HOLD).await;
        return StatusCode::GATEWAY_TIMEOUT.into_response();
    }
    proxy.note(
        &parts.method,
        &path,
        &parts.headers,
        Some(replica),
        Some(status.as_u16()),
        "forwarded",
    );
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    for (name, value) in &headers {
        if name != "transfer-encoding" && name != "content-length" && name != "connection" {
            response.headers_mut().insert(name, value.clone());
        }
    }
    response
}

//! Slow and oversized clients against a real server on a socket
//! (docs/contract.md §1, §14): late headers close the connection, oversized
//! headers are 431, a body that trickles in is 408, idle half-open
//! connections hold no worker, a client that never reads its answers loses
//! its connection, and past the connection cap a new connection is 503.
//!
//! These limits are the HTTP server's, not the database's; each test runs on
//! both backends only because the tickets app it serves needs a database.

use std::{net::SocketAddr, time::Duration};

use platform::{
    Backend,
    config::{ConnectionCap, ConnectionLimits},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::oneshot,
};

use crate::support::*;

/// Short limits, so that no test waits long for them, and a cap no test
/// reaches but the one about the cap.
fn limits() -> ConnectionLimits {
    ConnectionLimits {
        header_timeout: Duration::from_secs(1),
        max_header_bytes: 32 * 1024,
        body_timeout: Duration::from_secs(1),
        write_timeout: Duration::from_secs(1),
        connections: ConnectionCap::new(1000),
    }
}

/// The app served on `127.0.0.1:0` with `limits` until the returned sender drops.
async fn serve(app: &TestApp, limits: ConnectionLimits) -> (SocketAddr, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(platform::serve(
        listener,
        tickets::build_router(app.app.clone()),
        limits,
        async {
            let _ = stopped.await;
        },
    ));
    (addr, stop)
}

/// Whether the server closes `stream` within `within`, reading (and
/// discarding) whatever it sends first.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buffer = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// One response's status line, headers and body, read up to its
/// `Content-Length` (or to the end of the connection).
async fn read_response(stream: &mut TcpStream) -> (String, String) {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("an answer within 10 s")
            .unwrap_or(0);
        received.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&received).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(str::to_owned)
                })
                .and_then(|value| value.trim().parse::<usize>().ok());
            if read == 0 || length.is_some_and(|length| body.len() >= length) {
                return (head.to_owned(), body.to_owned());
            }
        } else if read == 0 {
            return (text, String::new());
        }
    }
}

async fn headers_not_complete_within_the_header_timeout_close_the_connection(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (addr, _stop) = serve(&app, limits()).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /v1/tickets HTTP/1.1\r\nHost: tickets\r\nContent-Type: appl")
        .await
        .unwrap();

    assert!(
        closed_within(&mut stream, limits().header_timeout * 3).await,
        "a client that never finishes its headers does not keep its connection"
    );
}

async fn request_headers_over_32_kib_are_431(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (addr, _stop) = serve(&app, limits()).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let padding = "x".repeat(40 * 1024);
    let request = format!("GET /healthz HTTP/1.1\r\nHost: tickets\r\nX-Padding: {padding}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();

    let (head, _) = read_response(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
}

async fn a_body_that_trickles_in_past_the_body_timeout_is_408_and_claims_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (addr, _stop) = serve(&app, limits()).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let (start, rest) = ROTATE_CERT.split_at(20);
    let head = format!(
        "POST /v1/tickets HTTP/1.1\r\nHost: tickets\r\nAuthorization: Bearer {ACME_AGENT}\r\n\
         Content-Type: application/json\r\nIdempotency-Key: slow-1\r\nContent-Length: {}\r\n\r\n{start}",
        ROTATE_CERT.len()
    );
    // the rest of the body, a byte every 200 ms: all of it would take seconds
    let trickle = tokio::spawn(async move {
        writer.write_all(head.as_bytes()).await?;
        for byte in rest.bytes() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            writer.write_all(&[byte]).await?;
        }
        std::io::Result::Ok(writer)
    });

    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let answer = tokio::time::timeout(limits().body_timeout * 3, async {
        while !String::from_utf8_lossy(&received).contains("\"code\"") {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => received.extend_from_slice(&buffer[..read]),
            }
        }
        String::from_utf8_lossy(&received).into_owned()
    })
    .await
    .expect("an answer before the body would have been complete");
    trickle.abort();

    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{answer}"
    );
    assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
    let sent_whole = app.create_ticket("slow-1", ROTATE_CERT).await;
    assert_eq!(sent_whole.status, 201, "the late body claimed nothing");
}

async fn a_request_is_answered_while_500_idle_half_open_connections_are_held_until_they_are_closed(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (addr, _stop) = serve(&app, limits()).await;
    let mut idle = Vec::new();
    for _ in 0..500 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: ti").await.unwrap();
        idle.push(stream);
    }

    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: tickets\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_response(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("ok"), "{body}");

    for stream in &mut idle {
        assert!(
            closed_within(stream, limits().header_timeout * 3).await,
            "every idle connection is closed once its headers are late"
        );
    }
}

/// `GET /healthz` on a connection of its own: the status line and headers, and the body.
async fn get_healthz(addr: SocketAddr) -> (String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: tickets\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    read_response(&mut stream).await
}

/// How many answers the server sent on `stream` before it closed it
/// (reading them only now); `None` if it is still open after 30 s.
async fn answers_until_closed(stream: &mut TcpStream) -> Option<usize> {
    const STATUS_LINE: &[u8] = b"HTTP/1.1 200";
    let mut answers = 0;
    // the end of the last read, so that a status line split between two reads counts once
    let mut carried = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let read = match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return answers,
                Ok(read) => read,
            };
            carried.extend_from_slice(&buffer[..read]);
            answers += carried.windows(STATUS_LINE.len()).filter(|w| *w == STATUS_LINE).count();
            let keep = carried.len().min(STATUS_LINE.len() - 1);
            carried.drain(..carried.len() - keep);
        }
    })
    .await
    .ok()
}

/// Requests a client sends at once, never reading an answer: their answers
/// are far more than the socket buffers between it and the server hold.
const PIPELINED: usize = 1000;

async fn a_client_that_never_reads_its_answers_is_disconnected_while_another_client_is_answered(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let limits = limits();
    let (addr, _stop) = serve(&app, limits.clone()).await;
    let mut never_reads = TcpStream::connect(addr).await.unwrap();
    let requests = "GET /openapi.json HTTP/1.1\r\nHost: tickets\r\n\r\n".repeat(PIPELINED);
    never_reads.write_all(requests.as_bytes()).await.unwrap();

    let (head, body) = get_healthz(addr).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("ok"), "{body}");

    // reading nothing for longer than the write timeout
    tokio::time::sleep(limits.write_timeout * 3).await;
    let answers = answers_until_closed(&mut never_reads)
        .await
        .expect("the server closed the connection");
    assert!(
        answers < PIPELINED,
        "the server stopped answering a client that read nothing ({answers} of {PIPELINED} answers sent)"
    );
}

/// The connections the server holds at most in the test of the cap.
const CAP: usize = 4;

async fn past_the_connection_cap_a_connection_is_answered_503_with_retry_after_until_one_closes(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let limits = ConnectionLimits {
        // the held connections must stay open for as long as the test needs them
        header_timeout: Duration::from_secs(60),
        connections: ConnectionCap::new(CAP),
        ..limits()
    };
    let (addr, _stop) = serve(&app, limits).await;
    // accepted in the order they connect: these take every place
    let mut held = Vec::new();
    for _ in 0..CAP {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: ti").await.unwrap();
        held.push(stream);
    }

    let (head, body) = get_healthz(addr).await;
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("\r\nretry-after: 1\r\n"), "{head}");
    assert!(head.contains("content-type: application/problem+json"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert!(body.contains("\"code\":\"too_many_connections\""), "{body}");

    drop(held.pop());
    // the server sees the connection close on its own time: ask until it has
    let mut answered = String::new();
    for _ in 0..100 {
        answered = get_healthz(addr).await.0;
        if answered.starts_with("HTTP/1.1 200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        answered.starts_with("HTTP/1.1 200"),
        "a place freed is served: {answered}"
    );
}

platform::both_backends!(
    headers_not_complete_within_the_header_timeout_close_the_connection,
    request_headers_over_32_kib_are_431,
    a_body_that_trickles_in_past_the_body_timeout_is_408_and_claims_nothing,
    a_request_is_answered_while_500_idle_half_open_connections_are_held_until_they_are_closed,
    a_client_that_never_reads_its_answers_is_disconnected_while_another_client_is_answered,
    past_the_connection_cap_a_connection_is_answered_503_with_retry_after_until_one_closes,
);

//! Slow and oversized clients against a real server on a socket
//! (docs/contract.md §1): late headers close the connection, oversized headers
//! are 431, a body that trickles in is 408, and idle half-open connections hold
//! no worker.
//!
//! These limits are the HTTP server's, not the database's; each test runs on
//! both backends only because the tickets app it serves needs a database.

use std::{net::SocketAddr, time::Duration};

use platform::{Backend, config::ConnectionLimits};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::oneshot,
};

use crate::support::*;

/// Short limits, so that no test waits long for them.
const LIMITS: ConnectionLimits = ConnectionLimits {
    header_timeout: Duration::from_secs(1),
    max_header_bytes: 32 * 1024,
    body_timeout: Duration::from_secs(1),
};

/// The app served on `127.0.0.1:0` with [`LIMITS`] until the returned sender drops.
async fn serve(app: &TestApp) -> (SocketAddr, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(platform::serve(
        listener,
        tickets::build_router(app.app.clone()),
        LIMITS,
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
    let (addr, _stop) = serve(&app).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /v1/tickets HTTP/1.1\r\nHost: tickets\r\nContent-Type: appl")
        .await
        .unwrap();

    assert!(
        closed_within(&mut stream, LIMITS.header_timeout * 3).await,
        "a client that never finishes its headers does not keep its connection"
    );
}

async fn request_headers_over_32_kib_are_431(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (addr, _stop) = serve(&app).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let padding = "x".repeat(40 * 1024);
    let request = format!("GET /healthz HTTP/1.1\r\nHost: tickets\r\nX-Padding: {padding}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();

    let (head, _) = read_response(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
}

async fn a_body_that_trickles_in_past_the_body_timeout_is_408_and_claims_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let (addr, _stop) = serve(&app).await;
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
    let answer = tokio::time::timeout(LIMITS.body_timeout * 3, async {
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
    let (addr, _stop) = serve(&app).await;
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
            closed_within(stream, LIMITS.header_timeout * 3).await,
            "every idle connection is closed once its headers are late"
        );
    }
}

platform::both_backends!(
    headers_not_complete_within_the_header_timeout_close_the_connection,
    request_headers_over_32_kib_are_431,
    a_body_that_trickles_in_past_the_body_timeout_is_408_and_claims_nothing,
    a_request_is_answered_while_500_idle_half_open_connections_are_held_until_they_are_closed,
);

//! The example as a team would run it: its binary, a real process on a free
//! port with SQLite in a temporary directory, asked over HTTP what
//! docs/contract.md §3 promises a caller that retries.

use std::{path::Path, process::Stdio, time::Duration};

use reqwest::{Response, StatusCode};
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// One of the sandbox's demo keys, which the example accepts.
const API_KEY: &str = "demo-acme-agent";

/// The example's binary, serving the database in `dir` until it is dropped.
struct Example {
    api: Api,
    _process: Child,
}

/// Requests to a running example.
#[derive(Clone)]
struct Api {
    base: String,
}

impl Example {
    /// Starts the binary with `env` on top of its defaults and waits for the
    /// line that names the port it was given.
    async fn start(dir: &Path, env: &[(&str, &str)]) -> Example {
        let mut process = Command::new(env!("CARGO_BIN_EXE_adopt"))
            .env("ADOPT_ADDR", "127.0.0.1:0")
            .env("ADOPT_DATABASE_URL", database_url(dir))
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the example's binary starts");
        let mut lines = BufReader::new(process.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the example says where it listens within 30 s")
            .unwrap()
            .expect("the example prints a line before it exits");
        let base = line.strip_prefix("adopt listening on ").expect(&line).to_owned();
        Example {
            api: Api { base },
            _process: process,
        }
    }
}

impl Api {
    async fn create_note(&self, key: &str, body: &str) -> Response {
        reqwest::Client::new()
            .post(format!("{}/v1/notes", self.base))
            .bearer_auth(API_KEY)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap()
    }

    /// The operation status of `key`, once it has one.
    async fn operation(&self, key: &str) -> Option<Value> {
        let list: Value = reqwest::Client::new()
            .get(format!("{}/v1/operations", self.base))
            .bearer_auth(API_KEY)
            .query(&[("idempotency_key", key)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        list["data"].get(0).cloned()
    }
}

fn database_url(dir: &Path) -> String {
    format!("sqlite:{}", dir.join("adopt.db").display())
}

/// How many notes the example's database holds.
async fn notes(dir: &Path) -> i64 {
    let pool = sqlx::SqlitePool::connect(&database_url(dir)).await.unwrap();
    sqlx::query_scalar("SELECT count(*) FROM notes")
        .fetch_one(&pool)
        .await
        .unwrap()
}

/// Asks `poll` every 50 ms until it has an answer.
async fn within_10_s<T>(mut poll: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..200 {
        if let Some(answer) = poll().await {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no answer within 10 s")
}

fn header<'a>(response: &'a Response, name: &str) -> &'a str {
    response.headers()[name].to_str().unwrap()
}

#[tokio::test]
async fn a_retry_with_the_same_key_and_body_replays_the_first_answer_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let example = Example::start(dir.path(), &[]).await;

    let first = example.api.create_note("note-1", r#"{"text":"buy milk"}"#).await;
    let (status, location) = (first.status(), header(&first, "location").to_owned());
    let operation_id = header(&first, "operation-id").to_owned();
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(header(&first, "idempotent-replayed"), "false");
    let first_body = first.bytes().await.unwrap();

    // the same command written differently: the fingerprint hashes canonical JSON
    let retry = example.api.create_note("note-1", "{ \"text\" : \"buy milk\" }").await;
    assert_eq!(retry.status(), status);
    assert_eq!(header(&retry, "idempotent-replayed"), "true");
    assert_eq!(header(&retry, "operation-id"), operation_id);
    assert_eq!(header(&retry, "location"), location);
    assert_eq!(retry.bytes().await.unwrap(), first_body);
    assert_eq!(notes(dir.path()).await, 1);
}

#[tokio::test]
async fn the_same_key_with_another_body_is_422_idempotency_key_reused_and_makes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let example = Example::start(dir.path(), &[]).await;
    let first = example.api.create_note("note-1", r#"{"text":"buy milk"}"#).await;
    assert_eq!(first.status(), StatusCode::CREATED);

    let changed = example.api.create_note("note-1", r#"{"text":"buy bread"}"#).await;
    assert_eq!(changed.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(header(&changed, "content-type"), "application/problem+json");
    let problem: Value = changed.json().await.unwrap();
    assert_eq!(problem["code"], "idempotency_key_reused");
    assert_eq!(problem["operation_id"], header(&first, "operation-id"));
    assert!(
        !problem.to_string().contains("milk"),
        "never the stored request or answer: {problem}"
    );
    assert_eq!(notes(dir.path()).await, 1);
}

#[tokio::test]
async fn a_duplicate_while_the_first_attempt_runs_is_409_and_a_retry_after_its_holder_died_makes_one_note() {
    let dir = tempfile::tempdir().unwrap();
    // the leased claim mode commits the claim first; the fail point then holds
    // the first attempt there, as a slow or dying holder would be held
    let holder = Example::start(
        dir.path(),
        &[
            ("RETRYSAFE_CLAIM", "leased"),
            ("RETRYSAFE_LEASE_SECONDS", "2"),
            ("FAILPOINTS", "idempotency::after_claim=return"),
        ],
    )
    .await;
    let body = r#"{"text":"buy milk"}"#;
    let api = holder.api.clone();
    let first = tokio::spawn(async move { api.create_note("note-1", body).await });
    let claimed = within_10_s(async || holder.api.operation("note-1").await).await;
    assert_eq!(claimed["state"], "in_progress");

    let duplicate = holder.api.create_note("note-1", body).await;
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    assert!(duplicate.headers().contains_key("retry-after"));
    let problem: Value = duplicate.json().await.unwrap();
    assert_eq!(problem["code"], "request_in_progress");
    assert_eq!(problem["operation_id"], claimed["operation_id"]);
    assert_eq!(notes(dir.path()).await, 0, "the duplicate made nothing");

    // the holder dies; once its lease has run out, a retry takes the operation over
    first.abort();
    drop(holder);
    let example = Example::start(dir.path(), &[]).await;
    let retry = within_10_s(async || {
        let retry = example.api.create_note("note-1", body).await;
        (retry.status() != StatusCode::CONFLICT).then_some(retry)
    })
    .await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(header(&retry, "operation-id"), claimed["operation_id"]);
    assert_eq!(notes(dir.path()).await, 1);
}

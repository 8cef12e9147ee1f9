//! Only immutable references: what was asked for (and approved) is what runs,
//! on every retry.

use axum::http::StatusCode;
use deployments::domain::{ArtifactDigest, CommitSha};
use platform::Backend;
use serde_json::json;

use crate::support::{COMMIT_A1B2C3, TestApp, digest, release};

#[test]
fn only_a_whole_digest_and_a_whole_commit_sha_are_references() {
    let digests = [
        (digest('a'), true),
        (format!("sha256:{}", "A".repeat(64)), false),
        (format!("sha256:{}", "a".repeat(63)), false),
        (format!("sha512:{}", "a".repeat(64)), false),
        ("latest".to_owned(), false),
        ("checkout:1.4.2".to_owned(), false),
        ("main".to_owned(), false),
        ("a".repeat(64), false),
        (String::new(), false),
    ];
    for (text, valid) in digests {
        assert_eq!(ArtifactDigest::parse(&text).is_ok(), valid, "{text:?}");
    }
    let commits = [
        (COMMIT_A1B2C3.to_owned(), true),
        (COMMIT_A1B2C3.to_ascii_uppercase(), true),
        ("a1b2c3".to_owned(), false),
        (format!("{COMMIT_A1B2C3}0"), false),
        ("main".to_owned(), false),
        ("v1.4.2".to_owned(), false),
        ("latest".to_owned(), false),
        ("g1b2c3d4e5f60718293a4b5c6d7e8f9012345678".to_owned(), false),
    ];
    for (text, valid) in commits {
        assert_eq!(CommitSha::parse(&text).is_ok(), valid, "{text:?}");
    }
    assert_eq!(
        CommitSha::parse(&COMMIT_A1B2C3.to_ascii_uppercase()).unwrap().as_str(),
        COMMIT_A1B2C3,
        "one commit, one spelling"
    );
}

async fn a_tag_a_branch_latest_or_a_short_sha_is_refused_by_name_and_claims_nothing(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let refused = [
        (release("staging", "latest", None), "artifact_digest"),
        (release("staging", "checkout:1.4.2", None), "artifact_digest"),
        (
            release("staging", &format!("sha256:{}", "F".repeat(64)), None),
            "artifact_digest",
        ),
        (release("staging", &digest('a'), Some("main")), "commit_sha"),
        (release("staging", &digest('a'), Some("a1b2c3")), "commit_sha"),
        (release("staging", &digest('a'), Some("v1.4.2")), "commit_sha"),
    ];

    for (body, field) in &refused {
        let answer = app.deploy("deploy-1", body).await;
        answer.assert_problem(400, "mutable_reference_rejected");
        assert_eq!(answer.json()["field"], *field, "{:?}", answer.body);
    }
    let fixed = app
        .deploy("deploy-1", &release("staging", &digest('a'), Some(COMMIT_A1B2C3)))
        .await;
    let bad_name = app
        .deploy(
            "deploy-2",
            &json!({"service": "Checkout!", "environment": "staging", "artifact_digest": digest('a')}),
        )
        .await;

    assert_eq!(
        fixed.status,
        StatusCode::ACCEPTED,
        "nothing was claimed: {:?}",
        fixed.body
    );
    assert_eq!(fixed.json()["artifact_digest"], digest('a'));
    assert_eq!(fixed.json()["commit_sha"], COMMIT_A1B2C3);
    bad_name.assert_problem(400, "invalid_request");
}

platform::both_backends!(a_tag_a_branch_latest_or_a_short_sha_is_refused_by_name_and_claims_nothing);

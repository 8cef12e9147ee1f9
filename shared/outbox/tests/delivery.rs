//! What an external system's refusal means for a delivery: only a business
//! refusal fails the operation; whatever may mean the request is in flight or
//! was taken after all is unknown, for the reconciler to ask about; only what
//! cannot have reached the work is sent again as it is, with the same key.

use outbox::Delivery;

/// The business refusals this table's external system sends as 409.
const FINAL_CONFLICTS: &[&str] = &["refund_exceeds_charge"];

fn kind(status: u16, body: &str) -> &'static str {
    match Delivery::from_refusal(status, body, FINAL_CONFLICTS) {
        Delivery::Accepted { .. } => "accepted",
        Delivery::Refused { .. } => "refused",
        Delivery::NotAccepted { .. } => "sent again",
        Delivery::AnswerLost { .. } => "looked up",
    }
}

fn problem(code: &str) -> String {
    format!(r#"{{"type":"about:blank","title":"t","status":0,"code":"{code}","detail":"d"}}"#)
}

#[test]
fn only_a_business_refusal_is_final_and_anything_that_may_be_in_flight_is_looked_up() {
    let table = [
        (402, problem("charge_declined"), "refused"),
        (400, problem("invalid_request"), "refused"),
        (404, problem("not_found"), "refused"),
        (409, problem("refund_exceeds_charge"), "refused"),
        (422, problem("idempotency_key_reused"), "looked up"),
        (409, problem("idempotency_key_reused"), "looked up"),
        (409, problem("request_in_progress"), "looked up"),
        (409, String::new(), "looked up"),
        (425, problem("too_early"), "looked up"),
        (425, String::new(), "looked up"),
        (429, problem("request_in_progress"), "looked up"),
        (429, "slow down".to_owned(), "looked up"),
        (500, problem("internal_error"), "looked up"),
        (502, String::new(), "looked up"),
        (503, problem("provider_unavailable"), "looked up"),
        (504, String::new(), "looked up"),
        (429, String::new(), "sent again"),
        (408, String::new(), "sent again"),
        (401, problem("unauthenticated"), "sent again"),
        (403, String::new(), "sent again"),
    ];
    for (status, body, expected) in table {
        assert_eq!(kind(status, &body), expected, "{status} {body:?}");
    }
}

#[test]
fn a_conflict_is_final_only_for_the_codes_the_client_names() {
    let refund_past_its_charge = problem("refund_exceeds_charge");

    assert_eq!(kind(409, &refund_past_its_charge), "refused");
    assert!(matches!(
        Delivery::from_refusal(409, &refund_past_its_charge, &[]),
        Delivery::AnswerLost { .. }
    ));
}

#[test]
fn a_refusal_is_told_by_its_status_code_and_detail_and_never_by_a_body_that_is_not_a_problem() {
    let reason = |status, body: &str| match Delivery::from_refusal(status, body, FINAL_CONFLICTS) {
        Delivery::Refused { reason } | Delivery::NotAccepted { reason } | Delivery::AnswerLost { reason } => reason,
        Delivery::Accepted { .. } => panic!("a refusal is never accepted"),
    };

    assert_eq!(
        reason(402, &problem("charge_declined")),
        "answered 402 charge_declined: d"
    );
    assert_eq!(
        reason(502, "<html><pre>Traceback: db password=hunter2</pre></html>"),
        "answered 502",
        "a proxy's page or a stack trace is for the log"
    );
    assert_eq!(reason(429, ""), "answered 429");
}

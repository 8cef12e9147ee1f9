//! What an external system's refusal means for a delivery: only a business
//! refusal fails the operation; whatever may mean the request was taken after
//! all is a lost answer for the reconciler; whatever says nothing was taken is
//! sent again with the same key.

use idempotency::outbox::Delivery;

fn kind(status: u16, code: Option<&str>) -> &'static str {
    match Delivery::from_refusal(status, code, String::new()) {
        Delivery::Accepted { .. } => "accepted",
        Delivery::Refused { .. } => "refused",
        Delivery::NotAccepted { .. } => "sent again",
        Delivery::AnswerLost { .. } => "looked up",
    }
}

#[test]
fn only_a_business_refusal_is_final_and_anything_that_may_have_been_taken_is_looked_up() {
    let table = [
        (402, Some("charge_declined"), "refused"),
        (400, Some("invalid_request"), "refused"),
        (404, Some("not_found"), "refused"),
        (409, Some("refund_exceeds_charge"), "refused"),
        (422, Some("idempotency_key_reused"), "looked up"),
        (409, Some("idempotency_key_reused"), "looked up"),
        (409, None, "looked up"),
        (500, Some("internal_error"), "looked up"),
        (502, None, "looked up"),
        (503, Some("provider_unavailable"), "sent again"),
        (429, None, "sent again"),
        (408, None, "sent again"),
        (401, Some("unauthenticated"), "sent again"),
        (403, None, "sent again"),
    ];
    for (status, code, expected) in table {
        assert_eq!(kind(status, code), expected, "{status} {code:?}");
    }
}

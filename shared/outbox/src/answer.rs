//! What the external system said: to a delivery ([`Delivery`], and the one
//! place an answer that is not 2xx is read, [`Delivery::from_refusal`]) and to
//! a lookup ([`Lookup`]). See docs/design.md §5.

/// What sending an event came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The external system took it; `external_ref` is its id for what it made.
    Accepted { external_ref: String },
    /// The external system refused it, finally; nothing happened (a business
    /// refusal: sending it again would be refused again).
    Refused { reason: String },
    /// Nothing happened, and it may work later: a connection that never
    /// opened, a refusal at the door. Sent again later, with the same key.
    NotAccepted { reason: String },
    /// It was sent and no answer came back, or one that may mean it is still
    /// in flight: it may or may not have happened.
    AnswerLost { reason: String },
}

impl Delivery {
    /// Its name in the deliveries metric.
    pub fn result(&self) -> &'static str {
        match self {
            Delivery::Accepted { .. } => "accepted",
            Delivery::Refused { .. } => "refused",
            Delivery::NotAccepted { .. } => "not_accepted",
            Delivery::AnswerLost { .. } => "answer_lost",
        }
    }

    /// What an answer that is not 2xx means for the request, read from its
    /// status and its problem body (RFC 9457, whose `code` it looks at); the
    /// one place a client decides it. Only an answer that says "not done,
    /// and never will be" is final: a 4xx business refusal, or a 409 whose
    /// code is one of `final_conflicts` (the external system's business
    /// refusals that come as 409, such as a refund past its charge).
    ///
    /// Whatever may mean the request is still in flight or was taken after
    /// all leaves it unknown, for the reconciler to ask about before anything
    /// is sent again: any other 409 (a request with the key is being
    /// processed), a reused key (what holds it may be ours, sent before in
    /// another shape: the lookup tells), 425, a 429 that says why, and every
    /// 5xx — a 503 too, since a gateway says it when its upstream took the
    /// request and then timed out.
    ///
    /// Only what cannot have reached the work is sent again as it is, with
    /// the same key: a bare 429 (rate limited at the door), 408 (the request
    /// never arrived whole), and a refusal of who we are (401, 403).
    pub fn from_refusal(status: u16, body: &str, final_conflicts: &[&str]) -> Delivery {
        let problem = serde_json::from_str::<Problem>(body).ok();
        let reason = refusal_reason(status, problem.as_ref(), body);
        let code = problem.and_then(|p| p.code);
        match (status, code.as_deref()) {
            (401 | 403 | 408, _) => Delivery::NotAccepted { reason },
            (429, _) if body.trim().is_empty() => Delivery::NotAccepted { reason },
            (_, Some(KEY_REUSED)) => Delivery::AnswerLost { reason },
            (409, Some(code)) if final_conflicts.contains(&code) => Delivery::Refused { reason },
            (409 | 425 | 429 | 500..=599, _) => Delivery::AnswerLost { reason },
            // a decline, an invalid request, an unknown charge: the same request would be refused again
            _ => Delivery::Refused { reason },
        }
    }
}

/// The code with which an external system refuses a key it holds for another request.
const KEY_REUSED: &str = "idempotency_key_reused";

/// What a client may read of a problem body (RFC 9457).
#[derive(serde::Deserialize)]
struct Problem {
    code: Option<String>,
    detail: Option<String>,
}

/// A refusal in words people may read (an operation's last error, a
/// deployment's history): its status, and a problem body's `code` and
/// `detail`, which the external system wrote for clients. Any other body (a
/// proxy's HTML page, a stack trace) goes to the log only.
fn refusal_reason(status: u16, problem: Option<&Problem>, body: &str) -> String {
    let Some(problem) = problem else {
        if !body.trim().is_empty() {
            let excerpt: String = body.chars().take(500).collect();
            tracing::warn!(status, body = %excerpt, "an external system answered with a body that is not a problem");
        }
        return format!("answered {status}");
    };
    let mut reason = format!("answered {status}");
    if let Some(code) = &problem.code {
        reason.push_str(&format!(" {code}"));
    }
    if let Some(detail) = &problem.detail {
        reason.push_str(&format!(": {}", detail.chars().take(200).collect::<String>()));
    }
    reason
}

/// What the external system knows of an event, asked by its key or reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The work the event asked for, under this reference: it took effect.
    Found { external_ref: String },
    /// No trace of it under the key nor under the reference.
    Absent,
    /// Something under the key or the reference that is not what the event
    /// asked for (another amount, another release), under `external_ref`:
    /// never taken for the event's work, and not "nothing" either. A person
    /// must look (`reason` says what differs).
    Mismatch { external_ref: String, reason: String },
}

/// Whether `id` has an external id's documented form: 1 to 200 letters,
/// digits, `_` and `-` (docs/contract.md §5). An id from outside is data,
/// and the service's rows keep only ids of this form, whoever gave them: a
/// person (the resolution refuses another with 400) or the external system
/// itself (below).
pub fn is_external_id(id: &str) -> bool {
    (1..=200).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Delivery {
    /// An acceptance whose id is not of an external id's form is not an
    /// answer that can be kept: the work may have been taken, so it is left
    /// to the reconciler, as a lost answer is.
    pub(crate) fn checked(self) -> Delivery {
        match self {
            Delivery::Accepted { external_ref } if !is_external_id(&external_ref) => {
                tracing::warn!(id = %external_ref.escape_debug(), "an external system accepted work under an id not of an id's form");
                Delivery::AnswerLost {
                    reason: "accepted, under an id that is not of an external id's form".into(),
                }
            }
            delivery => delivery,
        }
    }
}

impl Lookup {
    /// Work found under an id not of an external id's form is never taken
    /// for the operation's: a person must look, as at any other mismatch.
    pub(crate) fn checked(self) -> Lookup {
        match self {
            Lookup::Found { external_ref } if !is_external_id(&external_ref) => {
                tracing::warn!(id = %external_ref.escape_debug(), "an external system holds the work under an id not of an id's form");
                Lookup::Mismatch {
                    external_ref,
                    reason: "the external system holds this operation's work under an id that is not of an external \
                             id's form: a person must look"
                        .into(),
                }
            }
            lookup => lookup,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acceptance_under_an_id_not_of_an_ids_form_is_left_to_the_reconciler() {
        let kept = Delivery::Accepted {
            external_ref: "ch_01a2-b3".into(),
        };
        assert_eq!(kept.clone().checked(), kept);
        for id in ["", "x/../../admin/faults", "ch 1", "ch%2F1", "..", &"a".repeat(201)] {
            let delivery = Delivery::Accepted {
                external_ref: id.to_owned(),
            };
            assert!(
                matches!(delivery.checked(), Delivery::AnswerLost { .. }),
                "{id:?} is never kept"
            );
        }
    }

    #[test]
    fn work_found_under_an_id_not_of_an_ids_form_is_never_taken_for_the_operations() {
        let found = Lookup::Found {
            external_ref: "ro_1".into(),
        };
        assert_eq!(found.clone().checked(), found);
        let odd = Lookup::Found {
            external_ref: "ro_1/cancel".into(),
        };
        assert!(matches!(odd.checked(), Lookup::Mismatch { .. }));
        assert_eq!(Lookup::Absent.checked(), Lookup::Absent);
    }
}

//! The problem codes every service may answer with (docs/contract.md §11):
//! one table that the docs page, the OpenAPI schema and the tests all read.

/// Every problem `code` a service may answer with, and what it means; the
/// docs page lists them, and each problem's `type` points at its entry.
pub const PROBLEM_CODES: &[(&str, u16, &str)] = &[
    (
        "unauthenticated",
        401,
        "No `Authorization: Bearer` key, or an unknown one.",
    ),
    ("forbidden", 403, "The key's role may not do this."),
    (
        "not_found",
        404,
        "No such resource in the caller's account (another account's ids are 404 too).",
    ),
    (
        "unsupported_media_type",
        415,
        "The body is not `application/json` in UTF-8.",
    ),
    (
        "request_timeout",
        408,
        "The request body did not arrive within the server's time limit. Nothing was claimed: send it again with the same key.",
    ),
    (
        "payload_too_large",
        413,
        "The body is larger than the service reads (64 KiB).",
    ),
    (
        "method_not_allowed",
        405,
        "The route exists but does not take this method.",
    ),
    (
        "invalid_request",
        400,
        "The body or query failed validation; `errors` lists each `{field, message}`. Nothing was claimed: the same key may be used with a fixed body.",
    ),
    (
        "idempotency_key_missing",
        400,
        "A POST that creates an effect needs an `Idempotency-Key` header.",
    ),
    (
        "idempotency_key_invalid",
        400,
        "The key is not 1-255 visible ASCII characters (bare, or an RFC 8941 quoted string).",
    ),
    (
        "idempotency_key_reused",
        422,
        "The key already names an operation with a different request (another body, route or account). Only `operation_id` and `state` of that operation are returned.",
    ),
    (
        "request_in_progress",
        409,
        "An earlier attempt with this key is still running. Wait `Retry-After` seconds (or send `Prefer: wait=N`) and retry with the same key, or poll `status_url`.",
    ),
    (
        "operation_outcome_unknown",
        409,
        "An external effect may or may not have happened. The operation is not executed again; poll `status_url`.",
    ),
    (
        "approval_fingerprint_mismatch",
        409,
        "The `fingerprint` sent with the decision is not the operation's: the approver saw another request. Nothing was decided.",
    ),
    (
        "approval_rejected",
        409,
        "A human rejected this operation; it never runs. Every retry with the key gets this answer; a new intention needs a new key.",
    ),
    (
        "approval_expired",
        409,
        "Nobody approved this operation in time (or it was not run before its approval expired); it never runs. A new attempt needs a new key.",
    ),
    (
        "approval_stale",
        409,
        "What the approver was promised no longer holds when the approved operation runs (the release a deployment replaces, and so whether it can be rolled back); `detail` says what changed. It never runs, and every retry with the key gets this answer; a new intention needs a new key and a new approval.",
    ),
    (
        "order_already_has_payment",
        409,
        "The order already has a live payment intent (made under another key); `payment_intent_id` names it. Cancel it first, or use it.",
    ),
    (
        "refund_exceeds_captured",
        409,
        "The refunds of a capture would add up to more than it captured (refunds whose outcome is not known yet count). `amount_captured`, `amount_refunded` and `amount_refundable` say what is left.",
    ),
    (
        "mutable_reference_rejected",
        400,
        "A deployment names a release by something that can change: a tag, a branch, `latest`, a short SHA. Send `artifact_digest` as `sha256:` and 64 lowercase hex digits, and `commit_sha` as all 40 hex digits; `field` names which.",
    ),
    (
        "unknown_environment",
        400,
        "A deployment or rollback names an environment that is not configured; the problem names those that are. Nothing was claimed.",
    ),
    (
        "environment_locked",
        409,
        "Another deployment or rollback may be changing this environment (queued, running, or unknown). `deployment_id` and `operation_id` name it: poll it, or cancel it.",
    ),
    (
        "invalid_state",
        409,
        "The resource's current state does not allow this action.",
    ),
    (
        "external_ref_mismatch",
        422,
        "A resolution's `external_ref` is not what the external system holds for this operation (under its key or reference, of its amount and currency, or its release and target). Nothing was written; the refusal is journaled (`external_ref_refused`).",
    ),
    (
        "external_outcome_exists",
        409,
        "A resolution says `failed` while the external system holds something under the operation's key or reference; `external_ref` names it when it is the operation's own work. Nothing was written.",
    ),
    (
        "external_system_unavailable",
        503,
        "The external system could not be asked whether a resolution is so. Nothing was written: send it again after `Retry-After` seconds.",
    ),
    (
        "version_mismatch",
        409,
        "`expected_version` is stale; read the resource again.",
    ),
    (
        "too_many_connections",
        503,
        "The server holds as many connections as it may. Nothing of the request was read, so nothing was claimed: send it again after `Retry-After` seconds (with the same key).",
    ),
    (
        "database_unavailable",
        503,
        "The service cannot reach its database, or lost it under the request's commit, or no connection to it came free in time (the database is unreachable or busy: from the service the two look the same). Whether the request took effect is not known here: send it again with the same key after `Retry-After` seconds, and that attempt finds out.",
    ),
    (
        "internal_error",
        500,
        "The server failed and committed nothing; retry with the same key.",
    ),
];

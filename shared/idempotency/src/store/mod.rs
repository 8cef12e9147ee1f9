//! The operations table, on both backends: the claim by its primary key, the
//! takeover and completion by compare-and-set (docs/design.md §2, §3).

/// Every column of an operation's row ([`row::OperationRow`]).
macro_rules! columns {
    () => {
        "account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state, \
     lease_token, locked_until, attempts, response_status, response_content_type, response_location, response_body, \
     resource_type, resource_id, resource_url, external_ref, approval_id, created_at, updated_at"
    };
}

/// Binds a [`Completion`] as ten parameters: state; answer status, content
/// type, location, body; resource type, id, url; external reference; time.
macro_rules! bind_completion {
    ($query:expr, $c:expr) => {
        $query
            .bind($c.state.into_str())
            .bind(i32::from($c.response.status.as_u16()))
            .bind(&$c.response.content_type)
            .bind($c.response.location.as_deref())
            .bind(&$c.response.body)
            .bind($c.resource.map(|r| r.kind.as_str()))
            .bind($c.resource.map(|r| r.id.as_str()))
            .bind($c.resource.map(|r| r.url.as_str()))
            .bind($c.external_ref)
            .bind($c.now)
    };
}

mod claim;
mod complete;
mod read;
mod reap;
mod row;

pub use claim::{NewOperation, claim, claim_awaiting_approval, claim_finished};
pub use complete::{Completion, complete, give_back, hold};
pub use read::{add_attempts, find_by_id, find_by_key};
pub use reap::reap;

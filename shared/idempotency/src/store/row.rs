//! A row of `idempotency_operations`, and the [`OperationRecord`] it stands for.

use axum::http::StatusCode;
use platform::Timestamp;

use crate::{
    fingerprint::Fingerprint,
    key::IdempotencyKey,
    operation::{OperationRecord, OperationState, ResourceRef, StoredResponse},
};

/// Every column of `columns!()`, by name, on either backend.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct OperationRow {
    account_id: String,
    idempotency_key: String,
    operation_id: String,
    principal_id: String,
    method: String,
    route: String,
    fingerprint: String,
    state: String,
    lease_token: Option<String>,
    locked_until: Option<Timestamp>,
    attempts: i32,
    response_status: Option<i32>,
    response_content_type: Option<String>,
    response_location: Option<String>,
    response_body: Option<Vec<u8>>,
    resource_type: Option<String>,
    resource_id: Option<String>,
    resource_url: Option<String>,
    external_ref: Option<String>,
    approval_id: Option<String>,
    created_at: Timestamp,
    updated_at: Timestamp,
}

impl TryFrom<OperationRow> for OperationRecord {
    type Error = sqlx::Error;

    fn try_from(row: OperationRow) -> Result<Self, sqlx::Error> {
        let corrupt = |what: &str| sqlx::Error::Decode(format!("idempotency_operations: {what}").into());
        let state: OperationState = row.state.parse().map_err(|_| corrupt("unknown state"))?;
        let response = match (row.response_status, row.response_body) {
            (Some(status), Some(body)) => Some(StoredResponse {
                status: u16::try_from(status)
                    .ok()
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .ok_or_else(|| corrupt("invalid status"))?,
                content_type: row.response_content_type.unwrap_or_else(|| "application/json".into()),
                location: row.response_location,
                body,
            }),
            _ => None,
        };
        let resource = match (row.resource_type, row.resource_id, row.resource_url) {
            (Some(kind), Some(id), Some(url)) => Some(ResourceRef { kind, id, url }),
            _ => None,
        };
        Ok(OperationRecord {
            account_id: row.account_id,
            // stored unquoted: parsing it again would unquote a key that begins with `"`
            key: IdempotencyKey::from_stored(row.idempotency_key),
            operation_id: row.operation_id,
            principal_id: row.principal_id,
            method: row.method,
            route: row.route,
            fingerprint: Fingerprint::from_stored(row.fingerprint),
            state,
            lease_token: row.lease_token,
            locked_until: row.locked_until,
            attempts: row.attempts,
            response,
            resource,
            external_ref: row.external_ref,
            approval_id: row.approval_id,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

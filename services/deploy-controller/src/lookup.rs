//! Lookups by idempotency key and by reference: how a reconciler learns
//! what a request whose answer was lost did.

use axum::{Json, extract::State};
use platform::{ApiError, ApiQuery, simulated::Tenant};
use serde::{Deserialize, Serialize};

use crate::{Controller, Rollout};

/// `?idempotency_key=` or `?reference=`: how a reconciler finds out what a
/// request whose answer was lost did.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Lookup {
    idempotency_key: Option<String>,
    reference: Option<String>,
}

#[derive(Debug, Serialize)]
pub(super) struct List {
    data: Vec<Rollout>,
}

pub(super) async fn find_rollouts(
    State(controller): State<Controller>,
    tenant: Tenant,
    ApiQuery(lookup): ApiQuery<Lookup>,
) -> Result<Json<List>, ApiError> {
    if lookup.idempotency_key.is_none() && lookup.reference.is_none() {
        return Err(ApiError::invalid_field(
            "idempotency_key",
            "give idempotency_key or reference",
        ));
    }
    let data = controller
        .lock()
        .rollouts
        .iter()
        .filter(|(t, r)| {
            *t == tenant
                && lookup.idempotency_key.as_deref().is_none_or(|k| k == r.idempotency_key)
                && lookup.reference.as_deref().is_none_or(|k| k == r.reference)
        })
        .map(|(_, r)| r.clone())
        .collect();
    Ok(Json(List { data }))
}

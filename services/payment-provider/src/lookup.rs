//! Lookups by idempotency key, by merchant reference and by id: how a
//! reconciler learns what a request whose answer was lost did.

use axum::{Json, extract::State};
use platform::{ApiError, ApiPath, ApiQuery, simulated::Tenant};
use serde::{Deserialize, Serialize};

use crate::{Charge, Provider, Refund};

/// `?idempotency_key=` or `?merchant_reference=`: how a reconciler finds out
/// what a request whose answer was lost did.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Lookup {
    idempotency_key: Option<String>,
    merchant_reference: Option<String>,
}

#[derive(Debug, Serialize)]
pub(super) struct List<T> {
    data: Vec<T>,
}

impl Lookup {
    /// A lookup names a key or a reference (or both), whatever is stored.
    fn checked(self) -> Result<Self, ApiError> {
        if self.idempotency_key.is_none() && self.merchant_reference.is_none() {
            return Err(ApiError::invalid_field(
                "idempotency_key",
                "give idempotency_key or merchant_reference",
            ));
        }
        Ok(self)
    }

    fn matches(&self, key: &str, reference: &str) -> bool {
        self.idempotency_key.as_deref().is_none_or(|k| k == key)
            && self.merchant_reference.as_deref().is_none_or(|r| r == reference)
    }
}

pub(super) async fn find_charges(
    State(provider): State<Provider>,
    Tenant(merchant): Tenant,
    ApiQuery(lookup): ApiQuery<Lookup>,
) -> Result<Json<List<Charge>>, ApiError> {
    let lookup = lookup.checked()?;
    let data = provider
        .lock()
        .charges
        .iter()
        .filter(|(m, c)| *m == merchant && lookup.matches(&c.idempotency_key, &c.merchant_reference))
        .map(|(_, c)| c.clone())
        .collect();
    Ok(Json(List { data }))
}

pub(super) async fn find_refunds(
    State(provider): State<Provider>,
    Tenant(merchant): Tenant,
    ApiQuery(lookup): ApiQuery<Lookup>,
) -> Result<Json<List<Refund>>, ApiError> {
    let lookup = lookup.checked()?;
    let data = provider
        .lock()
        .refunds
        .iter()
        .filter(|(m, r)| *m == merchant && lookup.matches(&r.idempotency_key, &r.merchant_reference))
        .map(|(_, r)| r.clone())
        .collect();
    Ok(Json(List { data }))
}

pub(super) async fn get_charge(
    State(provider): State<Provider>,
    Tenant(merchant): Tenant,
    ApiPath(charge_id): ApiPath<String>,
) -> Result<Json<Charge>, ApiError> {
    provider
        .lock()
        .charges
        .iter()
        .find(|(m, c)| *m == merchant && c.id == charge_id)
        .map(|(_, c)| Json(c.clone()))
        .ok_or_else(|| ApiError::not_found(format!("charge `{charge_id}`")))
}

//! The admin routes: the faults in force, the count of what was really
//! made, and the events in order.

use axum::{Json, extract::State};
use platform::{ApiJson, simulated::SimulatedEvent};

use crate::{Faults, Provider, Stats};

pub(super) async fn get_faults(State(provider): State<Provider>) -> Json<Faults> {
    Json(provider.lock().faults.clone())
}

/// Replaces the faults in force (an empty object clears them all).
pub(super) async fn put_faults(State(provider): State<Provider>, ApiJson(faults): ApiJson<Faults>) -> Json<Faults> {
    tracing::info!(?faults, "faults switched");
    provider.set_faults(faults.clone());
    Json(faults)
}

pub(super) async fn get_stats(State(provider): State<Provider>) -> Json<Stats> {
    Json(provider.stats())
}

/// What the provider did, in order: for timelines.
pub(super) async fn get_events(State(provider): State<Provider>) -> Json<Vec<SimulatedEvent>> {
    Json(provider.events())
}

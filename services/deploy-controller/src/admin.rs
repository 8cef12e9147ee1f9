//! The admin routes: the faults in force, the count of what was really
//! started, and the events in order.

use axum::{Json, extract::State};
use platform::{ApiError, ApiJson, simulated::SimulatedEvent};

use crate::{Controller, Faults, Stats};

pub(super) async fn get_faults(State(controller): State<Controller>) -> Json<Faults> {
    Json(controller.lock().faults.clone())
}

/// Replaces the faults in force (an empty object clears them all). A crash
/// is refused where it would take other services down with the controller.
pub(super) async fn put_faults(
    State(controller): State<Controller>,
    ApiJson(faults): ApiJson<Faults>,
) -> Result<Json<Faults>, ApiError> {
    if faults.crash_next_rollout > 0 && !controller.config.may_exit {
        return Err(ApiError::invalid_field(
            "crash_next_rollout",
            "this controller shares its process with other services (the sandbox): run it alone \
             (`cargo run -p deploy-controller`) to crash it",
        ));
    }
    tracing::info!(?faults, "faults switched");
    controller.set_faults(faults.clone());
    Ok(Json(faults))
}

pub(super) async fn get_stats(State(controller): State<Controller>) -> Json<Stats> {
    Json(controller.stats())
}

/// What the controller did since it started, in order: for timelines.
pub(super) async fn get_events(State(controller): State<Controller>) -> Json<Vec<SimulatedEvent>> {
    Json(controller.events())
}

//! The deployments API (docs/contract.md §7 Deployments). Each handler reads:
//! authenticate, parse into a validated command (immutable references only),
//! ask the policy whether a human must look, hand the command and its
//! business write to the idempotency layer, answer what it answers.
//!
//! Every POST has [the shape of a route](idempotency#how-a-route-is-shaped):
//! parse → read-only lookups → `execute` with a closure doing every write → answer.

use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use idempotency::{Attempt, Effect, Idempotency, IdempotencyHeaders, OperationState, OptionalIdempotencyHeaders};
use platform::{
    ApiError, ApiJson, ApiPath, ApiQuery, Principal, Tx,
    page::{Page, PageRequest},
};
use serde::Deserialize;

use crate::{
    App,
    controller::{ROLLOUT, RolloutOrder},
    domain::{
        CancelDeployment, CreateDeployment, CreateDeploymentBody, Deployment, DeploymentKind, DeploymentState,
        Environment, RollbackBody,
    },
    store::{self, NewDeployment, Replacing},
};

pub const CREATE_DEPLOYMENT: &str = "/v1/deployments";
pub const CANCEL_DEPLOYMENT: &str = "/v1/deployments/{deployment_id}/cancel";
pub const CREATE_ROLLBACK: &str = "/v1/rollbacks";

pub fn router() -> Router<App> {
    Router::new()
        .route(CREATE_DEPLOYMENT, post(create_deployment).get(list_deployments))
        .route("/v1/deployments/{deployment_id}", get(get_deployment))
        .route(CANCEL_DEPLOYMENT, post(cancel_deployment))
        .route(CREATE_ROLLBACK, post(create_rollback))
        .route("/v1/rollbacks/{rollback_id}", get(get_rollback))
        .route("/v1/environments/{service}/{environment}", get(get_environment))
}

/// The 202 of a deployment or rollback: the record, `queued`, and the rollout
/// handed to the outbox with a controller key derived from the request.
fn queued(deployment: &Deployment) -> Effect {
    let kind = deployment.kind.as_str();
    let order = RolloutOrder {
        deployment_id: deployment.id.clone(),
        kind: kind.to_owned(),
        service: deployment.service.clone(),
        environment: deployment.environment.clone(),
        artifact_digest: deployment.artifact_digest.as_str().to_owned(),
        commit_sha: deployment.commit_sha.as_ref().map(|c| c.as_str().to_owned()),
    };
    Effect::json(StatusCode::ACCEPTED, deployment)
        .with_resource(kind, &deployment.id, deployment.status_url.clone())
        .with_handoff(outbox::Event::new(ROLLOUT, &order))
}

/// Deploy an artifact, by its digest, to an environment. Answers 202 with the
/// deployment `queued` and its `status_url`; the rollout goes to the
/// controller through the outbox, and the deployment shows how it goes. One
/// deployment at a time per environment; a production one waits for a human.
#[utoipa::path(
    post,
    path = "/v1/deployments",
    tag = "deployments",
    request_body = CreateDeploymentBody,
    params(("Idempotency-Key" = String, Header, description = "Made once per intended deployment; the same on every retry")),
    responses(
        (status = 202, description = "Accepted: the deployment, `queued`; or, for production, the approval request", body = approvals::AcceptedOrAwaitingApproval<Deployment>),
        (status = 400, description = "`mutable_reference_rejected` (a tag, a branch, `latest`, a short SHA), `unknown_environment` (not configured; `known_environments` names the ones there are), or `invalid_request`; nothing was claimed", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`environment_locked` (the holder's `deployment_id` and `operation_id`) or `version_mismatch`; for production, `approval_rejected`, `approval_expired`, or `approval_stale`: the release it replaces is no longer the one the approver was told, so it will never run", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 422, description = "`idempotency_key_reused`: the same key with another digest, commit or environment", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn create_deployment(
    State(app): State<App>,
    principal: Principal,
    key: IdempotencyHeaders,
    ApiJson(body): ApiJson<CreateDeploymentBody>,
) -> Response {
    let command = match CreateDeployment::try_from(body).and_then(|command| {
        app.policy.known(&command.environment)?;
        Ok(command)
    }) {
        Ok(command) => command,
        Err(invalid) => return invalid.into_response(),
    };
    // what a human would judge includes the release this one replaces, read
    // before anything is claimed (the lock is not: a retry of this very
    // deployment would find itself holding it)
    let environment = if app.policy.wants_approval(&command.environment) {
        match store::environment(&app.db, &principal.account_id, &command.service, &command.environment).await {
            Ok(environment) => Some(environment),
            Err(error) => return error.into_response(),
        }
    } else {
        None
    };
    // what the approver is told it replaces is all it may replace: the effect holds that under the lock
    let promised = environment.as_ref().map(|environment| environment.current.as_ref());
    let approval = promised.and_then(|current| app.policy.approval_for_deployment(&command, current));
    let replacing = promised.map_or(Replacing::Current, |current| {
        Replacing::AsApproved(current.map(|c| c.id.as_str()))
    });
    app.idempotency
        .execute(
            Attempt::post(CREATE_DEPLOYMENT, &principal, key).approval(approval),
            &command,
            async |tx, operation| {
                let new = NewDeployment {
                    kind: DeploymentKind::Deployment,
                    service: &command.service,
                    environment: &command.environment,
                    artifact_digest: &command.artifact_digest,
                    commit_sha: command.commit_sha.as_ref(),
                    restores: None,
                    reason: None,
                    expected_current: command.expected_current_deployment_id.as_deref(),
                    replacing,
                };
                let deployment = store::create(tx, operation, &new).await?;
                Ok(queued(&deployment))
            },
        )
        .await
}

/// Roll an environment back to a release that succeeded there. A rollback is
/// a new intention — its own key, its own operation, its own approval, always
/// — never a retry of the deployment it undoes. It takes the environment's
/// lock like a deployment, and says what it `replaces` and what it `restores`.
#[utoipa::path(
    post,
    path = "/v1/rollbacks",
    tag = "deployments",
    request_body = RollbackBody,
    params(("Idempotency-Key" = String, Header, description = "Made once per intended rollback")),
    responses(
        (status = 202, description = "The approval request; once approved, the retry answers 202 with the rollback, `queued`", body = approvals::AcceptedOrAwaitingApproval<Deployment>),
        (status = 400, description = "`unknown_environment` (not configured; `known_environments` names the ones there are) or `invalid_request`; nothing was claimed", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such target in this account; nothing was claimed", body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`invalid_state`: the target never succeeded in this environment, or is its current release; `environment_locked`; `approval_rejected`, `approval_expired`, or `approval_stale`: the release it replaces is no longer the one the approver was told, so it will never run", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn create_rollback(
    State(app): State<App>,
    principal: Principal,
    key: IdempotencyHeaders,
    ApiJson(body): ApiJson<RollbackBody>,
) -> Response {
    if let Err(unknown) = app.policy.known(&body.environment) {
        return unknown.into_response();
    }
    let (target, current) = match rollback_target(&app, &principal, &body).await {
        Ok(found) => found,
        Err(refused) => return refused.into_response(),
    };
    let approval = app.policy.approval_for_rollback(&body, &target, current.as_ref());
    app.idempotency
        .execute(
            Attempt::post(CREATE_ROLLBACK, &principal, key).approval(Some(approval)),
            &body,
            async |tx, operation| {
                let new = NewDeployment {
                    kind: DeploymentKind::Rollback,
                    service: &body.service,
                    environment: &body.environment,
                    artifact_digest: &target.artifact_digest,
                    commit_sha: target.commit_sha.as_ref(),
                    restores: Some(&target.id),
                    reason: Some(&body.reason),
                    expected_current: None,
                    replacing: Replacing::AsApproved(current.as_ref().map(|c| c.id.as_str())),
                };
                let rollback = store::create(tx, operation, &new).await?;
                Ok(queued(&rollback))
            },
        )
        .await
}

/// The release a rollback restores, and the one it replaces: the target must
/// have succeeded in that environment and not be its current release. Read
/// before anything is claimed: a human is never asked to approve a rollback
/// that cannot run.
async fn rollback_target(
    app: &App,
    principal: &Principal,
    body: &RollbackBody,
) -> Result<(Deployment, Option<Deployment>), ApiError> {
    let account = &principal.account_id;
    let target = store::get(&app.db, account, &body.to_deployment_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("deployment `{}`", body.to_deployment_id)))?;
    if target.service != body.service || target.environment != body.environment {
        return Err(ApiError::invalid_state(format!(
            "{} was a release of {} in {}, not of {} in {}",
            target.id, target.service, target.environment, body.service, body.environment
        )));
    }
    if target.state != DeploymentState::Succeeded {
        return Err(ApiError::invalid_state(format!(
            "{} never succeeded in {} (it is `{}`): there is nothing of it to restore",
            target.id,
            body.environment,
            target.state.as_str()
        ))
        .with("state", target.state));
    }
    let current = store::environment(&app.db, account, &body.service, &body.environment)
        .await?
        .current;
    if current.as_ref().is_some_and(|c| c.id == target.id) {
        return Err(ApiError::invalid_state(format!(
            "{} is the current release of {} in {} already",
            target.id, body.service, body.environment
        )));
    }
    Ok((target, current))
}

/// Cancel a deployment or rollback that has not finished: before the
/// controller has it, it is withdrawn from the outbox; once the controller
/// has it, the controller is asked to stop it. A cancel needs no key:
/// without one it is journaled `state_changed`, and cancelling what is
/// cancelled answers 200, unchanged, journaling nothing. With a key, it is
/// an operation like any other.
///
/// The controller is asked only once the request is on record, and the
/// cancel is recorded after its answer, which decides it: with a key, the
/// claim commits first and the controller is asked under the operation's
/// lease ([`idempotency::Idempotency::execute_calling_out`]), so a replay, a
/// 409 or a 422 never reaches it; with none, the deployment's history names
/// who asked before the controller is asked. (Through the outbox, the answer
/// would be a 202 with the deployment still running: a cancel that says
/// "cancelled" or "it had finished" needs the controller's answer first.)
#[utoipa::path(
    post,
    path = "/v1/deployments/{deployment_id}/cancel",
    tag = "deployments",
    params(
        ("deployment_id" = String, Path),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional: honoured when sent"),
    ),
    responses(
        (status = 200, description = "Cancelled (now, or already)", body = Deployment),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`invalid_state`: it has finished, its fate is unknown, or it is being handed to the controller (`Retry-After`)", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn cancel_deployment(
    State(app): State<App>,
    principal: Principal,
    OptionalIdempotencyHeaders(key): OptionalIdempotencyHeaders,
    ApiPath(deployment_id): ApiPath<String>,
) -> Response {
    let command = CancelDeployment { deployment_id };
    // the controller is asked outside any transaction, so no write waits on
    // another service meanwhile; its cancel is idempotent
    let Some(key) = key else {
        let cancelled = async {
            let mut tx = app.db.begin().await?;
            record_cancel_request(&mut tx, &principal, &command.deployment_id).await?;
            tx.commit().await?;
            let stopped = stop_at_the_controller(&app, &principal, &command.deployment_id).await?;
            let mut tx = app.db.begin().await?;
            let (deployment, changed) =
                cancel(&app.idempotency, &mut tx, &principal, &command.deployment_id, stopped).await?;
            if changed {
                let change =
                    journal::StateChange::new(deployment.kind.as_str(), &deployment.id, deployment.state.as_str());
                journal::record_state_change(&mut tx, &principal, CANCEL_DEPLOYMENT, change).await?;
            }
            tx.commit().await?;
            Ok::<_, ApiError>(deployment)
        };
        return match cancelled.await {
            Ok(deployment) => Json(deployment).into_response(),
            Err(error) => error.into_response(),
        };
    };
    app.idempotency
        .execute_calling_out(
            Attempt::post(CANCEL_DEPLOYMENT, &principal, key),
            &command,
            async |_| stop_at_the_controller(&app, &principal, &command.deployment_id).await,
            async |tx, _, stopped| {
                let (deployment, _) = cancel(&app.idempotency, tx, &principal, &command.deployment_id, stopped).await?;
                let (id, url) = (deployment.id.clone(), deployment.status_url.clone());
                Ok(Effect::json(StatusCode::OK, &deployment).with_resource(deployment.kind.as_str(), &id, url))
            },
        )
        .await
}

/// If the controller has the deployment's rollout and it has not ended, asks
/// the controller to stop it: `Some(true)` stopped, `Some(false)` it had
/// finished, `None` not asked. [`cancel`] then reads the deployment again and
/// decides.
async fn stop_at_the_controller(
    app: &App,
    principal: &Principal,
    deployment_id: &str,
) -> Result<Option<bool>, ApiError> {
    let Some(deployment) = store::get(&app.db, &principal.account_id, deployment_id).await? else {
        return Ok(None);
    };
    match rollout_to_stop(&deployment) {
        Some(rollout_id) => Ok(Some(app.controller.cancel(rollout_id).await?)),
        None => Ok(None),
    }
}

/// The controller's rollout of a deployment, while the controller may still stop it.
fn rollout_to_stop(deployment: &Deployment) -> Option<&str> {
    match (deployment.state, &deployment.controller_rollout_id) {
        (DeploymentState::Queued | DeploymentState::Running, Some(rollout_id)) => Some(rollout_id),
        _ => None,
    }
}

/// A cancel without a key has no claim to stand for it: before the
/// controller is asked to stop a rollout, the deployment's history records
/// who asked, so a crash after the controller stopped it leaves the request
/// on record (the watcher then records the cancel itself).
async fn record_cancel_request(tx: &mut Tx, principal: &Principal, deployment_id: &str) -> Result<(), ApiError> {
    let Some(deployment) = store::get_in(tx, &principal.account_id, deployment_id).await? else {
        return Ok(());
    };
    if rollout_to_stop(&deployment).is_some() {
        let note = format!(
            "{} asked to cancel it: the controller is asked to stop it",
            principal.principal_id
        );
        store::note(tx, &principal.account_id, deployment_id, deployment.state, &note).await?;
    }
    Ok(())
}

/// The cancel itself, in `tx`: before the controller has the rollout, its
/// outbox event is withdrawn; once the controller has it (and was asked to
/// stop it), the deployment is cancelled — unless the controller had finished
/// it, which the watcher then records. Either way the operation that asked
/// for it fails with it. `true`: this call cancelled it (`false`: it was
/// cancelled already).
async fn cancel(
    idempotency: &Idempotency,
    tx: &mut Tx,
    principal: &Principal,
    deployment_id: &str,
    stopped_at_the_controller: Option<bool>,
) -> Result<(Deployment, bool), ApiError> {
    let account = &principal.account_id;
    let deployment = store::get_in(tx, account, deployment_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("deployment `{deployment_id}`")))?;
    let active = [DeploymentState::Queued, DeploymentState::Running];
    match (deployment.state, &deployment.controller_rollout_id) {
        (DeploymentState::Cancelled, _) => return Ok((deployment, false)),
        (DeploymentState::Succeeded | DeploymentState::Failed, _) => {
            return Err(ApiError::invalid_state(format!(
                "it has {}: there is nothing to cancel",
                deployment.state.as_str()
            ))
            .with("state", deployment.state));
        }
        (DeploymentState::Unknown, _) => {
            return Err(ApiError::invalid_state(
                "nobody knows yet whether the controller took it: the reconciler is asking; cancel again after `Retry-After`",
            )
            .with("state", deployment.state)
            .with_retry_after(5));
        }
        (_, None) => {
            let withdrawn = outbox::withdraw(
                idempotency,
                tx,
                account,
                &deployment.operation_id,
                &principal.principal_id,
                "cancelled before it reached the controller",
            )
            .await?;
            if !withdrawn {
                return Err(ApiError::invalid_state(
                    "it is being handed to the controller right now: cancel again after `Retry-After`",
                )
                .with("state", deployment.state)
                .with_retry_after(1));
            }
            let note = format!(
                "cancelled by {} before it reached the controller",
                principal.principal_id
            );
            store::change_state(tx, account, deployment_id, &active, DeploymentState::Cancelled, &note).await?;
        }
        (_, Some(_)) if stopped_at_the_controller == Some(false) => {
            return Err(ApiError::invalid_state(
                "the controller had finished the rollout already; its state follows shortly",
            )
            .with("state", deployment.state));
        }
        // the controller took it after this request looked: it was not asked to stop it yet
        (_, Some(_)) if stopped_at_the_controller.is_none() => {
            return Err(
                ApiError::invalid_state("the controller has just taken it: cancel again after `Retry-After`")
                    .with("state", deployment.state)
                    .with_retry_after(1),
            );
        }
        (_, Some(_)) => {
            let note = format!("cancelled at the controller by {}", principal.principal_id);
            if !store::change_state(tx, account, deployment_id, &active, DeploymentState::Cancelled, &note).await? {
                return Err(ApiError::internal("the deployment changed while it was cancelled"));
            }
            outbox::finish(
                idempotency,
                tx,
                account,
                &deployment.operation_id,
                OperationState::Failed,
                &principal.principal_id,
            )
            .await?;
        }
    }
    let cancelled = store::get_in(tx, account, deployment_id)
        .await?
        .ok_or_else(|| ApiError::internal("a cancelled deployment disappeared"))?;
    Ok((cancelled, true))
}

/// A deployment or rollback with every state it went through: what an agent
/// polls after a timeout.
#[utoipa::path(
    get,
    path = "/v1/deployments/{deployment_id}",
    tag = "deployments",
    params(("deployment_id" = String, Path, description = "`dep_…` or `rb_…`")),
    responses(
        (status = 200, body = Deployment),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_deployment(
    State(app): State<App>,
    principal: Principal,
    ApiPath(deployment_id): ApiPath<String>,
) -> Result<Json<Deployment>, ApiError> {
    store::get(&app.db, &principal.account_id, &deployment_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("deployment `{deployment_id}`")))
}

/// A rollback with every state it went through, at the `status_url` its
/// 202 named: the record `GET /v1/deployments/{id}` reads, a rollback being
/// a deployment of an earlier release.
#[utoipa::path(
    get,
    path = "/v1/rollbacks/{rollback_id}",
    tag = "deployments",
    params(("rollback_id" = String, Path, description = "`rb_…`")),
    responses(
        (status = 200, body = Deployment),
        (status = 404, body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_rollback(
    state: State<App>,
    principal: Principal,
    rollback_id: ApiPath<String>,
) -> Result<Json<Deployment>, ApiError> {
    get_deployment(state, principal, rollback_id).await
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeploymentQuery {
    pub service: Option<String>,
    pub environment: Option<String>,
    /// 1–200, default 50.
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// The account's deployments and rollbacks in creation order, without their history.
#[utoipa::path(
    get,
    path = "/v1/deployments",
    tag = "deployments",
    params(DeploymentQuery),
    responses((status = 200, body = Page<Deployment>)),
    security(("bearer" = []))
)]
pub async fn list_deployments(
    State(app): State<App>,
    principal: Principal,
    ApiQuery(query): ApiQuery<DeploymentQuery>,
) -> Result<Json<Page<Deployment>>, ApiError> {
    let page = PageRequest::parse(query.limit, query.cursor.as_deref())?;
    Ok(Json(
        store::list(
            &app.db,
            &principal.account_id,
            query.service.as_deref(),
            query.environment.as_deref(),
            page,
        )
        .await?,
    ))
}

/// An environment: its current release and who holds its lock. An
/// environment that is not configured is 400 `unknown_environment`, as for a
/// deployment to it: it has no releases, and the answer names the ones there are.
#[utoipa::path(
    get,
    path = "/v1/environments/{service}/{environment}",
    tag = "deployments",
    params(("service" = String, Path), ("environment" = String, Path)),
    responses(
        (status = 200, body = Environment),
        (status = 400, description = "`unknown_environment`: not configured; `known_environments` names the ones there are", body = platform::error::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_environment(
    State(app): State<App>,
    principal: Principal,
    ApiPath((service, environment)): ApiPath<(String, String)>,
) -> Result<Json<Environment>, ApiError> {
    app.policy.known(&environment)?;
    Ok(Json(
        store::environment(&app.db, &principal.account_id, &service, &environment).await?,
    ))
}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(
        create_deployment,
        create_rollback,
        cancel_deployment,
        get_deployment,
        get_rollback,
        list_deployments,
        get_environment
    ),
    components(schemas(
        Deployment,
        CreateDeploymentBody,
        RollbackBody,
        Environment,
        crate::domain::DeploymentKind,
        crate::domain::DeploymentState,
        crate::domain::StateChange,
        crate::domain::LockHolder
    ))
)]
pub struct DeploymentsApi;

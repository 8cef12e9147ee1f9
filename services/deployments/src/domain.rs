//! Deployments in the domain's own words: references that can only be built
//! immutable, the bodies as sent, the validated commands they become (what the
//! fingerprint hashes), the resources the API answers with, and the policy
//! that decides which of them wait for a human.

use std::{collections::BTreeMap, fmt};

use approvals::ApprovalSummary;
use axum::http::StatusCode;
use platform::{ApiError, Timestamp};
use serde::{Deserialize, Serialize};
use validator::Validate;

/// An artifact digest: `sha256:` and 64 lowercase hex digits. A tag or a
/// branch can point at other bytes tomorrow; a digest cannot, so a retry
/// deploys what was approved and nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ArtifactDigest(String);

/// A commit: its full 40-hex-digit SHA, kept lowercase (git's own spelling;
/// the same commit in capitals is the same commit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct CommitSha(String);

/// A reference that names something that can change, or names nothing at all:
/// 400 `mutable_reference_rejected`, with the field and what to send instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MutableReference {
    pub field: &'static str,
    pub message: String,
}

impl From<MutableReference> for ApiError {
    fn from(refused: MutableReference) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "mutable_reference_rejected",
            "Mutable reference rejected",
            format!("`{}` {}", refused.field, refused.message),
        )
        .with("field", refused.field)
    }
}

fn is_hex(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What a reference that is not immutable looks like, in words.
fn what_it_is(text: &str) -> &'static str {
    if text.eq_ignore_ascii_case("latest") {
        "is `latest`, a tag that moves with every release"
    } else if is_hex(text) && text.len() < 40 {
        "is a short SHA: another commit can share its prefix"
    } else if text.contains(':') && !text.starts_with("sha256:") {
        "is an image tag: it can point at other bytes tomorrow"
    } else if text.starts_with("sha256:") {
        "is not a whole sha256 digest"
    } else {
        "looks like a branch or tag name: it can point at other code tomorrow"
    }
}

impl ArtifactDigest {
    pub fn parse(text: &str) -> Result<Self, MutableReference> {
        match text.strip_prefix("sha256:") {
            Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => {
                Ok(ArtifactDigest(text.to_owned()))
            }
            _ => Err(MutableReference {
                field: "artifact_digest",
                message: format!(
                    "{}; send the artifact's digest, `sha256:` and 64 lowercase hex digits",
                    what_it_is(text)
                ),
            }),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The digest from the database, checked there already.
    pub fn from_stored(text: String) -> Self {
        ArtifactDigest(text)
    }
}

impl CommitSha {
    pub fn parse(text: &str) -> Result<Self, MutableReference> {
        if text.len() == 40 && is_hex(text) {
            return Ok(CommitSha(text.to_ascii_lowercase()));
        }
        Err(MutableReference {
            field: "commit_sha",
            message: format!("{}; send the commit's full 40-digit SHA", what_it_is(text)),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn from_stored(text: String) -> Self {
        CommitSha(text)
    }
}

impl fmt::Display for ArtifactDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A service or environment name: 1–63 of `a-z`, `0-9` and `-`, starting with
/// a letter or digit (what a hostname label allows).
fn validate_name(name: &str) -> Result<(), validator::ValidationError> {
    let ok = (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(validator::ValidationError::new("name")
            .with_message("must be 1 to 63 of a-z, 0-9 and '-', not starting with '-'".into()))
    }
}

/// `POST /v1/deployments`, as sent.
#[derive(Debug, Deserialize, Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDeploymentBody {
    #[validate(custom(function = "validate_name"))]
    #[schema(example = "checkout", pattern = r"^[a-z0-9][a-z0-9-]{0,62}$")]
    pub service: String,
    #[validate(custom(function = "validate_name"))]
    #[schema(example = "staging", pattern = r"^[a-z0-9][a-z0-9-]{0,62}$")]
    pub environment: String,
    /// `sha256:` and 64 lowercase hex digits; never a tag.
    #[schema(
        example = "sha256:4f6c0e2b9f1d6a8e3c5b7d9f0a2c4e6b8d0f2a4c6e8b0d2f4a6c8e0b2d4f6a8c",
        pattern = "^sha256:[0-9a-f]{64}$"
    )]
    pub artifact_digest: String,
    /// The full 40-digit commit SHA; never a branch or a short SHA.
    #[schema(example = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678", pattern = "^[0-9a-fA-F]{40}$")]
    pub commit_sha: Option<String>,
    /// The deployment the caller believes is current; another one → 409 `version_mismatch`.
    pub expected_current_deployment_id: Option<String>,
}

/// The validated deployment request: what the fingerprint hashes. The same
/// key with another digest is another fingerprint, so 422 — never a
/// "retry" that deploys something else.
#[derive(Debug, Clone, Serialize)]
pub struct CreateDeployment {
    pub service: String,
    pub environment: String,
    pub artifact_digest: ArtifactDigest,
    pub commit_sha: Option<CommitSha>,
    pub expected_current_deployment_id: Option<String>,
}

impl TryFrom<CreateDeploymentBody> for CreateDeployment {
    type Error = ApiError;

    fn try_from(body: CreateDeploymentBody) -> Result<Self, ApiError> {
        Ok(CreateDeployment {
            service: body.service,
            environment: body.environment,
            artifact_digest: ArtifactDigest::parse(&body.artifact_digest)?,
            commit_sha: body.commit_sha.as_deref().map(CommitSha::parse).transpose()?,
            expected_current_deployment_id: body.expected_current_deployment_id,
        })
    }
}

/// `POST /v1/rollbacks`, as sent: a new intention, never a retry of the
/// deployment it undoes.
#[derive(Debug, Clone, Deserialize, Serialize, Validate, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackBody {
    #[validate(custom(function = "validate_name"))]
    #[schema(pattern = r"^[a-z0-9][a-z0-9-]{0,62}$")]
    pub service: String,
    #[validate(custom(function = "validate_name"))]
    #[schema(pattern = r"^[a-z0-9][a-z0-9-]{0,62}$")]
    pub environment: String,
    /// A deployment (or rollback) that succeeded in this environment.
    pub to_deployment_id: String,
    #[validate(length(min = 1, max = 1000, message = "must be 1 to 1000 characters"))]
    #[schema(
        example = "checkout errors after dep_…; back to the last good release",
        min_length = 1,
        max_length = 1000
    )]
    pub reason: String,
}

/// `POST /v1/deployments/{id}/cancel`: the deployment is named by the path.
#[derive(Debug, Clone, Serialize)]
pub struct CancelDeployment {
    pub deployment_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeploymentKind {
    Deployment,
    Rollback,
}

impl DeploymentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentKind::Deployment => "deployment",
            DeploymentKind::Rollback => "rollback",
        }
    }

    pub fn id_prefix(self) -> &'static str {
        match self {
            DeploymentKind::Deployment => "dep",
            DeploymentKind::Rollback => "rb",
        }
    }
}

/// A deployment's lifecycle (docs/contract.md §7): `queued` until the
/// controller runs it, `running`, then `succeeded`, `failed` or `cancelled`;
/// `unknown` while nobody knows whether the controller took it (the reconciler
/// asks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeploymentState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    Unknown,
}

impl DeploymentState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentState::Queued => "queued",
            DeploymentState::Running => "running",
            DeploymentState::Succeeded => "succeeded",
            DeploymentState::Failed => "failed",
            DeploymentState::Cancelled => "cancelled",
            DeploymentState::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }
}

/// One state a deployment went through.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct StateChange {
    pub state: DeploymentState,
    pub note: String,
    pub at: Timestamp,
}

/// A deployment or a rollback, as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Deployment {
    #[schema(example = "dep_0193a1b2c3d4e5f60718293a4b5c6d7e")]
    pub id: String,
    pub kind: DeploymentKind,
    pub service: String,
    pub environment: String,
    #[schema(value_type = String)]
    pub artifact_digest: ArtifactDigest,
    #[schema(value_type = Option<String>)]
    pub commit_sha: Option<CommitSha>,
    pub state: DeploymentState,
    /// The environment's current release when this one was asked for.
    pub replaces: Option<String>,
    /// A rollback's target.
    pub restores: Option<String>,
    pub reason: Option<String>,
    /// The operation that asked for it.
    pub operation_id: String,
    /// The key the rollout is handed to the controller with: derived from the
    /// request (its account, route, key and fingerprint), and the rollout's
    /// reference: either finds it at the controller.
    pub controller_idempotency_key: String,
    /// The controller's id for the rollout, once it took it.
    pub controller_rollout_id: Option<String>,
    /// Where to poll its state.
    pub status_url: String,
    /// Every state it went through, oldest first (in a single deployment's
    /// answer; lists leave it out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<StateChange>>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

pub fn deployment_url(id: &str) -> String {
    if id.starts_with("rb_") {
        format!("/v1/rollbacks/{id}")
    } else {
        format!("/v1/deployments/{id}")
    }
}

/// Who holds an environment's lock.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct LockHolder {
    pub deployment_id: String,
    pub operation_id: String,
    pub state: DeploymentState,
}

/// An environment: its current release, and who holds its lock.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Environment {
    pub service: String,
    pub environment: String,
    /// The last deployment or rollback that succeeded here.
    pub current: Option<Deployment>,
    /// The deployment or rollback that may be changing it now.
    pub locked_by: Option<LockHolder>,
}

/// The environments a deployment may go to, and which of them wait for a human
/// (docs/contract.md §6, §7). Environments are configuration: a name that is
/// not configured is 400 `unknown_environment` before anything is looked up or
/// claimed, so `prod` can never slip past a policy written for `production`.
/// Every rollback waits too, and production always does.
#[derive(Debug, Clone)]
pub struct DeploymentsPolicy {
    /// Every environment there is, in the order they are configured.
    pub environments: Vec<String>,
    /// The protected ones: deployments to them wait for an approver.
    pub approval_environments: Vec<String>,
}

/// The sandbox's environments, and the one of them that is protected.
const SANDBOX_ENVIRONMENTS: &str = "development,staging,production";
const SANDBOX_APPROVAL_ENVIRONMENTS: &str = "production";

impl Default for DeploymentsPolicy {
    fn default() -> Self {
        DeploymentsPolicy::parse(SANDBOX_ENVIRONMENTS, SANDBOX_APPROVAL_ENVIRONMENTS)
            .expect("the sandbox's environments are valid")
    }
}

impl DeploymentsPolicy {
    /// `DEPLOYMENTS_ENVIRONMENTS` (default `development,staging,production`)
    /// and `DEPLOYMENTS_APPROVAL_ENVIRONMENTS` (default `production`), both
    /// comma-separated; a protected environment must be one of the
    /// environments.
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
        DeploymentsPolicy::parse(
            &var("DEPLOYMENTS_ENVIRONMENTS", SANDBOX_ENVIRONMENTS),
            &var("DEPLOYMENTS_APPROVAL_ENVIRONMENTS", SANDBOX_APPROVAL_ENVIRONMENTS),
        )
    }

    /// The policy from its two comma-separated lists.
    pub fn parse(environments: &str, approval_environments: &str) -> Result<Self, String> {
        let list = |names: &str| -> Vec<String> {
            names
                .split(',')
                .map(|e| e.trim().to_owned())
                .filter(|e| !e.is_empty())
                .collect()
        };
        let (environments, approval_environments) = (list(environments), list(approval_environments));
        if environments.is_empty() {
            return Err("DEPLOYMENTS_ENVIRONMENTS names no environment".into());
        }
        if let Some(bad) = environments.iter().find(|e| validate_name(e).is_err()) {
            return Err(format!(
                "DEPLOYMENTS_ENVIRONMENTS: `{bad}` is not 1 to 63 of a-z, 0-9 and '-'"
            ));
        }
        if let Some(stray) = approval_environments.iter().find(|e| !environments.contains(e)) {
            return Err(format!(
                "DEPLOYMENTS_APPROVAL_ENVIRONMENTS: `{stray}` is not one of DEPLOYMENTS_ENVIRONMENTS ({})",
                environments.join(", ")
            ));
        }
        Ok(DeploymentsPolicy {
            environments,
            approval_environments,
        })
    }

    /// `Ok` when `environment` is configured; else 400 `unknown_environment`
    /// naming the known ones.
    pub fn known(&self, environment: &str) -> Result<(), ApiError> {
        if self.environments.iter().any(|e| e == environment) {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "unknown_environment",
            "Unknown environment",
            format!(
                "there is no environment `{environment}`; the environments are {}. Nothing was claimed",
                self.environments.join(", ")
            ),
        )
        .with("environment", environment)
        .with("known_environments", &self.environments))
    }

    /// Whether deployments to `environment` wait for a human.
    pub fn wants_approval(&self, environment: &str) -> bool {
        environment == "production" || self.approval_environments.iter().any(|e| e == environment)
    }

    /// `Some(what the approver judges)` when this deployment needs a human.
    /// The release it replaces (`current`) can change before the approved
    /// run: that run replaces exactly it, or is refused as stale
    /// ([`crate::store::Replacing::AsApproved`]); the rest is the command's.
    pub fn approval_for_deployment(
        &self,
        command: &CreateDeployment,
        current: Option<&Deployment>,
    ) -> Option<ApprovalSummary> {
        if !self.wants_approval(&command.environment) {
            return None;
        }
        let target = format!("{} in {}", command.service, command.environment);
        Some(ApprovalSummary {
            action: format!("deploy {} to {target}", command.artifact_digest),
            consequences: match current {
                Some(current) => format!(
                    "replaces {} ({}) in {}; a rollback to it stays possible",
                    current.id, current.artifact_digest, command.environment
                ),
                None => format!(
                    "the first release of {} in {}: there is nothing to roll back to",
                    command.service, command.environment
                ),
            },
            identifiers: release_identifiers(
                &command.service,
                &command.environment,
                &command.artifact_digest,
                command.commit_sha.as_ref(),
                current,
            ),
            target,
        })
    }

    /// Every rollback waits: it is a new intention, with its own approval.
    /// The release it replaces (`current`) is held as for a deployment; the
    /// release it restores is named by the command, and a release's digest
    /// and commit never change.
    pub fn approval_for_rollback(
        &self,
        body: &RollbackBody,
        target: &Deployment,
        current: Option<&Deployment>,
    ) -> ApprovalSummary {
        let mut identifiers = release_identifiers(
            &body.service,
            &body.environment,
            &target.artifact_digest,
            target.commit_sha.as_ref(),
            current,
        );
        identifiers.insert("restores".into(), target.id.clone());
        identifiers.insert("reason".into(), body.reason.clone());
        ApprovalSummary {
            action: format!("roll {} in {} back to {}", body.service, body.environment, target.id),
            target: format!("{} in {}", body.service, body.environment),
            consequences: format!(
                "replaces {} with the release of {} ({}): {}",
                current.map_or("nothing", |c| c.id.as_str()),
                target.id,
                target.artifact_digest,
                body.reason
            ),
            identifiers,
        }
    }
}

fn release_identifiers(
    service: &str,
    environment: &str,
    digest: &ArtifactDigest,
    commit: Option<&CommitSha>,
    current: Option<&Deployment>,
) -> BTreeMap<String, String> {
    [
        ("service", Some(service.to_owned())),
        ("environment", Some(environment.to_owned())),
        ("artifact_digest", Some(digest.as_str().to_owned())),
        ("commit_sha", commit.map(|c| c.as_str().to_owned())),
        ("replaces", Some(current.map_or("none".to_owned(), |c| c.id.clone()))),
        (
            "rollback_possible",
            Some(match current {
                Some(current) => format!("yes, to {}", current.id),
                None => "no: nothing has succeeded here yet".to_owned(),
            }),
        ),
    ]
    .into_iter()
    .filter_map(|(name, value)| value.map(|v| (name.to_owned(), v)))
    .collect()
}

pub fn new_id(kind: DeploymentKind) -> String {
    format!("{}_{}", kind.id_prefix(), uuid::Uuid::now_v7().simple())
}

#[cfg(test)]
mod tests {
    use super::DeploymentsPolicy;

    #[test]
    fn a_protected_environment_must_be_one_of_the_environments() {
        let stray = DeploymentsPolicy::parse("development,staging,production", "prod");

        assert!(stray.unwrap_err().contains("`prod` is not one of"));
    }

    #[test]
    fn only_a_configured_environment_is_known() {
        let policy = DeploymentsPolicy::parse(" development, staging ,production", "production").unwrap();

        assert!(policy.known("staging").is_ok());
        assert!(policy.known("prod").is_err());
        assert!(policy.wants_approval("production"));
        assert!(!policy.wants_approval("staging"));
    }
}

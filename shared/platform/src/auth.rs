//! Bearer API keys → account, principal and role (docs/contract.md §1, §12).
//!
//! Keys are stored as SHA-256 hashes only; the plain key is shown once, when it
//! is made. The sandbox's demo keys live in memory, so they exist only while a
//! process runs in sandbox mode and never in a database.

use std::{collections::HashMap, fmt, str::FromStr, sync::Arc};

use axum::{
    extract::{FromRef, FromRequestParts},
    http::{header, request::Parts},
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{db::Db, error::ApiError, time::Timestamp};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Agent,
    Approver,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Approver => "approver",
            Role::Admin => "admin",
        }
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "agent" => Ok(Role::Agent),
            "approver" => Ok(Role::Approver),
            "admin" => Ok(Role::Admin),
            other => Err(format!("unknown role `{other}` (agent, approver, admin)")),
        }
    }
}

/// Who is calling: the tenant, the agent or human inside it, and their role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub account_id: String,
    pub principal_id: String,
    pub role: Role,
}

impl Principal {
    /// Approvals and the journal are for approvers and admins, not agents: here, as both ask it.
    pub fn may_read_approvals(&self) -> Result<(), ApiError> {
        match self.role {
            Role::Approver | Role::Admin => Ok(()),
            Role::Agent => Err(ApiError::forbidden(
                "approvals and the audit journal are for approvers and admins; an agent reads its operation's approval from its status_url",
            )),
        }
    }
}

/// A plain API key. Its `Debug` and `Display` never show it.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(plain: impl Into<String>) -> Self {
        ApiKey(plain.into())
    }

    /// Makes a new random key: `rsk_` and 64 hex digits.
    pub fn generate() -> Self {
        ApiKey(format!(
            "rsk_{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        ))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What is stored: the hex SHA-256 of the key.
    pub fn hash(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

/// A demo credential of the sandbox (docs/contract.md §12).
#[derive(Debug, Clone)]
pub struct DemoKey {
    pub key: &'static str,
    pub account_id: &'static str,
    pub principal_id: &'static str,
    pub role: Role,
}

/// The sandbox's fixed credentials: two accounts, each with an agent and an approver.
pub const DEMO_KEYS: [DemoKey; 4] = [
    DemoKey {
        key: "demo-acme-agent",
        account_id: "acme",
        principal_id: "acme-agent",
        role: Role::Agent,
    },
    DemoKey {
        key: "demo-acme-approver",
        account_id: "acme",
        principal_id: "acme-approver",
        role: Role::Approver,
    },
    DemoKey {
        key: "demo-globex-agent",
        account_id: "globex",
        principal_id: "globex-agent",
        role: Role::Agent,
    },
    DemoKey {
        key: "demo-globex-approver",
        account_id: "globex",
        principal_id: "globex-approver",
        role: Role::Approver,
    },
];

/// Resolves bearer keys to principals: the in-memory demo keys (sandbox mode
/// only), then the service's `api_keys` table.
#[derive(Clone, Debug)]
pub struct Authenticator {
    db: Db,
    demo: Arc<HashMap<String, Principal>>,
}

impl Authenticator {
    pub fn new(db: Db, sandbox_mode: bool) -> Self {
        let demo = if sandbox_mode {
            DEMO_KEYS
                .iter()
                .map(|k| {
                    (
                        ApiKey::new(k.key).hash(),
                        Principal {
                            account_id: k.account_id.into(),
                            principal_id: k.principal_id.into(),
                            role: k.role,
                        },
                    )
                })
                .collect()
        } else {
            HashMap::new()
        };
        Authenticator {
            db,
            demo: Arc::new(demo),
        }
    }

    pub async fn authenticate(&self, key: &ApiKey) -> Result<Principal, ApiError> {
        let hash = key.hash();
        if let Some(principal) = self.demo.get(&hash) {
            return Ok(principal.clone());
        }
        let row: Option<(String, String, String)> = crate::on_pool!(self.db.read(), |pool| {
            sqlx::query_as(
                "SELECT account_id, principal_id, role FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
            )
            .bind(&hash)
            .fetch_optional(pool)
            .await?
        });
        let (account_id, principal_id, role) = row.ok_or_else(ApiError::unknown_key)?;
        let role = role.parse().map_err(ApiError::internal)?;
        Ok(Principal {
            account_id,
            principal_id,
            role,
        })
    }

    /// Makes a key for `principal` and stores its hash; the plain key is
    /// returned once and kept nowhere.
    pub async fn create_key(&self, principal: &Principal) -> Result<ApiKey, sqlx::Error> {
        let key = ApiKey::generate();
        let now = Timestamp::now();
        crate::on_pool!(self.db.write(), |pool| {
            sqlx::query(
                "INSERT INTO api_keys (key_hash, account_id, principal_id, role, created_at) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(key.hash())
            .bind(&principal.account_id)
            .bind(&principal.principal_id)
            .bind(principal.role.as_str())
            .bind(now)
            .execute(pool)
            .await?;
        });
        Ok(key)
    }
}

/// The credential of `Authorization: Bearer <credential>`, if there is one.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // the scheme name is case-insensitive (RFC 9110 §11.1)
        .and_then(|v| {
            v.split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        })
        .map(|(_, credential)| credential.trim())
        .filter(|credential| !credential.is_empty())
}

impl<S> FromRequestParts<S> for Principal
where
    S: Send + Sync,
    Authenticator: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let key = bearer(&parts.headers).ok_or_else(ApiError::unauthenticated)?;
        let principal = Authenticator::from_ref(state).authenticate(&ApiKey::new(key)).await?;
        crate::telemetry::record_principal(&principal.account_id, &principal.principal_id);
        Ok(principal)
    }
}

//! The services as MCP tools (docs/contract.md §13): an MCP server that an
//! agent framework drives without writing HTTP and without holding an API
//! key. It is the agent client of §9 behind the Model Context Protocol:
//!
//! - every write tool takes the service's payload and an `intent`, a stable
//!   name for one intended action; the server makes the intent's key once and
//!   stores it before the first send (`agent::Journal`), and every later call
//!   with that intent — after a timeout, a cancelled call, a restart of this
//!   server — sends the same key; the same intent with another payload is
//!   refused before anything is sent;
//! - every answer says what happened (`outcome`) and the one thing the retry
//!   rule allows next (`next_step`);
//! - the server journals every call beside the intents' keys, so a dispute can
//!   match what the agent asked for with the service's own journal.
//!
//! Layout: `tools` (the tools and their annotations) → `gateway` (the calls)
//! → `endpoints` (which endpoint each tool maps onto), `schema` (input schemas
//! from the services' OpenAPI documents), `answer` (what a call answers),
//! `calls` (the call journal), `config`.

pub mod answer;
pub mod calls;
pub mod config;
pub mod endpoints;
pub mod gateway;
pub mod schema;
mod tools;

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use platform::config::ConnectionLimits;
use rmcp::{
    RoleServer, ServerHandler, ServiceExt,
    handler::server::router::tool::ToolRouter,
    model::{Implementation, ServerCapabilities, ServerConfig},
    service::RequestContext,
    tool_handler,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    },
};
use tokio_util::sync::CancellationToken;

pub use config::{DEFAULT_PORT, HttpToken, McpConfig};
pub use gateway::Gateway;

use crate::gateway::Session;

const INSTRUCTIONS: &str = "Retrysafe's tickets, payments and deployments. Every write tool takes an \
    `intent`: a stable name for one intended action, reused on every retry of that action; the \
    server turns it into one idempotency key, so retrying can never do the action twice. Every \
    client of this server shares its intents: name each action so that no other one is named \
    the same. Follow each answer's `next_step`.";

/// One MCP server: the tools, and the gateway their calls go through.
#[derive(Clone)]
pub struct McpServer {
    gateway: Gateway,
    tool_router: ToolRouter<McpServer>,
    /// The session of a stdio server: one per process.
    stdio_session: Arc<str>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer").finish_non_exhaustive()
    }
}

impl McpServer {
    pub fn new(gateway: Gateway, documents: &schema::Documents) -> McpServer {
        McpServer {
            gateway,
            tool_router: McpServer::tools(documents),
            stdio_session: format!("stdio {}", uuid::Uuid::now_v7()).into(),
        }
    }

    /// Who made a call: this process's stdio session, or over streamable
    /// HTTP, served statelessly, the request itself.
    fn session(&self, ctx: &RequestContext<RoleServer>) -> Session {
        match ctx.extensions.get::<http::request::Parts>() {
            Some(_) => format!("http {}", uuid::Uuid::now_v7()),
            None => self.stdio_session.to_string(),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("retrysafe-mcp", env!("CARGO_PKG_VERSION")).with_title("Retrysafe"))
            .with_instructions(INSTRUCTIONS)
    }
}

/// Serves MCP over stdin and stdout until the client closes them; runs under
/// way finish before this returns.
pub async fn serve_stdio(
    gateway: Gateway,
    documents: &schema::Documents,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let server = McpServer::new(gateway.clone(), documents);
    let running = server.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    gateway.finish_runs().await;
    Ok(())
}

/// The largest JSON-RPC message streamable HTTP reads (413 past it): a
/// service's largest body, with room for the envelope and the intent.
pub const MAX_MESSAGE_BYTES: usize = 2 * platform::json::MAX_BODY_BYTES;

/// Streamable HTTP at `/mcp`, stateless: any replica behind one address can
/// answer any request. Only the configured `Host` and `Origin` values pass
/// (a page elsewhere, or a name rebound to this machine, is refused with
/// 403), and with a token configured, only a request that presents it.
/// `stop` ends its streams.
pub fn http_router(
    config: &McpConfig,
    gateway: Gateway,
    documents: &schema::Documents,
    stop: CancellationToken,
) -> axum::Router {
    let server = McpServer::new(gateway, documents);
    let http = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_allowed_hosts(config.allowed_hosts.clone())
        .with_allowed_origins(config.allowed_origins.clone())
        // an empty list refuses every `Origin`, rather than none
        .enforce_origin_validation()
        .with_max_request_body_bytes(MAX_MESSAGE_BYTES)
        .with_cancellation_token(stop);
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        http,
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let router = match &config.http_token {
        Some(token) => router.layer(axum::middleware::from_fn_with_state(token.clone(), require_token)),
        None => router,
    };
    // added after the token's layer: a load balancer's probe knows no token
    router.route(
        "/healthz",
        axum::routing::get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
    )
}

/// Answers 401 to a request that does not present the endpoint's token.
async fn require_token(State(token): State<HttpToken>, request: Request, next: Next) -> Response {
    if platform::auth::bearer(request.headers()).is_some_and(|presented| token.matches(presented)) {
        return next.run(request).await;
    }
    // the platform's 401 carries the challenge (`WWW-Authenticate: Bearer`)
    platform::ApiError::unauthenticated()
        .with_detail("send `Authorization: Bearer <token>` with this MCP server's own token (MCP_HTTP_TOKEN)")
        .into_response()
}

/// Serves streamable HTTP on `listener` with the services' connection
/// `limits` until `shutdown` resolves; runs under way finish before this
/// returns. Outside the sandbox it does not start without a token.
pub async fn serve_http(
    config: McpConfig,
    listener: tokio::net::TcpListener,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if config.http_token.is_none() && !config.sandbox {
        return Err(
            "outside the sandbox streamable HTTP needs MCP_HTTP_TOKEN, the token its clients must \
                    present: whoever calls the endpoint acts with the server's API keys"
                .into(),
        );
    }
    let documents = schema::Documents::new(&config.environments);
    let gateway = Gateway::open(config.clone()).await?;
    let stop = CancellationToken::new();
    let router = http_router(&config, gateway.clone(), &documents, stop.clone());
    tracing::info!(addr = %listener.local_addr()?, token = config.http_token.is_some(), "MCP over streamable HTTP at /mcp");
    platform::serve(listener, router, limits, async move {
        shutdown.await;
        stop.cancel();
    })
    .await?;
    gateway.finish_runs().await;
    Ok(())
}

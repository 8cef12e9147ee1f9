//! What every service does the same way: its start-up ([`connect`],
//! [`bind`]) and its shutdown ([`run`]), and what its router has besides its
//! own routes ([`router`]): `/healthz`, `/openapi.json`, the docs page with
//! every problem `code`, a problem+json 404/405, and the request span.

use axum::{
    Router,
    extract::{Path, State},
    http::StatusCode,
    response::{Html, IntoResponse, Response},
    routing::get,
};
use tokio::net::TcpListener;
use utoipa::openapi::{
    OpenApi,
    security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
};
use utoipa_swagger_ui::SwaggerUi;

use crate::{
    Db,
    config::{ConnectionLimits, ServiceConfig},
    db::Outages,
    error::{ApiError, DatabaseUnavailable},
    problems::PROBLEM_CODES,
    server::ListenError,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Opens a service's database at `url` with up to `max_connections` (making
/// the directory of a SQLite file first, so a fresh checkout can start) and
/// brings its schema up to date with `migrate`.
pub async fn connect<E>(
    url: &str,
    max_connections: u32,
    migrate: impl AsyncFnOnce(&Db) -> Result<(), E>,
) -> Result<Db, Error>
where
    E: std::error::Error + Send + Sync + 'static,
{
    crate::prepare_sqlite_dir(url)?;
    let db = Db::connect(url, max_connections).await?;
    // on the database's clock before the first lease is taken
    db.sync_clock().await?;
    migrate(&db).await?;
    Ok(db)
}

/// The listener a service serves on: the one it was given (a test's, or the
/// sandbox's, bound before the service starts), else its configured
/// address, bound now (see [`crate::server::listen`]).
pub async fn bind(listener: Option<TcpListener>, config: &ServiceConfig) -> Result<TcpListener, ListenError> {
    match listener {
        Some(listener) => Ok(listener),
        None => {
            let what = format!("the {} service", config.service);
            crate::server::listen(config.service, &what, config.listen).await
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves (see
/// [`crate::serve`]), then stops the service's background work and, last,
/// closes its database: the background work still writes on its way out.
pub async fn run(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
    stop_background: impl Future<Output = ()>,
    db: Db,
) -> Result<(), Error> {
    let served = crate::serve(listener, router, limits, shutdown).await;
    stop_background.await;
    db.close().await;
    Ok(served?)
}

/// A service's whole router: its own `routes` (given their state), what
/// every service has besides ([`common_routes`], with `openapi` as the
/// document), and the fallbacks and request span of [`finish`]. Every
/// answer that says the database was unavailable counts as an outage of `db`
/// seen ([`Outages`]).
pub fn router(title: &'static str, routes: Router, openapi: OpenApi, db: &Db) -> Router {
    let routes = routes
        .merge(common_routes(title, openapi, db))
        .layer(axum::middleware::map_response_with_state(
            db.outages().clone(),
            count_outage,
        ));
    finish(routes)
}

/// Counts an outage of the database for every answer that says it was
/// unavailable: the one place every handler's errors pass through.
async fn count_outage(State(outages): State<Outages>, response: Response) -> Response {
    if response.extensions().get::<DatabaseUnavailable>().is_some() {
        outages.saw_one();
    }
    response
}

/// The router parts every service shares. `openapi` is the service's document.
pub fn common_routes(title: &'static str, mut openapi: OpenApi, db: &Db) -> Router {
    openapi.info.title = title.to_owned();
    let components = openapi.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("API key"))
                .build(),
        ),
    );
    Router::new()
        .route(
            "/healthz",
            get(crate::health::health).with_state(crate::health::Probe::new(db.clone())),
        )
        .route("/docs", get(move || async move { Html(docs_page(title)) }))
        // each problem's `type`: the page of that code alone; a code no service has is 404
        .route(
            "/docs/problems/{code}",
            get(move |Path(code): Path<String>| async move { problem_page(title, &code) }),
        )
        .merge(SwaggerUi::new("/docs/api").external_url_unchecked("/openapi.json", crate::openapi::complete(&openapi)))
}

/// Adds the problem+json fallbacks and the request span to a finished router.
pub fn finish(router: Router) -> Router {
    router
        .fallback(|| async { ApiError::not_found("this route").into_response() })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "Method not allowed",
                "this route does not take this method",
            )
            .into_response()
        })
        .layer(axum::extract::DefaultBodyLimit::max(crate::json::MAX_BODY_BYTES))
        .layer(crate::telemetry::request_layer())
}

/// The page a problem's `type` names: its code, status and meaning, and the
/// way to the page of every code.
fn problem_page(title: &str, code: &str) -> Result<Html<String>, ApiError> {
    let (code, status, meaning) = PROBLEM_CODES
        .iter()
        .find(|(known, _, _)| *known == code)
        .ok_or_else(|| ApiError::not_found("this problem code"))?;
    Ok(Html(format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{code} — {title}</title>
<style>body{{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}code{{background:#f4f4f4;padding:0 .2rem}}</style>
</head><body>
<h1><code>{code}</code></h1>
<p>HTTP {status}. {}</p>
<p>Every problem is <code>application/problem+json</code> with this <code>code</code>; <a href="/docs#problem-{code}">every code of {title}</a>.</p>
</body></html>"#,
        escape(meaning)
    )))
}

fn docs_page(title: &str) -> String {
    let rows: String = PROBLEM_CODES
        .iter()
        .map(|(code, status, meaning)| {
            format!(
                "<tr id=\"problem-{code}\"><td><code>{code}</code></td><td>{status}</td><td>{}</td></tr>\n",
                escape(meaning)
            )
        })
        .collect();
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}
td,th{{text-align:left;vertical-align:top;padding:.3rem .6rem;border-bottom:1px solid #ddd}}code{{background:#f4f4f4;padding:0 .2rem}}</style>
</head><body>
<h1>{title}</h1>
<p>The API reference is at <a href="/docs/api/">/docs/api/</a> (Swagger UI, served from this process) and as
<a href="/openapi.json">/openapi.json</a> (OpenAPI 3.1).</p>
<h2>Retrying safely</h2>
<ul>
<li>Every POST that creates an effect needs an <code>Idempotency-Key</code>: made once per intended action, stored before the first send, sent again unchanged with every retry. A key is scoped by account and by service: this service knows only the keys sent to it.</li>
<li>A retry with the same key and the same request gets the first answer again, byte for byte, with <code>Idempotent-Replayed: true</code>. The same key with a different request is refused with 422.</li>
<li>Every answer that belongs to an operation carries <code>Operation-Id</code>; <code>GET /v1/operations/{{id}}</code> and <code>GET /v1/operations?idempotency_key=</code> tell an agent that timed out what happened.</li>
<li>An operation the service's policy gives to a human answers 202 with an approval request. An <code>approver</code> of the account (never the requester) decides with <code>POST /v1/approvals/{{id}}/decision</code>, echoing the fingerprint they saw; the approved operation runs on the agent's next retry with the same key and body.</li>
<li>Work that leaves the service (a charge at a payment provider) answers 202 at once and is delivered through an outbox with an external idempotency key derived from the request (the account, the route, the key and the fingerprint). Retries replay the 202; the resource and the operation status show how it ended. An answer lost on the way back leaves the operation <code>unknown</code> until a reconciler asks the external system: poll, do not send a new request.</li>
<li>Every attempt is recorded in an append-only, hash-chained audit journal: <code>GET /v1/audit</code> for approvers and admins.</li>
</ul>
<h2>Problems</h2>
<p>Every error is <code>application/problem+json</code> with a stable <code>code</code>:</p>
<table><tr><th>code</th><th>status</th><th>meaning</th></tr>
{rows}</table>
</body></html>"#
    )
}

/// Text made safe for HTML, in element content and in quoted attributes.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use axum::{body::Body, http::Request};
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn every_answer_that_says_the_database_was_unavailable_counts_an_outage_and_no_other_does() {
        let db = Db::connect("sqlite::memory:", 1).await.expect("a database");
        let routes = Router::new()
            .route(
                "/gone",
                get(|| async { ApiError::database_unavailable("connection reset") }),
            )
            .route("/busy", get(|| async { ApiError::no_database_connection() }))
            .route("/failed", get(|| async { ApiError::internal("a bug") }))
            .route("/fine", get(|| async { "fine" }));
        let service = router("test", routes, OpenApi::default(), &db);
        let ask = async |path: &str| {
            let request = Request::get(path).body(Body::empty()).expect("a request");
            service.clone().oneshot(request).await.expect("an answer").status()
        };

        assert_eq!(ask("/fine").await, StatusCode::OK);
        assert_eq!(ask("/failed").await, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(db.outages().seen(), 0);
        assert_eq!(ask("/gone").await, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(db.outages().seen(), 1);
        // a busy database looks like a gone one from the pool: forgetting costs only speed
        assert_eq!(ask("/busy").await, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(db.outages().seen(), 2);
    }
}

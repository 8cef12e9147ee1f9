//! Who may use the console, and which posted forms it acts on: signing in
//! opens a session for a key the services take, the cookie carries only the
//! session's id, and a form counts only from the console's own page, with
//! the token the console gave the session.

use axum::{
    Form,
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Redirect, Response},
};
use platform::auth::ApiKey;
use serde::Deserialize;

use super::{Console, session::Session, views};

const SESSION_COOKIE: &str = "retrysafe_console_session";

#[derive(Debug, Deserialize)]
pub(super) struct SignInForm {
    key: String,
}

/// Verifies the key with the services and opens a session for it; the key
/// itself never goes back to the browser.
pub(super) async fn sign_in(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(form): Form<SignInForm>,
) -> Response {
    if let Some(refused) = refuse_cross_origin(&headers) {
        return refused;
    }
    let key = form.key.trim();
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        let problem = "An API key is one word of letters, digits, - and _, like demo-acme-approver.".to_owned();
        return views::sign_in_page(&[problem], None);
    }
    if let Err(problems) = console.verify(key).await {
        return views::sign_in_page(&problems, None);
    }
    let id = console.sessions.start(ApiKey::new(key));
    let cookie = format!(
        "{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        console.sessions.limits().absolute.as_secs()
    );
    with_cookie(Redirect::to("/").into_response(), &cookie)
}

pub(super) async fn sign_out(State(console): State<Console>, headers: HeaderMap) -> Response {
    if let Some(refused) = refuse_cross_origin(&headers) {
        return refused;
    }
    if let Some(id) = session_id(&headers) {
        console.sessions.end(&id);
    }
    let cookie = format!("{SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    with_cookie(Redirect::to("/").into_response(), &cookie)
}

/// The answer to a posted form the console does not act on (boxed: a
/// `Response` is large, and this travels through `?`).
pub(super) struct TurnedAway(Box<Response>);

impl From<Response> for TurnedAway {
    fn from(response: Response) -> Self {
        TurnedAway(Box::new(response))
    }
}

impl IntoResponse for TurnedAway {
    fn into_response(self) -> Response {
        *self.0
    }
}

impl Console {
    /// The live session the request's cookie names.
    pub(super) fn session(&self, headers: &HeaderMap) -> Option<Session> {
        self.sessions.find(&session_id(headers)?)
    }

    /// The session a posted form acts for, or the answer that turns it away:
    /// a form from another origin, no session (sign in first), or a form this
    /// console did not render for this session.
    pub(super) fn form_session(&self, headers: &HeaderMap, form_token: &str) -> Result<Session, TurnedAway> {
        if let Some(refused) = refuse_cross_origin(headers) {
            return Err(refused.into());
        }
        let Some(session) = self.session(headers) else {
            return Err(Redirect::to("/").into_response().into());
        };
        if form_token != session.form_token {
            let problem = "This form is not one the console gave this session; reload the page.";
            return Err(views::problem_page(StatusCode::FORBIDDEN, problem).into());
        }
        Ok(session)
    }
}

/// A form posted from another origin — another site, or another port of this
/// host, which `SameSite` counts as the same site — is refused: it could
/// decide with the approver's cookie, or plant its own key.
fn refuse_cross_origin(headers: &HeaderMap) -> Option<Response> {
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let same_origin = match (value("sec-fetch-site"), value("origin"), value("host")) {
        (Some(site), _, _) => site == "same-origin" || site == "none",
        (None, Some(origin), Some(host)) => origin == format!("http://{host}"),
        // no browser sent this (a script): it holds no one's cookie
        (None, _, _) => true,
    };
    let problem = "This form was sent from another page; the console accepts its own forms only.";
    (!same_origin).then(|| views::problem_page(StatusCode::FORBIDDEN, problem))
}

fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == SESSION_COOKIE && !value.is_empty())
        .map(|(_, value)| value.to_owned())
}

fn with_cookie(mut response: Response, cookie: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

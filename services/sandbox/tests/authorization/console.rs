//! The console's part of the matrix (docs/contract.md §6, §12): a sign-in
//! with each principal's key, and each form — a decision, a resolution, a
//! redelivery — posted on acme's approval and operation with no session and
//! with a session of each person of both accounts. Each ends on the page
//! [`sign_ins`] and [`actions`] say, the forms change nothing (the cells are
//! chosen so that even acme's right principal changes nothing), and no page
//! of globex's people shows an acme id.

use platform::Role;
use sandbox::console::{ConsoleConfig, ServiceLink};

use crate::world::{PRINCIPALS, Principal, Seeded, Seeds};

/// The sign-in form: where no session leads.
const SIGN_IN: &str = "Who is deciding?";
/// A signed-in page: its sign-out button.
const SIGNED_IN: &str = "id=\"sign-out\"";

/// What signing in with each principal's key shows, in the order of
/// [`PRINCIPALS`]; `{service}` is the service whose keys they are. A key is
/// each service's own (an admin's here is), and one service that takes it
/// as an approver's or an admin's is enough.
fn sign_ins() -> [&'static str; 8] {
    [
        "An API key is one word",
        "{service} did not accept this API key",
        "{service} does not let this key decide",
        SIGNED_IN,
        SIGNED_IN,
        "{service} does not let this key decide",
        SIGNED_IN,
        SIGNED_IN,
    ]
}

/// Who holds the session a form is posted with: nobody, or a person of either account.
const SESSIONS: [Option<Principal>; 5] = [
    None,
    Some(Principal::Acme(Role::Approver)),
    Some(Principal::Acme(Role::Admin)),
    Some(Principal::Globex(Role::Approver)),
    Some(Principal::Globex(Role::Admin)),
];

/// A form the console acts on.
struct Action {
    path: &'static str,
    /// Its fields, besides `service` and `form_token`.
    fields: fn(&Seeds) -> Vec<(&'static str, String)>,
    /// What the page it ends on shows each of [`SESSIONS`]; `{service}` is
    /// the service's name, `{approval}` and `{operation}` the ids acted on.
    shows: [&'static str; 5],
}

fn settling(seeds: &Seeds) -> Vec<(&'static str, String)> {
    vec![
        ("operation_id", seeds.get("operation_id").to_owned()),
        ("outcome", "failed".to_owned()),
        ("evidence", "no trace of it at the external system".to_owned()),
    ]
}

/// Settling by hand is an admin's, of the operation's own account (§5).
const ADMIN_SETTLES: [&str; 5] = [
    SIGN_IN,
    "{service} does not let this key do that",
    "{service} refused: operation `{operation}` is `completed`",
    "{service} does not let this key do that",
    "{service} has no such operation in this account.",
];

fn actions() -> Vec<Action> {
    vec![
        // the decision acme's approver made already: they are shown it again
        Action {
            path: "/decide",
            fields: |seeds| {
                vec![
                    ("approval_id", seeds.get("decided_approval_id").to_owned()),
                    ("fingerprint", seeds.get("decided_fingerprint").to_owned()),
                    ("decision", "reject".to_owned()),
                ]
            },
            shows: [
                SIGN_IN,
                "Rejected {approval} of {service}",
                "{service} does not let this key decide",
                "{service} has no such approval in this account.",
                "{service} does not let this key decide",
            ],
        },
        Action {
            path: "/resolve",
            fields: settling,
            shows: ADMIN_SETTLES,
        },
        Action {
            path: "/redeliver",
            fields: |seeds| vec![("operation_id", seeds.get("operation_id").to_owned())],
            shows: ADMIN_SETTLES,
        },
    ]
}

/// A browser of the console that shows each redirect before following it.
struct Browser {
    http: reqwest::Client,
    console: String,
}

impl Browser {
    /// The page a browser ends on after `answer`, with `session`'s cookie.
    async fn ends_on(&self, answer: reqwest::Response, session: Option<&str>) -> String {
        if answer.status().as_u16() != 303 {
            return answer.text().await.unwrap();
        }
        let location = answer.headers()["location"].to_str().unwrap().to_owned();
        self.page(&location, session).await
    }

    async fn page(&self, path: &str, session: Option<&str>) -> String {
        let mut request = self.http.get(format!("{}{path}", self.console));
        if let Some(session) = session {
            request = request.header("cookie", session);
        }
        request.send().await.unwrap().text().await.unwrap()
    }

    /// Posts `fields` as a form from the console's own page: the page it ends on.
    async fn post(&self, path: &str, session: Option<&str>, fields: &[(&str, &str)]) -> String {
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        let mut request = self
            .http
            .post(format!("{}{path}", self.console))
            .header("sec-fetch-site", "same-origin")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(session) = session {
            request = request.header("cookie", session);
        }
        self.ends_on(request.send().await.unwrap(), session).await
    }

    /// Signs in with `key`: the session's cookie, if one was opened, and the page it ends on.
    async fn sign_in(&self, key: &str) -> (Option<String>, String) {
        let body: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("key", key)
            .finish();
        let answer = self
            .http
            .post(format!("{}/key", self.console))
            .header("sec-fetch-site", "same-origin")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        let session = answer
            .headers()
            .get("set-cookie")
            .map(|cookie| cookie.to_str().unwrap().split(';').next().unwrap().to_owned());
        let page = self.ends_on(answer, session.as_deref()).await;
        (session, page)
    }
}

/// The form token the console put in `page`'s forms, or none.
fn form_token(page: &str) -> String {
    let field = "name=\"form_token\" value=\"";
    page.split_once(field)
        .and_then(|(_, rest)| rest.split('"').next())
        .unwrap_or_default()
        .to_owned()
}

/// What a page says to the person: its notices and problems, else that it
/// is the sign-in form or a signed-in page — for a cell that went wrong.
fn said(page: &str) -> String {
    let boxes: Vec<&str> = page
        .split("<p class=\"")
        .skip(1)
        .filter(|p| p.starts_with("notice") || p.starts_with("problem"))
        .filter_map(|p| {
            p.split_once('>')
                .and_then(|(_, rest)| rest.split_once("</p>"))
                .map(|(text, _)| text)
        })
        .collect();
    match (boxes.is_empty(), page.contains(SIGNED_IN)) {
        (false, _) => boxes.join(" | "),
        (true, true) => "a signed-in page".to_owned(),
        (true, false) if page.contains(SIGN_IN) => "the sign-in form".to_owned(),
        (true, false) => page.chars().take(300).collect(),
    }
}

fn worded(text: &str, service: &Seeded) -> String {
    text.replace("{service}", service.name)
        .replace("{approval}", service.seeds.get("decided_approval_id"))
        .replace("{operation}", service.seeds.get("operation_id"))
}

/// What acme's approver reads of the approval and the operation the forms act on.
async fn acted_on(services: &[Seeded]) -> Vec<serde_json::Value> {
    let mut read = Vec::new();
    for service in services {
        read.push(
            service
                .read(&format!("/v1/approvals/{}", service.seeds.get("decided_approval_id")))
                .await,
        );
        read.push(
            service
                .read(&format!("/v1/operations/{}", service.seeds.get("operation_id")))
                .await,
        );
    }
    read
}

/// Every cell of the console: what is wrong with each, and how many there were.
pub async fn cells(services: &[Seeded]) -> (Vec<String>, usize) {
    let links = services
        .iter()
        .map(|service| ServiceLink {
            name: service.name.to_owned(),
            url: service.url.clone(),
        })
        .collect();
    let router = sandbox::console::router(ConsoleConfig {
        services: links,
        ..ConsoleConfig::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let console = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let browser = Browser {
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
        console,
    };
    let before = acted_on(services).await;
    let (mut wrong, mut cells) = (Vec::new(), 0);

    for service in services {
        let mut sessions = Vec::new();
        for (who, shows) in PRINCIPALS.into_iter().zip(sign_ins()) {
            cells += 1;
            let (session, page) = browser.sign_in(service.bearer(who).unwrap_or("")).await;
            let shows = worded(shows, service);
            if !page.contains(&shows) || session.is_some() != (shows == SIGNED_IN) {
                wrong.push(format!(
                    "console: signing in as {who:?} of {}: expected {shows:?}; got {}, a session: {}",
                    service.name,
                    said(&page),
                    session.is_some()
                ));
            }
            sessions.push((who, session));
        }
        let session_of = |who: Principal| {
            sessions
                .iter()
                .find(|(holder, _)| *holder == who)
                .and_then(|(_, session)| session.clone())
        };

        let own_page = format!("/?service={}", service.name);
        for who in SESSIONS.into_iter().flatten() {
            let page = browser.page(&own_page, session_of(who).as_deref()).await;
            if matches!(who, Principal::Globex(_)) {
                let shown: Vec<&str> = service.seeds.acme_values().filter(|v| page.contains(v)).collect();
                if !shown.is_empty() {
                    wrong.push(format!(
                        "console: {}'s page for {who:?} shows acme's {shown:?}",
                        service.name
                    ));
                }
            } else if !page.contains(service.seeds.get("approval_id")) {
                wrong.push(format!(
                    "console: {}'s page for {who:?} lacks acme's pending approval",
                    service.name
                ));
            }
        }

        for action in actions() {
            for (who, shows) in SESSIONS.into_iter().zip(action.shows) {
                cells += 1;
                let session = who.and_then(session_of);
                let token = match &session {
                    Some(session) => form_token(&browser.page(&own_page, Some(session)).await),
                    None => String::new(),
                };
                let mut fields = vec![("service", service.name.to_owned()), ("form_token", token)];
                fields.extend((action.fields)(&service.seeds));
                let fields: Vec<(&str, &str)> = fields.iter().map(|(name, value)| (*name, value.as_str())).collect();
                let page = browser.post(action.path, session.as_deref(), &fields).await;
                let shows = worded(shows, service);
                if !page.contains(&shows) {
                    wrong.push(format!(
                        "console: {} of {} with {who:?}'s session: expected {shows:?}, got {}",
                        action.path,
                        service.name,
                        said(&page)
                    ));
                }
            }
        }
    }
    if acted_on(services).await != before {
        wrong.push("console: a form changed acme's approval or operation".to_owned());
    }
    (wrong, cells)
}

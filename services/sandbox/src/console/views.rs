//! The console's pages as askama templates, from `templates/console/`. A
//! template escapes every value it writes, so whatever a service or a
//! requester sent reads as text, never as markup. A template written into
//! another has escaped its own values already: it is marked [`HtmlSafe`] so
//! that it goes in as it is.

use approvals::{Revealed, is_hidden};
use askama::{Template, filters::HtmlSafe};
use axum::{
    http::StatusCode,
    response::{Html, IntoResponse, Response},
};
use serde_json::Value;

use super::{ServiceLink, url_encoded};

/// `page` as an HTML answer with `status`.
fn answer(status: StatusCode, page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(error) => {
            tracing::error!(%error, "a console page did not render");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// A page that only says what is wrong.
#[derive(Template)]
#[template(path = "console/problem.html")]
struct ProblemPage<'a> {
    problem: &'a str,
}

pub(super) fn problem_page(status: StatusCode, problem: &str) -> Response {
    answer(status, &ProblemPage { problem })
}

/// The sign-in form, under what went wrong with the last try.
#[derive(Template)]
#[template(path = "console/sign_in.html")]
struct SignInPage<'a> {
    problems: &'a [String],
    suggested: &'a str,
}

pub(super) fn sign_in_page(problems: &[String], suggested: Option<&str>) -> Response {
    let suggested = suggested.unwrap_or("");
    answer(StatusCode::OK, &SignInPage { problems, suggested })
}

/// The page of a signed-in person: what just happened, what went wrong,
/// each service with its count of what waits, and the selected service's lists.
#[derive(Template)]
#[template(path = "console/page.html")]
pub(super) struct ConsolePage<'a> {
    pub(super) notice: Option<&'a str>,
    pub(super) problems: Vec<String>,
    pub(super) waiting: i64,
    pub(super) tabs: Vec<ServiceTab<'a>>,
    pub(super) sections: Vec<Section>,
}

impl ConsolePage<'_> {
    pub(super) fn answer(&self) -> Response {
        answer(StatusCode::OK, self)
    }
}

/// A service's link at the top of the page, with its count of pending approvals.
pub(super) struct ServiceTab<'a> {
    name: &'a str,
    /// The name as a query-string value.
    query: String,
    /// `?` when the service did not say.
    count: String,
    selected: bool,
}

impl<'a> ServiceTab<'a> {
    pub(super) fn new(service: &'a ServiceLink, count: Option<i64>, selected: bool) -> Self {
        ServiceTab {
            name: &service.name,
            query: url_encoded(&service.name),
            count: count.map_or("?".to_owned(), |n| n.to_string()),
            selected,
        }
    }
}

/// One list of the selected service, or why it could not be had.
pub(super) enum Section {
    Pending(PendingList),
    Unknown(UnknownList),
    Dead(DeadList),
    History(HistoryList),
    Failed(String),
}

/// A value a service sent, as a person should read it: characters that do
/// not show written out as `\u` escapes and, if there were any, the field
/// marked so nobody reads past it.
#[derive(Template)]
#[template(path = "console/shown.html")]
pub(super) struct Shown {
    text: String,
    hidden: bool,
}

impl Shown {
    fn of(value: &Value) -> Self {
        let revealed = Revealed::of(value.as_str().unwrap_or(""));
        Shown {
            text: revealed.text,
            hidden: revealed.escaped,
        }
    }

    /// [`Shown::of`], or `absent` in words when the service gave nothing.
    fn or(value: &Value, absent: &str) -> Self {
        if value.is_null() {
            Shown::words(absent)
        } else {
            Shown::of(value)
        }
    }

    /// The console's own words.
    fn words(text: &str) -> Self {
        Shown {
            text: text.to_owned(),
            hidden: false,
        }
    }
}

fn has_hidden(value: &Value) -> bool {
    match value {
        Value::String(text) => text.chars().any(is_hidden),
        Value::Object(map) => map
            .iter()
            .any(|(name, value)| name.chars().any(is_hidden) || has_hidden(value)),
        _ => false,
    }
}

/// The hidden fields of a form: what it is about, and the session's form token.
#[derive(Template)]
#[template(path = "console/hidden_fields.html")]
struct HiddenFields {
    fields: Vec<(&'static str, String)>,
}

impl HiddenFields {
    fn about_operation(service: &str, operation_id: &str, form_token: &str) -> Self {
        let fields = vec![
            ("service", service.to_owned()),
            ("operation_id", operation_id.to_owned()),
            ("form_token", form_token.to_owned()),
        ];
        HiddenFields { fields }
    }
}

/// "First page" and "Next page" links of one list; the other lists start over.
#[derive(Template)]
#[template(path = "console/page_links.html")]
pub(super) struct PageLinks {
    /// The service's name as a query-string value.
    service: String,
    later_page: bool,
    /// The next page's cursor as a query-string value.
    next: Option<String>,
    /// The list's name in the links' ids.
    list: &'static str,
    /// The query parameter that holds this list's cursor.
    parameter: &'static str,
}

impl PageLinks {
    pub(super) fn new(
        service: &ServiceLink,
        next: Option<&str>,
        later_page: bool,
        list: &'static str,
        parameter: &'static str,
    ) -> Self {
        PageLinks {
            service: url_encoded(&service.name),
            later_page,
            next: next.map(url_encoded),
            list,
            parameter,
        }
    }
}

/// One page of a service's pending approvals.
#[derive(Template)]
#[template(path = "console/pending.html")]
pub(super) struct PendingList {
    pub(super) service: String,
    pub(super) total: i64,
    pub(super) later_page: bool,
    pub(super) cards: Vec<ApprovalCard>,
    pub(super) links: PageLinks,
}

/// A pending approval: what it would do, to what, who asked, and its two buttons.
#[derive(Template)]
#[template(path = "console/approval_card.html")]
pub(super) struct ApprovalCard {
    id: String,
    action: Shown,
    target: Shown,
    consequences: Shown,
    identifiers: Vec<(Shown, Shown)>,
    /// Something in it hides characters: say so above everything else.
    warning: bool,
    service: String,
    route: Shown,
    requested_by: Shown,
    expires_at: Shown,
    fingerprint: Shown,
    operation: Shown,
    fields: HiddenFields,
}

impl ApprovalCard {
    pub(super) fn new(service: &str, approval: &Value, form_token: &str) -> Self {
        let summary = &approval["summary"];
        let identifiers = summary["identifiers"]
            .as_object()
            .map(|map| {
                map.iter()
                    .map(|(name, value)| (Shown::of(&Value::from(name.as_str())), Shown::of(value)))
                    .collect()
            })
            .unwrap_or_default();
        let id = approval["approval_id"].as_str().unwrap_or("").to_owned();
        let fields = vec![
            ("service", service.to_owned()),
            ("approval_id", id.clone()),
            ("fingerprint", approval["fingerprint"].as_str().unwrap_or("").to_owned()),
            ("form_token", form_token.to_owned()),
        ];
        ApprovalCard {
            id,
            action: Shown::of(&summary["action"]),
            target: Shown::of(&summary["target"]),
            consequences: Shown::of(&summary["consequences"]),
            identifiers,
            warning: has_hidden(summary) || has_hidden(&approval["requested_by"]),
            service: service.to_owned(),
            route: Shown::of(&approval["route"]),
            requested_by: Shown::of(&approval["requested_by"]),
            expires_at: Shown::of(&approval["expires_at"]),
            fingerprint: Shown::of(&approval["fingerprint"]),
            operation: Shown::of(&approval["operation_id"]),
            fields: HiddenFields { fields },
        }
    }
}

/// One page of a service's operations whose outcome is unknown.
#[derive(Template)]
#[template(path = "console/unknown.html")]
pub(super) struct UnknownList {
    pub(super) service: String,
    pub(super) cards: Vec<UnknownCard>,
    pub(super) links: PageLinks,
}

/// An operation whose outcome is unknown, and the form that settles it.
#[derive(Template)]
#[template(path = "console/unknown_card.html")]
pub(super) struct UnknownCard {
    id: String,
    method: Shown,
    route: Shown,
    key: Shown,
    resource_type: Shown,
    resource_id: Shown,
    created_at: Shown,
    external_ref: Shown,
    last_error: Shown,
    fields: HiddenFields,
}

impl UnknownCard {
    pub(super) fn new(service: &str, operation: &Value, form_token: &str) -> Self {
        let id = operation["operation_id"].as_str().unwrap_or("");
        UnknownCard {
            id: id.to_owned(),
            method: Shown::of(&operation["method"]),
            route: Shown::of(&operation["route"]),
            key: Shown::of(&operation["idempotency_key"]),
            resource_type: Shown::or(&operation["resource"]["type"], "nothing known yet"),
            resource_id: Shown::of(&operation["resource"]["id"]),
            created_at: Shown::of(&operation["created_at"]),
            external_ref: Shown::or(&operation["external_ref"], "none known"),
            last_error: Shown::or(&operation["last_error"], "none"),
            fields: HiddenFields::about_operation(service, id, form_token),
        }
    }
}

/// One page of a service's dead deliveries.
#[derive(Template)]
#[template(path = "console/dead.html")]
pub(super) struct DeadList {
    pub(super) service: String,
    pub(super) rows: Vec<DeadRow>,
    pub(super) links: PageLinks,
}

/// An operation whose delivery is dead, and the button that sends it again.
#[derive(Template)]
#[template(path = "console/dead_row.html")]
pub(super) struct DeadRow {
    id: String,
    method: Shown,
    route: Shown,
    key: Shown,
    state: String,
    last_error: Shown,
    fields: HiddenFields,
}

impl DeadRow {
    pub(super) fn new(service: &str, operation: &Value, form_token: &str) -> Self {
        let id = operation["operation_id"].as_str().unwrap_or("");
        DeadRow {
            id: id.to_owned(),
            method: Shown::of(&operation["method"]),
            route: Shown::of(&operation["route"]),
            key: Shown::of(&operation["idempotency_key"]),
            state: operation["state"].as_str().unwrap_or("").to_owned(),
            last_error: Shown::or(&operation["last_error"], "none"),
            fields: HiddenFields::about_operation(service, id, form_token),
        }
    }
}

/// One page of every approval of a service.
#[derive(Template)]
#[template(path = "console/history.html")]
pub(super) struct HistoryList {
    pub(super) service: String,
    pub(super) total: i64,
    pub(super) rows: Vec<HistoryRow>,
    pub(super) links: PageLinks,
}

/// An approval, what became of it, and who decided when.
#[derive(Template)]
#[template(path = "console/history_row.html")]
pub(super) struct HistoryRow {
    id: String,
    action: Shown,
    target: Shown,
    state: String,
    by: Shown,
    decided_at: Shown,
}

impl HistoryRow {
    pub(super) fn new(approval: &Value) -> Self {
        let summary = &approval["summary"];
        let by = match approval["decided_by"].as_str() {
            Some(_) => Shown::of(&approval["decided_by"]),
            None if approval["state"] == "expired" => Shown::words("nobody (expired)"),
            None => Shown::words(""),
        };
        HistoryRow {
            id: approval["approval_id"].as_str().unwrap_or("").to_owned(),
            action: Shown::of(&summary["action"]),
            target: Shown::of(&summary["target"]),
            state: approval["state"].as_str().unwrap_or("").to_owned(),
            by,
            decided_at: Shown::of(&approval["decided_at"]),
        }
    }
}

// each escaped its own values when it rendered
impl HtmlSafe for Shown {}
impl HtmlSafe for HiddenFields {}
impl HtmlSafe for PageLinks {}
impl HtmlSafe for PendingList {}
impl HtmlSafe for ApprovalCard {}
impl HtmlSafe for UnknownList {}
impl HtmlSafe for UnknownCard {}
impl HtmlSafe for DeadList {}
impl HtmlSafe for DeadRow {}
impl HtmlSafe for HistoryList {}
impl HtmlSafe for HistoryRow {}

//! The page a signed-in person reads: gathered at each request from every
//! service with the person's own key, then handed to the templates.

use axum::{
    extract::{Query, State},
    http::HeaderMap,
    response::Response,
};
use serde::Deserialize;

use super::{
    Console, PAGE_SIZE, ServiceLink,
    services::Failure,
    session::Session,
    views::{
        self, ApprovalCard, ConsolePage, DeadList, DeadRow, HistoryList, HistoryRow, PageLinks, PendingList, Section,
        ServiceTab, UnknownCard, UnknownList,
    },
};

/// Which page of which service to show, and what just happened.
#[derive(Debug, Default, Deserialize)]
pub(super) struct PageQuery {
    service: Option<String>,
    /// The pending list's page.
    cursor: Option<String>,
    /// The list of every approval's page.
    history: Option<String>,
    /// The page of operations whose outcome is unknown.
    unknown: Option<String>,
    /// The page of operations whose delivery is dead.
    dead: Option<String>,
    done: Option<String>,
    approval: Option<String>,
    operation: Option<String>,
}

impl PageQuery {
    /// The first page of everything in `service`.
    pub(super) fn of(service: &str) -> Self {
        PageQuery {
            service: Some(service.to_owned()),
            ..PageQuery::default()
        }
    }
}

pub(super) async fn page(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(query): Query<PageQuery>,
) -> Response {
    let Some(session) = console.session(&headers) else {
        return views::sign_in_page(&[], console.config.suggested_key.as_deref());
    };
    let notice = console.notice(&query);
    console.render(&session, &query, notice.as_deref(), None).await
}

impl Console {
    fn knows(&self, service: &str) -> bool {
        self.config.services.iter().any(|s| s.name == service)
    }

    /// The page as `query` asks, with a problem on top.
    pub(super) async fn with_problem(&self, session: &Session, query: &PageQuery, problem: &str) -> Response {
        self.render(session, query, None, Some(problem)).await
    }

    /// What this console just did, in words; nothing for a query it could not
    /// have sent (an unknown service, something that is not an id).
    fn notice(&self, query: &PageQuery) -> Option<String> {
        let service = query.service.as_deref().filter(|s| self.knows(s))?;
        let approval = query.approval.as_deref().filter(|a| is_approval_id(a));
        let operation = query.operation.as_deref().filter(|o| is_operation_id(o));
        let text = match (query.done.as_deref()?, approval, operation) {
            ("approved", Some(approval), _) => format!(
                "Approved {approval} of {service}. The operation runs when the agent retries it with the same key, if what you were shown still holds then (the release a deployment replaces); if not, it never runs, and a new request asks you again."
            ),
            ("rejected", Some(approval), _) => {
                format!("Rejected {approval} of {service}. The operation will never run.")
            }
            ("completed", _, Some(operation)) => format!(
                "Settled {operation} of {service} as completed. A retry with its key still gets the answer it was first given."
            ),
            ("failed", _, Some(operation)) => format!(
                "Settled {operation} of {service} as failed: the external system holds nothing for it. A retry with its key still gets the answer it was first given."
            ),
            ("resent", _, Some(operation)) => format!(
                "Gave {operation} of {service} back to its outbox: it asks the external system first, and sends it again only if it finds no trace of it."
            ),
            _ => return None,
        };
        Some(text)
    }

    /// The page: each service with its count of pending approvals, then one
    /// service's pending approvals with their decision buttons, its
    /// operations whose outcome is unknown and its dead deliveries with what
    /// an admin may do about them, then all of its approvals, each list a
    /// page at a time.
    async fn render(
        &self,
        session: &Session,
        query: &PageQuery,
        notice: Option<&str>,
        problem: Option<&str>,
    ) -> Response {
        let key = session.key.expose();
        let mut problems: Vec<String> = problem.map(str::to_owned).into_iter().collect();
        let mut counts = Vec::new();
        for service in &self.config.services {
            match self.approvals(service, key, Some("pending"), None, 1).await {
                Ok(page) => counts.push((service, Some(page.total))),
                Err(failure) => {
                    problems.push(failure.into_words());
                    counts.push((service, None));
                }
            }
        }
        // the service asked for, else the first with something waiting
        let selected = query
            .service
            .as_deref()
            .and_then(|name| counts.iter().find(|(s, _)| s.name == name))
            .or_else(|| counts.iter().find(|(_, n)| n.is_some_and(|n| n > 0)))
            .or(counts.first());
        let tabs = counts
            .iter()
            .map(|(service, count)| {
                let is_selected = selected.is_some_and(|(s, _)| s.name == service.name);
                ServiceTab::new(service, *count, is_selected)
            })
            .collect();
        let mut sections = Vec::new();
        // a service that did not answer is already explained above
        if let Some((service, Some(_))) = selected {
            let lists = [
                self.pending_list(service, key, session, query).await,
                self.unknown_list(service, key, session, query).await,
                self.dead_list(service, key, session, query).await,
                self.history_list(service, key, query).await,
            ];
            sections.extend(
                lists
                    .into_iter()
                    .map(|list| list.unwrap_or_else(|failure| Section::Failed(failure.into_words()))),
            );
        }
        ConsolePage {
            notice,
            problems,
            waiting: counts.iter().filter_map(|(_, n)| *n).sum(),
            tabs,
            sections,
        }
        .answer()
    }

    async fn pending_list(
        &self,
        service: &ServiceLink,
        key: &str,
        session: &Session,
        query: &PageQuery,
    ) -> Result<Section, Failure> {
        let page = self
            .approvals(service, key, Some("pending"), query.cursor.as_deref(), PAGE_SIZE)
            .await?;
        let later_page = query.cursor.is_some();
        Ok(Section::Pending(PendingList {
            service: service.name.clone(),
            total: page.total,
            later_page,
            cards: page
                .data
                .iter()
                .map(|approval| ApprovalCard::new(&service.name, approval, &session.form_token))
                .collect(),
            links: PageLinks::new(service, page.next_cursor.as_deref(), later_page, "pending", "cursor"),
        }))
    }

    async fn unknown_list(
        &self,
        service: &ServiceLink,
        key: &str,
        session: &Session,
        query: &PageQuery,
    ) -> Result<Section, Failure> {
        let cursor = query.unknown.as_deref();
        let (cards, links) = self
            .operation_list(service, key, "state=unknown", cursor, "unknown", |operation| {
                UnknownCard::new(&service.name, operation, &session.form_token)
            })
            .await?;
        let service = service.name.clone();
        Ok(Section::Unknown(UnknownList { service, cards, links }))
    }

    async fn dead_list(
        &self,
        service: &ServiceLink,
        key: &str,
        session: &Session,
        query: &PageQuery,
    ) -> Result<Section, Failure> {
        let cursor = query.dead.as_deref();
        let (rows, links) = self
            .operation_list(service, key, "outbox=dead", cursor, "dead", |operation| {
                DeadRow::new(&service.name, operation, &session.form_token)
            })
            .await?;
        let service = service.name.clone();
        Ok(Section::Dead(DeadList { service, rows, links }))
    }

    /// One page of the operations that need a person (`need`, as
    /// [`Console::operations`] takes it), each as `shown` shows it, and the
    /// links to the list's other pages (`list`: its name and its cursor's).
    async fn operation_list<T>(
        &self,
        service: &ServiceLink,
        key: &str,
        need: &str,
        cursor: Option<&str>,
        list: &'static str,
        shown: impl Fn(&serde_json::Value) -> T,
    ) -> Result<(Vec<T>, PageLinks), Failure> {
        let page = self.operations(service, key, need, cursor).await?;
        let links = PageLinks::new(service, page.next_cursor.as_deref(), cursor.is_some(), list, list);
        Ok((page.data.iter().map(shown).collect(), links))
    }

    async fn history_list(&self, service: &ServiceLink, key: &str, query: &PageQuery) -> Result<Section, Failure> {
        let page = self
            .approvals(service, key, None, query.history.as_deref(), PAGE_SIZE)
            .await?;
        Ok(Section::History(HistoryList {
            service: service.name.clone(),
            total: page.total,
            rows: page.data.iter().map(HistoryRow::new).collect(),
            links: PageLinks::new(
                service,
                page.next_cursor.as_deref(),
                query.history.is_some(),
                "history",
                "history",
            ),
        }))
    }
}

/// `apr_` and 32 lowercase hex digits: what the services make, and nothing
/// that could change the decision's URL.
pub(super) fn is_approval_id(id: &str) -> bool {
    is_id(id, "apr_")
}

/// `op_` and 32 lowercase hex digits (a v7 UUID): what the services make, and
/// nothing that could change the resolution's or redelivery's URL.
pub(super) fn is_operation_id(id: &str) -> bool {
    is_id(id, "op_")
}

fn is_id(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix)
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

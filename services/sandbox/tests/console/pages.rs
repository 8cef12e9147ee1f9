//! What the page lists, a page at a time, and that what it shows is text.

use platform::Backend;
use sandbox::console::PAGE_SIZE;
use serde_json::json;

use crate::{URGENT, as_text, cookie_pair, create_urgent, get_page, http_client, sandbox, sign_in};

async fn pending_approvals_are_listed_a_page_at_a_time_with_their_count(backend: Backend) {
    let (_db, tickets_url, console_url) = sandbox(backend, None).await;
    let http = http_client();
    let waiting = PAGE_SIZE + 3;
    for n in 0..waiting {
        let body = format!(r#"{{"project":"payments-api","title":"Checkout is down {n}","priority":"urgent"}}"#);
        let (status, _) = create_urgent(&http, &tickets_url, "demo-acme-agent", &format!("page-{n}"), &body).await;
        assert_eq!(status, 202);
    }
    // another account's approval is not counted
    create_urgent(&http, &tickets_url, "demo-globex-agent", "page-globex", URGENT).await;
    let session = cookie_pair(&sign_in(&http, &console_url, "demo-acme-approver").await);

    let (_, first) = get_page(&http, &console_url, &session).await;
    let link = first.find("id=\"next-pending\"").expect("a link to the next page");
    let next = first[..link]
        .rsplit("href=\"")
        .next()
        .and_then(|href| href.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    let (_, second) = get_page(&http, &format!("{console_url}{next}"), &session).await;

    let cards = |page: &str| page.matches("class=\"approval\"").count();
    assert_eq!(cards(&first), PAGE_SIZE);
    assert!(
        first.contains(&format!("{waiting} waiting in all")),
        "the count of what waits"
    );
    assert!(first.contains(&format!("{PAGE_SIZE} of {waiting} waiting")));
    assert!(first.contains("Checkout is down 0") && !first.contains(&format!("Checkout is down {PAGE_SIZE}<")));
    assert_eq!(cards(&second), waiting - PAGE_SIZE, "the next page has the rest");
    assert!(second.contains(&format!("{} of {waiting} waiting", waiting - PAGE_SIZE)));
    assert!(second.contains(&format!("Checkout is down {}", waiting - 1)));
    assert!(!second.contains("id=\"next-pending\""), "the last page has no next");
}

/// What a requester typed is text on the approval page, never markup: a
/// title with a script tag, quotes and ampersands reads as typed.
async fn a_title_with_markup_in_it_is_shown_as_text_on_the_approval_page(backend: Backend) {
    let (_db, tickets_url, console_url) = sandbox(backend, None).await;
    let http = http_client();
    let title = r#"<script>alert("Tom & Jerry's")</script><b>bold</b>"#;
    let body = json!({"project": "payments-api", "title": title, "priority": "urgent"}).to_string();
    let (status, request) = create_urgent(&http, &tickets_url, "demo-acme-agent", "markup-1", &body).await;
    assert_eq!(status, 202, "{request}");
    let session = cookie_pair(&sign_in(&http, &console_url, "demo-acme-approver").await);

    let (_, page) = get_page(&http, &console_url, &session).await;

    assert!(
        !page.contains("<script") && !page.contains("<b>"),
        "no markup of the title's: {page}"
    );
    assert!(
        as_text(&page).contains(&format!("<tr><th>title</th><td>{title}</td></tr>")),
        "the title reads as typed: {page}"
    );
}

platform::both_backends!(
    pending_approvals_are_listed_a_page_at_a_time_with_their_count,
    a_title_with_markup_in_it_is_shown_as_text_on_the_approval_page,
);

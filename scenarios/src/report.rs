//! What a run of the stories shows: a table in the terminal (story,
//! expectation, result), and an HTML page with each story's steps, checks,
//! and the timeline of every party — agent, network, service, external system.

use std::{fmt::Write as _, path::Path};

use crate::{matrix::Matrix, play::Played, world::Backend};

/// The terminal table.
pub fn print_table(played: &[Played]) {
    let width = played
        .iter()
        .flat_map(|p| p.checks.iter().map(|c| c.what.chars().count()))
        .max()
        .unwrap_or(20)
        .clamp(20, 70);
    let names = played
        .iter()
        .map(|p| p.story.name.chars().count() + p.backend.name().len() + 3)
        .max()
        .unwrap_or(20)
        .max(20);
    println!();
    println!("{:<names$} {:<width$}  result", "scenario", "expectation");
    println!("{}", "-".repeat(names + width + 10));
    for p in played {
        let name = format!("{} ({})", p.story.name, p.backend.name());
        if let Some(why) = &p.skipped {
            println!("{name:<names$} {:<width$}  skipped: {why}", "not played");
        }
        if let Some(error) = &p.error {
            println!(
                "{name:<names$} {:<width$}  FAILED: {error}",
                "could not be played to the end"
            );
        }
        for (i, check) in p.checks.iter().enumerate() {
            let shown = if i == 0 { name.as_str() } else { "" };
            let result = if check.held {
                format!("ok ({})", clipped(&check.got))
            } else {
                format!("FAILED: expected {}, got {}", check.expected, clipped(&check.got))
            };
            let what: String = check.what.chars().take(width).collect();
            println!("{shown:<names$} {what:<width$}  {result}");
        }
    }
    let failed = played.iter().filter(|p| !p.passed()).count();
    let skipped = played.iter().filter(|p| p.skipped.is_some()).count();
    println!();
    println!(
        "{} scenario runs, {} passed, {skipped} skipped, {failed} failed",
        played.len(),
        played.len() - failed - skipped
    );
}

/// A long record (a journal of fifty attempts) cut for the terminal; the report has it whole.
fn clipped(text: &str) -> String {
    const MOST: usize = 100;
    if text.chars().count() <= MOST {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(MOST).collect::<String>())
    }
}

/// The matrix's cells on `backend`: for each route, for each test, the runs
/// of its variants, in order. `None` where nothing of that row was played.
fn grid<'a>(matrix: &Matrix, played: &'a [Played], backend: Backend) -> Vec<(String, Vec<Vec<&'a Played>>)> {
    matrix
        .routes
        .iter()
        .filter_map(|route| {
            let row: Vec<Vec<&Played>> = matrix
                .tests
                .iter()
                .map(|test| {
                    played
                        .iter()
                        .filter(|p| {
                            p.backend == backend
                                && p.story
                                    .cell
                                    .as_ref()
                                    .is_some_and(|c| &c.route == route && &c.test == test)
                        })
                        .collect()
                })
                .collect();
            row.iter().any(|runs| !runs.is_empty()).then(|| (route.clone(), row))
        })
        .collect()
}

fn backends(played: &[Played]) -> Vec<Backend> {
    let mut backends: Vec<Backend> = Vec::new();
    for p in played.iter().filter(|p| p.story.cell.is_some()) {
        if !backends.contains(&p.backend) {
            backends.push(p.backend);
        }
    }
    backends
}

/// The matrix in the terminal: routes down, tests across, a result per variant.
pub fn print_matrix(matrix: &Matrix, played: &[Played]) {
    for backend in backends(played) {
        println!();
        println!(
            "the matrix on {}: every write route under the five tests",
            backend.name()
        );
        let width = 18;
        print!("{:<18}", "route");
        for test in &matrix.tests {
            print!("  {test:<width$}");
        }
        println!();
        for (route, row) in grid(matrix, played, backend) {
            print!("{route:<18}");
            for runs in row {
                let cell = if runs.is_empty() {
                    "-".to_owned()
                } else {
                    runs.iter()
                        .map(|p| if p.passed() { "ok" } else { "FAILED" })
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                print!("  {cell:<width$}");
            }
            println!();
        }
    }
}

fn anchor(p: &Played) -> String {
    escape(&format!("{}-{}", p.story.name, p.backend.name()))
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Time since `start`, for the timeline: `+1.234 s`.
fn since(start: &str, at: &str) -> String {
    let parse = |t: &str| chrono::DateTime::parse_from_rfc3339(t).ok();
    match (parse(start), parse(at)) {
        (Some(start), Some(at)) => format!("+{:.3} s", (at - start).num_microseconds().unwrap_or(0) as f64 / 1e6),
        _ => at.to_owned(),
    }
}

/// The HTML page of a run, written to `path`.
pub fn write_html(matrix: &Matrix, played: &[Played], path: &Path, when: &str) -> std::io::Result<()> {
    let mut page = String::new();
    let _ = write!(
        page,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Retrysafe scenarios</title>
<style>
body{{font:14px/1.45 system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}}
h2{{margin-top:2.5rem}} .lesson{{font-style:italic}} table{{border-collapse:collapse;width:100%;margin:.6rem 0}}
td,th{{text-align:left;vertical-align:top;padding:.25rem .5rem;border-bottom:1px solid #e4e4e4}}
.ok{{color:#17692c}} .failed{{color:#b00020;font-weight:600}} .lane{{white-space:nowrap;font-weight:600}}
.t{{white-space:nowrap;color:#666;font-variant-numeric:tabular-nums}} table.matrix td{{white-space:nowrap}} code{{background:#f4f4f4;padding:0 .2rem}}
tr.story td{{background:#f3f6fb}} tr.agent td .lane{{color:#0b57d0}} tr.network td .lane{{color:#8a5300}}
tr.service td .lane{{color:#17692c}} tr.external td .lane{{color:#7b1fa2}}
</style></head><body>
<h1>Retrysafe scenarios</h1><p>{when}. Each story ran against the real sandbox; each expectation was read
from the services' own records. The timeline merges what every party recorded: the story's steps and faults,
the agent's attempts, the network (the proxy between agent and service), each service's audit journal, and
the simulated payment provider and deployment controller.</p>"#
    );
    for backend in backends(played) {
        let _ = write!(
            page,
            r#"<h2>The matrix on {}</h2><p>Every write route under the article's five tests; each cell links to its run.</p><table class="matrix"><tr><th>route</th>"#,
            backend.name()
        );
        for test in &matrix.tests {
            let _ = write!(page, "<th>{}</th>", escape(test));
        }
        page.push_str("</tr>");
        for (route, row) in grid(matrix, played, backend) {
            let _ = write!(page, "<tr><td>{}</td>", escape(&route));
            for runs in row {
                page.push_str("<td>");
                for (i, p) in runs.iter().enumerate() {
                    let variant = p.story.cell.as_ref().and_then(|c| c.variant.as_deref());
                    let _ = write!(
                        page,
                        r##"{}<a class="{}" href="#{}" title="{}">{}{}</a>"##,
                        if i > 0 { "<br>" } else { "" },
                        if p.passed() { "ok" } else { "failed" },
                        anchor(p),
                        // the cell's name, as `list` prints it and the runner takes it
                        escape(&p.story.name),
                        variant.map(|v| format!("{}: ", escape(v))).unwrap_or_default(),
                        if p.passed() { "passed" } else { "FAILED" }
                    );
                }
                page.push_str("</td>");
            }
            page.push_str("</tr>");
        }
        page.push_str("</table>");
    }
    page.push_str("<h2>Every run</h2><ul>");
    for p in played {
        let _ = write!(
            page,
            r##"<li><a href="#{}">{}</a> ({}) — <span class="{}">{}</span></li>"##,
            anchor(p),
            escape(&p.story.title),
            p.backend.name(),
            if p.passed() { "ok" } else { "failed" },
            p.verdict()
        );
    }
    page.push_str("</ul>");
    for p in played {
        let _ = write!(
            page,
            r#"<h2 id="{}">{} <small>({}, {})</small></h2><p class="lesson">{}</p><ol>"#,
            anchor(p),
            escape(&p.story.title),
            escape(&p.story.name),
            p.backend.name(),
            escape(&p.story.lesson)
        );
        for step in &p.story.steps {
            let _ = write!(page, "<li>{}</li>", escape(&step.say));
        }
        page.push_str("</ol><table><tr><th>expectation</th><th>expected</th><th>got</th><th></th></tr>");
        if let Some(why) = &p.skipped {
            let _ = write!(page, r#"<tr><td colspan="4">skipped: {}</td></tr>"#, escape(why));
        }
        if let Some(error) = &p.error {
            let _ = write!(
                page,
                r#"<tr><td colspan="4" class="failed">{}</td></tr>"#,
                escape(error)
            );
        }
        for check in &p.checks {
            let _ = write!(
                page,
                r#"<tr><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td class="{}">{}</td></tr>"#,
                escape(&check.what),
                escape(&check.expected),
                escape(&check.got),
                if check.held { "ok" } else { "failed" },
                if check.held { "ok" } else { "FAILED" }
            );
        }
        page.push_str("</table><details open><summary>timeline</summary><table>");
        let start = p.timeline.first().map(|e| e.at.clone()).unwrap_or_default();
        for event in &p.timeline {
            let class = match event.lane.as_str() {
                "story" | "approver" => "story",
                l if l.starts_with("agent") => "agent",
                l if l.starts_with("network") => "network",
                "payment provider" | "deployment controller" => "external",
                _ => "service",
            };
            let _ = write!(
                page,
                r#"<tr class="{class}"><td class="t">{}</td><td class="lane">{}</td><td>{}</td></tr>"#,
                escape(&since(&start, &event.at)),
                escape(&event.lane),
                escape(&event.text)
            );
        }
        page.push_str("</table></details>");
    }
    page.push_str("</body></html>\n");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, page)
}

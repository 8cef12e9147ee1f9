//! `cargo run -p scenarios -- all`: the article's test plan, played against
//! the real sandbox. Each story in `scenarios/stories/`, and each cell of the
//! matrix in `scenarios/matrix/` (the five dispute tests on every write
//! route), starts a fresh sandbox process (SQLite by default; PostgreSQL with
//! `--backend postgres`, or when `DATABASE_URL` names a PostgreSQL server),
//! plays its steps — faults injected, an agent that follows the retry rule,
//! processes killed — and checks what must be true against the services' own
//! records. It prints a table and writes an HTML report with every party's
//! timeline.

mod matrix;
mod play;
mod report;
mod standby;
mod story;
mod world;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, ValueEnum};
use futures::StreamExt;
use story::Story;
use world::Backend;

#[derive(Debug, Parser)]
#[command(
    name = "scenarios",
    about = "Plays the article's failure stories, and the matrix of its five tests on every write route, against the real sandbox"
)]
struct Cli {
    /// `all` (every story and the matrix), `matrix`, `list`, or the names of
    /// stories (the files in scenarios/stories/), matrix routes (a row) or
    /// matrix cells (`capture/1a-dropped-answer`: a route, then a file of
    /// scenarios/matrix/tests/).
    #[arg(required = true)]
    stories: Vec<String>,
    /// Which database the services run on.
    #[arg(long, value_enum)]
    backend: Option<Backends>,
    /// Where the HTML report goes.
    #[arg(long, default_value = "target/scenarios")]
    out: PathBuf,
    /// A directory holding prebuilt `sandbox`, `agent`, `payment-provider`
    /// and `deploy-controller` binaries. Without it the runner builds them
    /// with `cargo build`, which needs the source tree and cargo.
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// Where the stories are (`scenarios/stories` of the source tree it was built from).
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/stories"))]
    stories_dir: PathBuf,
    /// Where the matrix is: its `routes.toml` and its `tests/` templates.
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/matrix"))]
    matrix_dir: PathBuf,
    /// How many stories play at once, each in a sandbox of its own.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=32))]
    jobs: u16,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Backends {
    Sqlite,
    Postgres,
    Both,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let loaded = story::load_all(&cli.stories_dir).and_then(|stories| Ok((stories, matrix::load(&cli.matrix_dir)?)));
    let (stories, matrix) = match loaded {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("scenarios: {error}");
            return ExitCode::FAILURE;
        }
    };
    if cli.stories == ["list"] {
        for story in &stories {
            println!("{:<24} {}\n{:<24} {}", story.name, story.title, "", story.lesson);
        }
        println!("\nthe matrix: `matrix`, a route's name for its row, or one cell");
        for cell in &matrix.cells {
            println!("  {}", cell.name);
        }
        return ExitCode::SUCCESS;
    }
    let chosen = match choose(&cli.stories, &stories, &matrix) {
        Ok(chosen) => chosen,
        Err(error) => {
            eprintln!("scenarios: {error}");
            return ExitCode::FAILURE;
        }
    };
    let postgres_named = std::env::var("DATABASE_URL").is_ok_and(|u| u.starts_with("postgres"));
    let backends = match cli.backend {
        Some(Backends::Sqlite) => vec![Backend::Sqlite],
        Some(Backends::Postgres) => vec![Backend::Postgres],
        Some(Backends::Both) => vec![Backend::Sqlite, Backend::Postgres],
        None if postgres_named => vec![Backend::Postgres],
        None => vec![Backend::Sqlite],
    };
    let binaries = match cli.bin_dir.map_or_else(build_binaries, prebuilt) {
        Ok(binaries) => binaries,
        Err(error) => {
            eprintln!("scenarios: {error}");
            return ExitCode::FAILURE;
        }
    };
    let runs: Vec<(Story, Backend)> = backends
        .iter()
        .flat_map(|backend| chosen.iter().map(|story| (story.clone(), *backend)))
        .collect();
    println!("playing {} stories, {} at a time", runs.len(), cli.jobs);
    let played: Vec<play::Played> = futures::stream::iter(runs)
        .map(|(story, backend)| {
            let binaries = &binaries;
            async move {
                let result = play::play(story, backend, binaries).await;
                println!("  {} on {} — {}", result.story.name, backend.name(), result.verdict());
                result
            }
        })
        .buffered(usize::from(cli.jobs))
        .collect()
        .await;
    report::print_table(&played);
    report::print_matrix(&matrix, &played);
    let when = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
    let page = cli.out.join("report.html");
    match report::write_html(&matrix, &played, &page, &when) {
        Ok(()) => println!("the report with every timeline: {}", page.display()),
        Err(e) => eprintln!("could not write {}: {e}", page.display()),
    }
    if played.iter().all(play::Played::passed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// What the names on the command line stand for, in the order given.
fn choose(names: &[String], stories: &[Story], matrix: &matrix::Matrix) -> Result<Vec<Story>, String> {
    let mut chosen = Vec::new();
    for name in names {
        let found: Vec<Story> = match name.as_str() {
            "all" => stories.iter().chain(&matrix.cells).cloned().collect(),
            "matrix" => matrix.cells.clone(),
            _ => stories
                .iter()
                .chain(&matrix.cells)
                .filter(|s| &s.name == name || s.cell.as_ref().is_some_and(|c| &c.route == name))
                .cloned()
                .collect(),
        };
        if found.is_empty() {
            return Err(format!("no story, route or cell `{name}` (try `list`)"));
        }
        chosen.extend(found);
    }
    Ok(chosen)
}

/// The prebuilt programs in `dir`, if all are there.
fn prebuilt(dir: PathBuf) -> Result<PathBuf, String> {
    for binary in world::PROGRAMS {
        if !dir.join(binary).is_file() {
            return Err(format!("--bin-dir {}: no `{binary}` binary there", dir.display()));
        }
    }
    Ok(dir)
}

/// Builds the programs a world runs with the same profile as this runner,
/// and says where they are: beside this runner's own binary.
fn build_binaries() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command.arg("build");
    for program in world::PROGRAMS {
        command.args(["-p", program]);
    }
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let status = command.status().map_err(|e| format!("cargo build: {e}"))?;
    if !status.success() {
        return Err("cargo build of the sandbox, the agent and the simulators failed".into());
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    me.parent()
        .map(PathBuf::from)
        .ok_or_else(|| "where is this binary?".into())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::CommandFactory;

    use super::*;

    fn source(path: &str) -> String {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
    }

    /// The text between backticks in `text`.
    fn quoted(text: &str) -> Vec<&str> {
        text.split('`').skip(1).step_by(2).collect()
    }

    #[test]
    fn the_help_the_docs_the_readme_and_the_report_name_the_matrix_alike() {
        let matrix = matrix::load(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/matrix"))).unwrap();
        // what reads as a cell (a route, a slash, a template) must be one
        let cells_named_in = |text: &str, words: Vec<&str>| {
            for word in words {
                let Some((route, _)) = word.split_once('/') else {
                    continue;
                };
                if matrix.routes.iter().any(|r| r == route) {
                    assert!(
                        matrix.cells.iter().any(|c| c.name == word),
                        "{text} names the cell `{word}`, which the matrix does not have"
                    );
                }
            }
        };
        let help = Cli::command().render_long_help().to_string();
        cells_named_in("the help", quoted(&help));

        // docs/scenarios.md's table: the report's rows (routes) and columns (tests)
        let docs = source("../docs/scenarios.md");
        let mut table = docs
            .lines()
            .skip_while(|l| !l.starts_with("| route |"))
            .take_while(|l| l.starts_with('|'));
        let header: Vec<&str> = table.next().unwrap().split('|').map(str::trim).collect();
        assert_eq!(
            &header[2..header.len() - 2],
            matrix.tests,
            "the table's columns are the matrix's tests"
        );
        let rows: Vec<&str> = table
            .skip(1)
            .map(|row| row.split('|').nth(1).unwrap().trim().trim_matches('`'))
            .collect();
        assert_eq!(rows, matrix.routes, "the table's rows are the matrix's routes");
        cells_named_in(
            "docs/scenarios.md",
            docs.split_whitespace()
                .map(|w| w.trim_matches(|c: char| !(c.is_alphanumeric() || c == '-')))
                .collect(),
        );

        let readme = source("../README.md");
        for test in &matrix.tests {
            assert!(readme.contains(test.as_str()), "the README names the test `{test}`");
        }
    }
}

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
    /// matrix cells (`capture/1-dropped-answer`).
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
                println!(
                    "  {} on {} — {}",
                    result.story.name,
                    backend.name(),
                    if result.passed() { "passed" } else { "FAILED" }
                );
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

//! `cargo run -p scenarios -- all`: the article's test plan, played against
//! the real sandbox. Each story in `scenarios/stories/` starts a fresh sandbox
//! process (SQLite by default; PostgreSQL with `--backend postgres`, or when
//! `DATABASE_URL` names a PostgreSQL server), plays its steps — faults
//! injected, an agent that follows the retry rule, processes killed — and
//! checks what must be true against the services' own records. It prints a
//! table and writes an HTML report with every party's timeline.

mod play;
mod report;
mod story;
mod world;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, ValueEnum};
use world::Backend;

#[derive(Debug, Parser)]
#[command(
    name = "scenarios",
    about = "Plays the article's failure stories against the real sandbox"
)]
struct Cli {
    /// `all`, `list`, or the names of stories to play (the files in scenarios/stories/).
    #[arg(required = true)]
    stories: Vec<String>,
    /// Which database the services run on.
    #[arg(long, value_enum)]
    backend: Option<Backends>,
    /// Where the HTML report goes.
    #[arg(long, default_value = "target/scenarios")]
    out: PathBuf,
    /// A directory holding prebuilt `sandbox` and `agent` binaries. Without
    /// it the runner builds them with `cargo build`, which needs the source
    /// tree and cargo.
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// Where the stories are (`scenarios/stories` of the source tree it was built from).
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/stories"))]
    stories_dir: PathBuf,
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
    let stories = match story::load_all(&cli.stories_dir) {
        Ok(stories) => stories,
        Err(error) => {
            eprintln!("scenarios: {error}");
            return ExitCode::FAILURE;
        }
    };
    if cli.stories == ["list"] {
        for story in &stories {
            println!("{:<24} {}\n{:<24} {}", story.name, story.title, "", story.lesson);
        }
        return ExitCode::SUCCESS;
    }
    let chosen: Vec<_> = if cli.stories == ["all"] {
        stories
    } else {
        let mut chosen = Vec::new();
        for name in &cli.stories {
            match stories.iter().find(|s| &s.name == name) {
                Some(story) => chosen.push(story.clone()),
                None => {
                    eprintln!("scenarios: no story `{name}` (try `list`)");
                    return ExitCode::FAILURE;
                }
            }
        }
        chosen
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
    let mut played = Vec::new();
    for backend in backends {
        for story in &chosen {
            println!("playing {} on {} — {}", story.name, backend.name(), story.title);
            let result = play::play(story.clone(), backend, &binaries).await;
            println!("  {}", if result.passed() { "passed" } else { "FAILED" });
            played.push(result);
        }
    }
    report::print_table(&played);
    let when = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
    let page = cli.out.join("report.html");
    match report::write_html(&played, &page, &when) {
        Ok(()) => println!("the report with every timeline: {}", page.display()),
        Err(e) => eprintln!("could not write {}: {e}", page.display()),
    }
    if played.iter().all(play::Played::passed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The prebuilt `sandbox` and `agent` in `dir`, if both are there.
fn prebuilt(dir: PathBuf) -> Result<PathBuf, String> {
    for binary in ["sandbox", "agent"] {
        if !dir.join(binary).is_file() {
            return Err(format!("--bin-dir {}: no `{binary}` binary there", dir.display()));
        }
    }
    Ok(dir)
}

/// Builds the sandbox and the `agent` command line with the same profile as
/// this runner, and says where they are: beside this runner's own binary.
fn build_binaries() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command.args(["build", "-p", "sandbox", "-p", "agent"]);
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let status = command.status().map_err(|e| format!("cargo build: {e}"))?;
    if !status.success() {
        return Err("cargo build of the sandbox and the agent failed".into());
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    me.parent()
        .map(PathBuf::from)
        .ok_or_else(|| "where is this binary?".into())
}

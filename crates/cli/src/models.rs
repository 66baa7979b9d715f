//! `kvlab models`: the manifest (`fixtures/models.json`): each model's name, what it is, and for
//! each of its files where it was found or how to get it.

use anyhow::Result;
use kvlab_model::registry::{self, FileRef, Format, ModelEntry};
use serde::Serialize;

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// One file of a model: found (where) or missing (how to get it).
#[derive(Serialize)]
struct FileStatus {
    role: &'static str,
    file: String,
    found: Option<String>,
    how_to_get: Option<String>,
}

#[derive(Serialize)]
struct ModelStatus {
    name: String,
    format: Format,
    description: String,
    source: String,
    files: Vec<FileStatus>,
    /// Every file is present (synthetic models without a tokenizer always are).
    ready: bool,
}

fn file_status(role: &'static str, f: &FileRef) -> FileStatus {
    let found = registry::find_file(f);
    FileStatus {
        role,
        file: f.file.clone(),
        how_to_get: found.is_none().then(|| f.how_to_get()),
        found: found.map(|p| p.display().to_string()),
    }
}

fn status(e: &ModelEntry) -> ModelStatus {
    let files: Vec<FileStatus> = [("model", &e.model), ("tokenizer", &e.tokenizer)]
        .into_iter()
        .filter_map(|(role, f)| f.as_ref().map(|f| file_status(role, f)))
        .collect();
    ModelStatus {
        name: e.name.clone(),
        format: e.format,
        description: e.description.clone(),
        source: e.source.clone(),
        ready: files.iter().all(|f| f.found.is_some()),
        files,
    }
}

pub fn run(a: Args) -> Result<()> {
    let models: Vec<ModelStatus> = registry::manifest().models.iter().map(status).collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&models)?);
        return Ok(());
    }
    for m in &models {
        println!(
            "{} ({}{})",
            m.name,
            format!("{:?}", m.format).to_lowercase(),
            if m.ready {
                ", ready"
            } else {
                ", MISSING files"
            }
        );
        println!("  {}", m.description);
        println!("  source: {}", m.source);
        if m.format == Format::Synthetic {
            println!("  weights: generated from a seed at load time, nothing to get");
        }
        for f in &m.files {
            match (&f.found, &f.how_to_get) {
                (Some(p), _) => println!("  {} {}: found at {p}", f.role, f.file),
                (None, Some(how)) => println!("  {} {}: missing. {how}", f.role, f.file),
                (None, None) => println!("  {} {}: missing", f.role, f.file),
            }
        }
        println!();
    }
    println!(
        "searched, in order: {}",
        registry::search_dirs()
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

//! Resolving `--model NAME|PATH`: a path is loaded as it is; a name is looked up in the manifest
//! (`fixtures/models.json`) and its files found in `$KVLAB_MODELS`, then the user cache
//! directory, then downloaded from the upstream URL (Hugging Face, through hf-hub, with its
//! progress bar) and checked against the manifest's sha256.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kvlab_model::Config;
use kvlab_model::registry::{self, FileRef, Format, Loaded, Located, ModelEntry};

/// Where a `--model` argument points, its files found (and downloaded if allowed).
pub enum Resolved {
    /// A manifest model with its files.
    Entry {
        entry: &'static ModelEntry,
        model: Option<PathBuf>,
        tokenizer: Option<PathBuf>,
    },
    /// A file given by path.
    Path { path: PathBuf, gguf: bool },
}

/// File extensions of checkpoint formats kvlab does not read, and what to do instead.
const UNSUPPORTED: &[(&[&str], &str)] = &[
    (
        &["safetensors"],
        "Hugging Face safetensors are not read yet; convert the model to GGUF (llama.cpp's convert_hf_to_gguf.py) or to llama2.c's format (llama2.c's export.py)",
    ),
    (
        &["pt", "pth"],
        "PyTorch checkpoints are not read; export to llama2.c's format (llama2.c's export.py) or to GGUF",
    ),
    (
        &["json"],
        "a .json file is a config or tokenizer, not a checkpoint; pass the .bin or .gguf file",
    ),
];

/// Finds the files `--model` names: a path is checked for what it is; a name is looked up in
/// the manifest and its files found in `$KVLAB_MODELS`, the user cache or the shipped copy, or
/// downloaded when allowed.
///
/// # Errors
/// A path that is a directory, a device or a format kvlab does not read; an unknown name; a
/// missing file that cannot be downloaded (the message says how to get it); `--tokenizer` with a
/// GGUF (it carries its own).
pub fn resolve(spec: &str, tokenizer: Option<&Path>, allow_download: bool) -> Result<Resolved> {
    let path = Path::new(spec);
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let unsupported = UNSUPPORTED
        .iter()
        .find(|(exts, _)| ext.as_deref().is_some_and(|e| exts.contains(&e)));
    if let Some((_, why)) = unsupported {
        bail!("{spec}: {why}");
    }
    if path.is_dir() {
        bail!(
            "{spec} is a directory; pass a checkpoint file inside it (a llama2.c .bin or a .gguf), or set KVLAB_MODELS={spec} and pass a model name"
        );
    }
    if path.exists() && !path.is_file() {
        bail!("{spec} is not a regular file (a device or a pipe?); pass a checkpoint file");
    }
    let gguf_refuses_tokenizer = |what: &str| -> Result<()> {
        if let Some(t) = tokenizer {
            bail!(
                "{what} is a GGUF file, which carries its own tokenizer; --tokenizer {} applies to llama2.c checkpoints only: leave it out",
                t.display()
            );
        }
        Ok(())
    };
    if path.is_file() {
        let gguf = ext.as_deref() == Some("gguf");
        if gguf {
            gguf_refuses_tokenizer(spec)?;
        }
        return Ok(Resolved::Path {
            path: path.into(),
            gguf,
        });
    }
    if ext.as_deref().is_some_and(|e| e == "bin" || e == "gguf") || spec.contains('/') {
        bail!(
            "model file {spec} does not exist; check the path, or pass a model name (`kvlab models` lists them)"
        );
    }
    if let Some(e) = registry::entry(spec)
        && e.format == Format::Gguf
    {
        gguf_refuses_tokenizer(&e.name)?;
    }
    loop {
        match registry::locate(spec)? {
            Located::Ready {
                entry,
                model,
                tokenizer: found_tok,
            } => {
                return Ok(Resolved::Entry {
                    entry,
                    model,
                    tokenizer: tokenizer.map(Path::to_path_buf).or(found_tok),
                });
            }
            Located::Missing {
                entry,
                file,
                searched,
            } => {
                if !allow_download || !file.downloadable() {
                    bail!(
                        "{} needs {}, which is not in {searched}. To get it: {}",
                        entry.name,
                        file.file,
                        file.how_to_get()
                    );
                }
                download(file).with_context(|| {
                    format!(
                        "{} needs {} (looked in {searched}). To get it: {}",
                        entry.name,
                        file.file,
                        file.how_to_get()
                    )
                })?;
            }
        }
    }
}

/// Loads a model given by name or path, with an optional tokenizer override.
///
/// # Errors
/// As [`resolve`], and every loader error.
pub fn load(spec: &str, tokenizer: Option<&Path>, allow_download: bool) -> Result<Loaded> {
    match resolve(spec, tokenizer, allow_download)? {
        Resolved::Entry {
            entry,
            model,
            tokenizer,
        } => registry::load_entry(entry, model.as_deref(), tokenizer.as_deref())
            .with_context(|| format!("loading {}", entry.name)),
        Resolved::Path { path, .. } => load_path(&path, tokenizer),
    }
}

/// A model's name, config and files, without building its weights (synthetic specs, llama2.c and
/// GGUF headers).
///
/// # Errors
/// As [`resolve`], and every header reader's error.
pub fn config(
    spec: &str,
    tokenizer: Option<&Path>,
    allow_download: bool,
) -> Result<(String, Config, Vec<PathBuf>)> {
    match resolve(spec, tokenizer, allow_download)? {
        Resolved::Entry {
            entry,
            model,
            tokenizer,
        } => {
            let c = registry::entry_config(entry, model.as_deref())
                .with_context(|| format!("reading {}", entry.name))?;
            let files = model.into_iter().chain(tokenizer).collect();
            Ok((entry.name.clone(), c, files))
        }
        Resolved::Path { path, gguf } => {
            let c = if gguf {
                kvlab_model::gguf_model::read_gguf_config(&path)?
            } else {
                kvlab_model::llama2c::read_config(&path)?
            };
            Ok((file_stem(&path), c, vec![path]))
        }
    }
}

/// Loads a checkpoint from a path: `.gguf` as GGUF, anything else as llama2.c. A llama2.c model
/// without `--tokenizer` uses `tokenizer.bin` (or `tok<vocab>.bin`) beside it, as run.c does.
fn load_path(path: &Path, tokenizer: Option<&Path>) -> Result<Loaded> {
    let name = file_stem(path);
    if path.extension().is_some_and(|e| e == "gguf") {
        let (model, tok) = kvlab_model::load_gguf(path)?;
        return Ok(Loaded {
            name,
            model,
            tokenizer: Some(tok),
            files: vec![path.into()],
        });
    }
    let model = kvlab_model::llama2c::load(path)?;
    let tok_path = tokenizer.map(Path::to_path_buf).or_else(|| {
        let dir = path.parent().unwrap_or(Path::new("."));
        [
            format!("tok{}.bin", model.config.vocab_size),
            "tokenizer.bin".into(),
        ]
        .into_iter()
        .map(|f| dir.join(f))
        .find(|p| p.is_file())
    });
    let tok = tok_path
        .as_deref()
        .map(|t| kvlab_model::Tokenizer::load_llama2c(t, model.config.vocab_size))
        .transpose()?;
    let files = std::iter::once(path.to_path_buf())
        .chain(tok_path)
        .collect();
    Ok(Loaded {
        name,
        model,
        tokenizer: tok,
        files,
    })
}

/// A model's name from its file name: `stories260K` for `models/stories260K.bin`.
fn file_stem(path: &Path) -> String {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    stem.unwrap_or_default()
}

/// Downloads a manifest file into the cache directory and checks its sha256.
fn download(f: &FileRef) -> Result<PathBuf> {
    let Some(url) = &f.url else {
        bail!("no download source is known for {}", f.file)
    };
    let Some((repo, file)) = url
        .strip_prefix("https://huggingface.co/")
        .and_then(|r| r.split_once("/resolve/main/"))
    else {
        bail!(
            "{} is not hosted on Hugging Face; download it by hand from {url}",
            f.file
        );
    };
    let dir = registry::cache_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!(
        "downloading {repo}/{file} ({} bytes) into {}",
        f.bytes,
        dir.display()
    );
    let api = hf_hub::api::sync::ApiBuilder::new()
        .with_progress(true)
        .with_cache_dir(dir.join("hf-hub"))
        .build()?;
    let fetched = api
        .model(repo.to_string())
        .get(file)
        .with_context(|| format!("fetching {url} (offline? set KVLAB_MODELS instead)"))?;
    let sha = registry::sha256_file(&fetched)?;
    if sha != f.sha256 {
        bail!(
            "{url} has sha256 {sha}, the manifest expects {}; not using it",
            f.sha256
        );
    }
    let dest = dir.join(&f.file);
    std::fs::copy(&fetched, &dest).with_context(|| format!("copying into {}", dest.display()))?;
    Ok(dest)
}

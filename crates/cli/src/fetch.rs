//! Resolving `--model NAME|PATH`: a path is loaded as it is; a name is looked up in the manifest
//! (`fixtures/models.json`) and its files found in `$KVLAB_MODELS`, then the user cache
//! directory, then downloaded from the upstream URL (Hugging Face, through hf-hub, with its
//! progress bar) and checked against the manifest's sha256.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kvlab_model::registry::{self, FileRef, Loaded, Located};

/// Loads a model given by name or path, with an optional tokenizer override.
///
/// # Errors
/// Unknown names, missing files that cannot be downloaded (the message names `KVLAB_MODELS` and
/// the URL), sha256 mismatches, and every loader error.
pub fn load(spec: &str, tokenizer: Option<&Path>, allow_download: bool) -> Result<Loaded> {
    let path = Path::new(spec);
    if path.is_file() {
        return load_path(path, tokenizer);
    }
    if spec.ends_with(".bin") || spec.ends_with(".gguf") || spec.contains('/') {
        bail!("model file {spec} does not exist");
    }
    loop {
        match registry::locate(spec)? {
            Located::Ready {
                entry,
                model,
                tokenizer: found_tok,
            } => {
                let tok = tokenizer.map(Path::to_path_buf).or(found_tok);
                return registry::load_entry(entry, model.as_deref(), tok.as_deref())
                    .with_context(|| format!("loading {}", entry.name));
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

/// Loads a checkpoint from a path: `.gguf` as GGUF, anything else as llama2.c. A llama2.c model
/// without `--tokenizer` uses `tokenizer.bin` (or `tok<vocab>.bin`) beside it, as run.c does.
fn load_path(path: &Path, tokenizer: Option<&Path>) -> Result<Loaded> {
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
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
    let tok_path = match tokenizer {
        Some(t) => Some(t.to_path_buf()),
        None => {
            let dir = path.parent().unwrap_or(Path::new("."));
            [
                format!("tok{}.bin", model.config.vocab_size),
                "tokenizer.bin".into(),
            ]
            .into_iter()
            .map(|f| dir.join(f))
            .find(|p| p.is_file())
        }
    };
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

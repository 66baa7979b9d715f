//! Resolving `--model NAME|PATH|ORG/NAME`: a path is loaded as it is (a llama2.c `.bin`, a
//! `.gguf`, or a Hugging Face folder holding `config.json`); a name is looked up in the manifest
//! (`fixtures/models.json`) and its files found in `$KVLAB_MODELS`, then the user cache
//! directory, then downloaded from the upstream URL (Hugging Face, through hf-hub, with its
//! progress bar) and checked against the manifest's sha256; a Hugging Face hub id (`org/name`)
//! is downloaded into hf-hub's cache (`~/.cache/huggingface/hub`, or `$HF_HOME`) when online,
//! and read from that cache otherwise.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kvlab_model::Config;
use kvlab_model::registry::{self, FileRef, Format, Loaded, Located, ModelEntry};

/// Where a `--model` argument points, its files found (and downloaded if allowed).
pub enum Resolved {
    /// A manifest model with its files.
    Entry {
        /// Its row of `fixtures/models.json`.
        entry: &'static ModelEntry,
        /// The checkpoint's path, if found (`None`: not installed, and not downloaded).
        model: Option<PathBuf>,
        /// The tokenizer's path, if the entry has one and it was found.
        tokenizer: Option<PathBuf>,
    },
    /// A file (or Hugging Face folder) given by path, or a hub snapshot.
    Path {
        /// The file or folder.
        path: PathBuf,
        /// Its format, from its name (a folder: Hugging Face).
        kind: PathKind,
    },
}

/// The format of a checkpoint given by path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// Any other file: read as a llama2.c checkpoint.
    Llama2c,
    /// A file named `*.gguf`.
    Gguf,
    /// A folder with `config.json`, safetensors and `tokenizer.json`.
    Hf,
}

/// File extensions of checkpoint formats kvlab does not read, and what to do instead.
const UNSUPPORTED: &[(&[&str], &str)] = &[
    (
        &["safetensors"],
        "a .safetensors file holds only the weights; pass the Hugging Face folder holding it (with config.json and tokenizer.json), or a hub id such as Qwen/Qwen3-0.6B",
    ),
    (
        &["pt", "pth"],
        "PyTorch checkpoints are not read; export to llama2.c's format (llama2.c's export.py) or to GGUF",
    ),
    (
        &["json"],
        "a .json file is a config or tokenizer, not a checkpoint; pass the .bin or .gguf file, or the Hugging Face folder holding config.json",
    ),
];

/// Finds the files `--model` names: a path is checked for what it is; a name is looked up in
/// the manifest and its files found in `$KVLAB_MODELS`, the user cache or the shipped copy, or
/// downloaded when allowed.
///
/// # Errors
/// A path that is a directory without `config.json`, a device or a format kvlab does not read;
/// an unknown name; a missing file that cannot be downloaded (the message says how to get it);
/// `--tokenizer` with a GGUF or a Hugging Face model (they carry their own); a hub id that is
/// neither cached nor downloadable.
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
    let carries_tokenizer = |what: &str, kind: &str| -> Result<()> {
        if let Some(t) = tokenizer {
            bail!(
                "{what} is {kind}, which carries its own tokenizer; --tokenizer {} applies to llama2.c checkpoints only: leave it out",
                t.display()
            );
        }
        Ok(())
    };
    if kvlab_model::hf::is_hf_dir(path) {
        carries_tokenizer(spec, "a Hugging Face folder")?;
        return Ok(Resolved::Path {
            path: path.into(),
            kind: PathKind::Hf,
        });
    }
    if path.is_dir() {
        bail!(
            "{spec} is a directory without a config.json; pass a checkpoint file inside it (a llama2.c .bin or a .gguf), a Hugging Face folder, or set KVLAB_MODELS={spec} and pass a model name"
        );
    }
    if path.exists() && !path.is_file() {
        bail!("{spec} is not a regular file (a device or a pipe?); pass a checkpoint file");
    }
    let gguf_refuses_tokenizer = |what: &str| carries_tokenizer(what, "a GGUF file");
    if path.is_file() {
        let kind = if ext.as_deref() == Some("gguf") {
            gguf_refuses_tokenizer(spec)?;
            PathKind::Gguf
        } else {
            PathKind::Llama2c
        };
        return Ok(Resolved::Path {
            path: path.into(),
            kind,
        });
    }
    if let Some(repo) = hub_id(spec) {
        carries_tokenizer(spec, "a Hugging Face model")?;
        return Ok(Resolved::Path {
            path: hub_snapshot(repo, allow_download)?,
            kind: PathKind::Hf,
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
        Resolved::Path {
            path,
            kind: PathKind::Hf,
        } => {
            let (model, tok, files) = kvlab_model::hf::load_hf_dir(&path)?;
            Ok(Loaded {
                name: hf_name(&path),
                model,
                tokenizer: Some(tok),
                files,
            })
        }
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
        Resolved::Path { path, kind } => {
            let c = match kind {
                PathKind::Gguf => kvlab_model::gguf_model::read_gguf_config(&path)?,
                PathKind::Llama2c => kvlab_model::llama2c::read_config(&path)?,
                PathKind::Hf => kvlab_model::hf::read_hf_config(&path)?.0,
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

/// A Hugging Face model's name: the folder's, or for a hub snapshot
/// (`models--org--name/snapshots/<sha>`) `org/name`.
fn hf_name(dir: &Path) -> String {
    let repo = dir
        .ancestors()
        .filter_map(|a| a.file_name()?.to_str()?.strip_prefix("models--"))
        .next();
    match repo {
        Some(r) => r.replacen("--", "/", 1),
        None => file_stem(dir),
    }
}

/// `org/name` when `spec` has the shape of a Hugging Face hub id (one slash, names of letters,
/// digits, `-`, `_`, `.`) and is not a path that exists.
fn hub_id(spec: &str) -> Option<&str> {
    let (org, name) = spec.split_once('/')?;
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    (ok(org) && ok(name) && !Path::new(spec).exists()).then_some(spec)
}

/// The files of a hub model kvlab reads, as the hub names them.
const HUB_FILES: [&str; 3] = ["config.json", "tokenizer.json", "generation_config.json"];

/// A hub model's snapshot folder in hf-hub's cache: its config, tokenizer, generation config
/// (when the repository has one) and safetensors (one file, or the index and its shards).
/// Downloaded, with hf-hub's progress bars, when `allow_download`; otherwise only the cache is
/// read, and a missing file says how to fill it.
fn hub_snapshot(repo: &str, allow_download: bool) -> Result<PathBuf> {
    let cache = hf_hub::Cache::from_env();
    let cached = cache.model(repo.to_string());
    let api = if allow_download {
        Some(
            hf_hub::api::sync::ApiBuilder::from_cache(cache.clone())
                .with_progress(true)
                .build()?,
        )
    } else {
        None
    };
    // Online, the repository's file list says which optional files exist.
    let listed: Option<Vec<String>> = match &api {
        Some(api) => Some(
            api.model(repo.to_string())
                .info()
                .with_context(|| format!("asking the Hugging Face hub about {repo} (offline? pass --offline to use only the cache)"))?
                .siblings
                .into_iter()
                .map(|s| s.rfilename)
                .collect(),
        ),
        None => None,
    };
    let get = |file: &str| -> Result<Option<PathBuf>> {
        if let Some(p) = cached.get(file) {
            return Ok(Some(p));
        }
        let (Some(api), Some(listed)) = (&api, &listed) else {
            return Ok(None);
        };
        if !listed.iter().any(|f| f == file) {
            return Ok(None);
        }
        api.model(repo.to_string())
            .get(file)
            .map(Some)
            .with_context(|| format!("downloading {file} of {repo} from the Hugging Face hub"))
    };
    let missing = |file: &str| {
        anyhow::anyhow!(
            "{repo}: {file} is not in the Hugging Face cache ({}); run once online without --offline, or pass a local folder",
            cache.path().display()
        )
    };
    let config = get(HUB_FILES[0])?.ok_or_else(|| missing(HUB_FILES[0]))?;
    get(HUB_FILES[1])?.ok_or_else(|| missing(HUB_FILES[1]))?;
    get(HUB_FILES[2])?;
    match get("model.safetensors.index.json")? {
        Some(index) => {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&index)?)
                .with_context(|| format!("reading {}", index.display()))?;
            let mut shards: Vec<&str> = v["weight_map"]
                .as_object()
                .context("model.safetensors.index.json has no weight_map")?
                .values()
                .filter_map(|f| f.as_str())
                .collect();
            shards.sort_unstable();
            shards.dedup();
            for shard in shards {
                get(shard)?.ok_or_else(|| missing(shard))?;
            }
        }
        None => {
            get("model.safetensors")?.ok_or_else(|| missing("model.safetensors"))?;
        }
    }
    let dir = config
        .parent()
        .context("the cached config.json has no folder")?;
    Ok(dir.to_path_buf())
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

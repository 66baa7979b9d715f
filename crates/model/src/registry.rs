//! Named models: the manifest in `fixtures/models.json` (name, format, files with sha256 and
//! upstream URL, or a synthetic spec) and where their files are found: `$KVLAB_MODELS` first, then
//! the user cache directory (`$XDG_CACHE_HOME/kvlab` or `~/.cache/kvlab`), then the copy shipped
//! in the repository (`fixtures/models/`: stories260K.bin and tok512.bin only, so a fresh clone
//! runs offline). Downloading is the CLI's job; this module only looks. Tests look in the same
//! places ([`test_model_file`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Error, Model, Result, SyntheticSpec, Tokenizer};

/// The manifest's schema version this code reads.
pub const MANIFEST_FORMAT_VERSION: u32 = 1;

/// A file a model needs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FileRef {
    /// File name inside `$KVLAB_MODELS` or the cache directory.
    pub file: String,
    /// SHA-256 of the file as lowercase hex (of a Hugging Face folder, its `model.safetensors`'s);
    /// a download must match it.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Where the file can be downloaded from (its upstream).
    pub url: Option<String>,
    /// How to get the file by hand, for files kvlab does not download (no `url`, or terms to
    /// accept first).
    #[serde(default)]
    pub get: Option<String>,
}

impl FileRef {
    /// Whether kvlab can download this file itself (a Hugging Face URL, through hf-hub).
    pub fn downloadable(&self) -> bool {
        self.url.as_deref().is_some_and(|u| {
            u.starts_with("https://huggingface.co/") && u.contains("/resolve/main/")
        })
    }

    /// How a user gets this file, in one sentence that ends in what to set.
    pub fn how_to_get(&self) -> String {
        if let Some(g) = &self.get {
            return g.clone();
        }
        match &self.url {
            Some(u) if self.downloadable() => format!(
                "kvlab downloads it on first use from {u} (sha256 checked) into {}; offline, download it by hand and set KVLAB_MODELS to its folder",
                cache_dir().display()
            ),
            Some(u) => format!(
                "download {u} (sha256 {}) and set KVLAB_MODELS to its folder, or put it in {}",
                self.sha256,
                cache_dir().display()
            ),
            None => format!(
                "no public source is recorded; put {} (sha256 {}) in a folder and set KVLAB_MODELS to it",
                self.file, self.sha256
            ),
        }
    }
}

/// Checkpoint formats kvlab reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// llama2.c legacy `.bin` plus a llama2.c `tokenizer.bin`.
    Llama2c,
    /// GGUF with the tokenizer in its metadata.
    Gguf,
    /// Seeded random weights; the tokenizer (if any) is a llama2.c file.
    Synthetic,
    /// A Hugging Face folder (`config.json`, safetensors, `tokenizer.json`); the model file
    /// names the folder ([`crate::load::hf`]).
    Hf,
}

/// One model of the manifest.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelEntry {
    /// What the CLI and tests call it (`stories260K`, `synth-gqa`).
    pub name: String,
    /// How its model file is read.
    pub format: Format,
    /// One line on the architecture and shape, for `kvlab models`.
    pub description: String,
    /// Provenance and licence of the weights.
    #[serde(default)]
    pub source: String,
    /// The checkpoint (a folder for [`Format::Hf`]); `None` for a synthetic model.
    pub model: Option<FileRef>,
    /// A separate tokenizer file (llama2.c's); `None` when the model file holds it, or there is
    /// none.
    pub tokenizer: Option<FileRef>,
    /// Shape and seed of a [`Format::Synthetic`] model; `None` otherwise.
    pub synthetic: Option<SyntheticSpec>,
    /// Context verify runs this model to (defaults to its max_seq_len).
    pub verify_max_seq_len: Option<usize>,
    /// Whether `cargo xtask verify` runs this model by default.
    #[serde(default = "yes")]
    pub verify: bool,
    /// Verify this model on the cases of an oracle fixture (path under `fixtures/`: prompt ids,
    /// how many tokens to generate, another implementation's greedy ids and top-2 margins)
    /// instead of generating every text prompt to the end of the context.
    #[serde(default)]
    pub verify_cases: Option<String>,
    /// Oracle divergences at steps whose oracle top-2 margin is below this are reported as
    /// near-ties (the oracle computes in lower precision), not failures.
    #[serde(default)]
    pub oracle_near_tie: Option<f32>,
    /// A second oracle computing in f32 (fixture path under `fixtures/`, cases matched by
    /// name): every token must equal its ids.
    #[serde(default)]
    pub strict_oracle: Option<String>,
}

fn yes() -> bool {
    true
}

/// The whole manifest.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// Schema version; must be [`MANIFEST_FORMAT_VERSION`].
    pub format_version: u32,
    /// Every named model, in the file's order (`kvlab models` lists them so).
    pub models: Vec<ModelEntry>,
}

/// The manifest compiled into the binary from `fixtures/models.json`.
pub fn manifest() -> &'static Manifest {
    static M: OnceLock<Manifest> = OnceLock::new();
    M.get_or_init(|| {
        let m: Manifest = serde_json::from_str(include_str!("../../../fixtures/models.json"))
            .expect("fixtures/models.json is valid (checked by a test)");
        assert_eq!(
            m.format_version, MANIFEST_FORMAT_VERSION,
            "fixtures/models.json format_version"
        );
        m
    })
}

/// The manifest entry called `name` (case-insensitive).
pub fn entry(name: &str) -> Option<&'static ModelEntry> {
    manifest()
        .models
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name))
}

/// `$KVLAB_MODELS`, if set.
pub fn models_dir() -> Option<PathBuf> {
    std::env::var_os("KVLAB_MODELS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The user cache directory for downloaded checkpoints.
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("kvlab")
}

/// The checkpoints shipped inside the repository (`fixtures/models/`: the default model,
/// stories260K, and its tokenizer), found through the path this crate was compiled from, else
/// in the current directory or one above it (a binary built on one machine and run from a
/// checkout on another, as the GPU checks do); `None` when neither has the folder.
pub fn shipped_dir() -> Option<PathBuf> {
    let compiled_in = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf);
    let cwd = std::env::current_dir().ok();
    let around_cwd = cwd
        .iter()
        .flat_map(|d| d.ancestors())
        .map(Path::to_path_buf);
    compiled_in
        .into_iter()
        .chain(around_cwd)
        .map(|root| root.join("fixtures").join("models"))
        .find(|d| d.join("stories260K.bin").is_file())
}

/// The folders searched for a file, in order: `$KVLAB_MODELS`, the user cache, the shipped copy.
pub fn search_dirs() -> Vec<PathBuf> {
    models_dir()
        .into_iter()
        .chain([cache_dir()])
        .chain(shipped_dir())
        .collect()
}

/// Where a file is, if present: the first of [`search_dirs`] holding it.
pub fn find_file(f: &FileRef) -> Option<PathBuf> {
    find_named(&f.file)
}

/// A file, or a Hugging Face folder (a directory with a `config.json`).
fn find_named(file: &str) -> Option<PathBuf> {
    search_dirs()
        .into_iter()
        .map(|d| d.join(file))
        .find(|p| p.is_file() || crate::load::hf::is_hf_dir(p))
}

/// Where a file was looked for, for error messages.
pub fn searched_places(f: &FileRef) -> String {
    searched_for(&f.file)
}

fn searched_for(file: &str) -> String {
    let mut v = Vec::new();
    if models_dir().is_none() {
        v.push("$KVLAB_MODELS (not set)".to_string());
    }
    v.extend(
        search_dirs()
            .into_iter()
            .map(|d| d.join(file).display().to_string()),
    );
    v.join(", ")
}

/// The sha256 of a file, as lowercase hex; of a Hugging Face folder, its `model.safetensors`'s
/// (what the manifest records for one).
///
/// # Errors
/// [`Error::Open`] / [`Error::Io`].
pub fn sha256_file(path: &Path) -> Result<String> {
    if crate::load::hf::is_hf_dir(path) {
        return sha256_file(&path.join("model.safetensors"));
    }
    let mut f = std::fs::File::open(path).map_err(|source| Error::Open {
        path: path.into(),
        source,
    })?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|source| Error::Io {
            path: path.into(),
            source,
        })?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A model ready to run, with its tokenizer when it has one.
pub struct Loaded {
    /// The manifest name, or for a model given by path a name taken from the path.
    pub name: String,
    /// Config and weights.
    pub model: Model,
    /// `None` for a llama2.c or synthetic model without a tokenizer file.
    pub tokenizer: Option<Tokenizer>,
    /// Files it was read from.
    pub files: Vec<PathBuf>,
}

/// What [`locate`] found for a name.
pub enum Located {
    /// Every file is present.
    Ready {
        /// The manifest entry.
        entry: &'static ModelEntry,
        /// Where the model file (or folder) is; `None` for a synthetic model.
        model: Option<PathBuf>,
        /// Where the separate tokenizer file is; `None` when the entry has none.
        tokenizer: Option<PathBuf>,
    },
    /// A file is missing: the reference to fetch, and where it was looked for.
    Missing {
        /// The manifest entry.
        entry: &'static ModelEntry,
        /// The first file not found (the model's before the tokenizer's).
        file: &'static FileRef,
        /// The places it was looked for, comma-separated ([`searched_places`]).
        searched: String,
    },
}

/// Finds a manifest model's files.
///
/// # Errors
/// [`Error::UnknownModel`] for a name not in the manifest (the message lists the known names).
pub fn locate(name: &str) -> Result<Located> {
    let entry = entry(name).ok_or_else(|| {
        let names: Vec<_> = manifest().models.iter().map(|m| m.name.as_str()).collect();
        Error::UnknownModel {
            name: name.into(),
            known: names.join(", "),
        }
    })?;
    let mut found = [None, None];
    for (slot, f) in found.iter_mut().zip([&entry.model, &entry.tokenizer]) {
        if let Some(f) = f {
            match find_file(f) {
                Some(p) => *slot = Some(p),
                None => {
                    return Ok(Located::Missing {
                        entry,
                        file: f,
                        searched: searched_places(f),
                    });
                }
            }
        }
    }
    let [model, tokenizer] = found;
    Ok(Located::Ready {
        entry,
        model,
        tokenizer,
    })
}

/// Loads a model from a manifest entry whose files were located.
///
/// # Errors
/// Whatever the format's loader returns.
pub fn load_entry(
    entry: &ModelEntry,
    model: Option<&Path>,
    tokenizer: Option<&Path>,
) -> Result<Loaded> {
    let mut files: Vec<PathBuf> = model
        .into_iter()
        .chain(tokenizer)
        .map(Path::to_path_buf)
        .collect();
    let (m, tok) = match (entry.format, model) {
        (Format::Llama2c, Some(path)) => load_llama2c(path, tokenizer)?,
        (Format::Synthetic, _) => {
            let m = synthetic_spec(entry)?.build()?;
            let tok = tokenizer
                .map(|t| Tokenizer::load_llama2c(t, m.config.vocab_size))
                .transpose()?;
            (m, tok)
        }
        (Format::Gguf, Some(path)) => {
            let (m, t) = crate::load_gguf(path)?;
            files.truncate(1);
            (m, Some(t))
        }
        (Format::Hf, Some(dir)) => {
            let (m, t, read) = crate::load::hf::load_hf_dir(dir)?;
            files = read;
            (m, Some(t))
        }
        (_, None) => return Err(no_model_file(entry)),
    };
    Ok(Loaded {
        name: entry.name.clone(),
        model: m,
        tokenizer: tok,
        files,
    })
}

/// A manifest model's config, without building its weights (`kvlab info` on an 8B shape must
/// not allocate 32 GB): synthetic models from their spec, llama2.c and GGUF files from their
/// headers.
///
/// # Errors
/// Whatever the format's header reader or loader returns.
pub fn entry_config(entry: &ModelEntry, model: Option<&Path>) -> Result<crate::Config> {
    match (entry.format, model) {
        (Format::Synthetic, _) => {
            let c = synthetic_spec(entry)?.config();
            c.validate()?;
            Ok(c)
        }
        (Format::Llama2c, Some(p)) => crate::load::llama2c::read_config(p),
        (Format::Gguf, Some(p)) => crate::load::gguf::model::read_gguf_config(p),
        (Format::Hf, Some(p)) => crate::load::hf::read_hf_config(p).map(|(c, _)| c),
        (_, None) => Err(no_model_file(entry)),
    }
}

fn synthetic_spec(entry: &ModelEntry) -> Result<&SyntheticSpec> {
    let no_spec = || Error::Format(format!("{} has no synthetic spec", entry.name));
    entry.synthetic.as_ref().ok_or_else(no_spec)
}

fn no_model_file(entry: &ModelEntry) -> Error {
    Error::Format(format!("{} has no model file in the manifest", entry.name))
}

/// Loads a llama2.c checkpoint and, if given, its tokenizer.
///
/// # Errors
/// As [`crate::load::llama2c::load`] and [`Tokenizer::load_llama2c`].
pub fn load_llama2c(model: &Path, tokenizer: Option<&Path>) -> Result<(Model, Option<Tokenizer>)> {
    let m = crate::load::llama2c::load(model)?;
    let t = tokenizer
        .map(|t| Tokenizer::load_llama2c(t, m.config.vocab_size))
        .transpose()?;
    Ok((m, t))
}

/// For tests of real checkpoints: the file where the CLI would find it ([`search_dirs`]:
/// `$KVLAB_MODELS`, the user cache, the shipped copy). Absent, it says so loudly on stderr
/// ("SKIPPED: ...", written to the stderr handle so libtest's capture does not hide it) and
/// returns `None`, so the test can return early. Tests of checkpoints a clone lacks (Gemma,
/// the Llama 2 `tokenizer.bin`) are also marked `#[ignore = "needs ...: set KVLAB_MODELS"]`, so
/// libtest counts them as not run; CI runs them with `--include-ignored`.
///
/// # Panics
/// When the file is absent and `KVLAB_REQUIRE_MODELS=1` (CI), so a missing checkpoint fails
/// instead of silently skipping.
pub fn test_model_file(file: &str) -> Option<PathBuf> {
    if let Some(p) = find_named(file) {
        return Some(p);
    }
    let msg = format!(
        "real model file {file} not found in {}; set KVLAB_MODELS to the folder holding it",
        searched_for(file)
    );
    assert!(
        std::env::var("KVLAB_REQUIRE_MODELS").as_deref() != Ok("1"),
        "KVLAB_REQUIRE_MODELS=1: {msg}"
    );
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {msg}");
    None
}

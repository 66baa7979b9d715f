//! The tensors of a Hugging Face checkpoint: `model.safetensors`, or the shards that
//! `model.safetensors.index.json` names (`weight_map`: tensor name → file). Each file is
//! memory-mapped and its header parsed by the `safetensors` crate; a tensor is then a range of
//! the map, read in place: f32 as f32, f16 and bf16 kept encoded (the CPU kernels read them as
//! stored; whoever wants f32 decodes one tensor at a time), so loading copies nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::weights::Tensor;
use crate::{Error, GgmlType, Result};

/// Where one tensor lies.
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte offset in the file's map.
    start: usize,
    n_bytes: usize,
}

/// Every tensor of a checkpoint, by name.
pub struct SafetensorsFiles {
    paths: Vec<PathBuf>,
    maps: Vec<Arc<Mmap>>,
    tensors: HashMap<String, Entry>,
}

fn format_err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Format(format!("{}: {what}", path.display()))
}

impl SafetensorsFiles {
    /// Opens the checkpoint of folder `dir`: `model.safetensors.index.json` when present, else
    /// `model.safetensors`.
    ///
    /// # Errors
    /// [`Error::Open`] for a missing or unreadable file; [`Error::Format`] for a malformed index
    /// or header (the `safetensors` crate checks offsets against the file size), or a tensor
    /// named twice.
    pub fn open(dir: &Path) -> Result<SafetensorsFiles> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|source| Error::Open {
                path: index.clone(),
                source,
            })?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| format_err(&index, e))?;
            let map = v["weight_map"]
                .as_object()
                .ok_or_else(|| format_err(&index, "no weight_map object"))?;
            let mut names: Vec<&str> = map.values().filter_map(|f| f.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            for n in &names {
                if n.contains('/') || n.contains('\\') || n.starts_with('.') {
                    return Err(format_err(
                        &index,
                        format!("shard name {n:?} leaves the folder"),
                    ));
                }
            }
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            vec![dir.join("model.safetensors")]
        };
        let mut out = SafetensorsFiles {
            paths: Vec::new(),
            maps: Vec::new(),
            tensors: HashMap::new(),
        };
        for path in files {
            out.add(path)?;
        }
        Ok(out)
    }

    fn add(&mut self, path: PathBuf) -> Result<()> {
        let file = std::fs::File::open(&path).map_err(|source| Error::Open {
            path: path.clone(),
            source,
        })?;
        // SAFETY: the map is read-only and the file is not written by kvlab while mapped; a
        // checkpoint rewritten underneath a running process is outside what we guard against
        // (as for llama.cpp's and safetensors' own mmap loading).
        let map = unsafe { Mmap::map(&file) }.map_err(|source| Error::Open {
            path: path.clone(),
            source,
        })?;
        let (header_len, meta) =
            SafeTensors::read_metadata(&map).map_err(|e| format_err(&path, e))?;
        let data_start = 8 + header_len;
        let file_index = self.maps.len();
        for (name, info) in meta.tensors() {
            let (a, b) = info.data_offsets;
            let entry = Entry {
                file: file_index,
                dtype: info.dtype,
                shape: info.shape.clone(),
                start: data_start + a,
                n_bytes: b - a,
            };
            if self.tensors.insert(name.clone(), entry).is_some() {
                return Err(format_err(
                    &path,
                    format!("tensor {name} appears in two shards"),
                ));
            }
        }
        self.paths.push(path);
        self.maps.push(Arc::new(map));
        Ok(())
    }

    /// Whether the checkpoint holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The files read.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Tensor `name`, checked to have `shape` (row-major, as HF stores `(out, in)` weights).
    ///
    /// # Errors
    /// [`Error::Format`] if it is missing, has another shape, or a dtype other than F32, F16,
    /// BF16.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::Format(format!("the checkpoint has no tensor {name}")))?;
        let path = &self.paths[e.file];
        if e.shape != shape {
            return Err(format_err(
                path,
                format!(
                    "tensor {name} has shape {:?}, the config implies {shape:?}",
                    e.shape
                ),
            ));
        }
        let len: usize = shape.iter().product();
        let map = &self.maps[e.file];
        let (ty, width) = match e.dtype {
            Dtype::F32 => (GgmlType::F32, 4),
            Dtype::F16 => (GgmlType::F16, 2),
            Dtype::BF16 => (GgmlType::BF16, 2),
            other => {
                return Err(format_err(
                    path,
                    format!("tensor {name} is {other:?}; kvlab reads F32, F16 and BF16"),
                ));
            }
        };
        if e.n_bytes != len * width {
            return Err(format_err(
                path,
                format!("tensor {name} has {} bytes for {len} elements", e.n_bytes),
            ));
        }
        let t = if ty == GgmlType::F32 {
            Tensor::from_map(map, e.start, len)
        } else {
            Tensor::encoded_from_map(map, ty, e.start, len)
        };
        t.ok_or_else(|| format_err(path, format!("tensor {name} lies outside the file")))
    }
}

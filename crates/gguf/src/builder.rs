//! `GgufBuilder`: writes small GGUF files in memory, for tests and synthetic models.
//!
//! It writes what [`crate::GgufFile`] reads (v3 by default, little-endian, tensors laid out in
//! order, each at the next multiple of the alignment). Tests that need a malformed file build a
//! good one and then patch bytes.

use crate::metadata::{MetadataArray, MetadataValue};
use crate::types::GgmlType;

/// Builder for an in-memory GGUF file.
#[derive(Clone, Debug)]
pub struct GgufBuilder {
    version: u32,
    kvs: Vec<(String, MetadataValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufBuilder {
    /// An empty GGUF v3 file.
    pub fn new() -> Self {
        GgufBuilder {
            version: 3,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the version field written to the header.
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// Adds a metadata pair (`general.alignment` as U32 also sets the data alignment).
    pub fn kv(mut self, key: &str, value: MetadataValue) -> Self {
        self.kvs.push((key.to_string(), value));
        self
    }

    /// Drops every metadata pair under `key` (to write a file without it, or, followed by
    /// [`GgufBuilder::kv`], with another value).
    pub fn without_kv(mut self, key: &str) -> Self {
        self.kvs.retain(|(k, _)| k != key);
        self
    }

    /// Adds a tensor with `ne` in GGUF order and raw (already quantized) data.
    pub fn tensor(mut self, name: &str, ne: &[u64], ty: GgmlType, data: Vec<u8>) -> Self {
        self.tensors.push((name.to_string(), ne.to_vec(), ty, data));
        self
    }

    /// Adds an F32 tensor with `ne` in GGUF order; `data` is row-major (`ne` reversed).
    pub fn tensor_f32(self, name: &str, ne: &[u64], data: &[f32]) -> Self {
        let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, ne, GgmlType::F32, bytes)
    }

    fn alignment(&self) -> usize {
        self.kvs
            .iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", MetadataValue::U32(a)) if *a > 0 => Some(*a as usize),
                _ => None,
            })
            .unwrap_or(crate::file::DEFAULT_ALIGNMENT as usize)
    }

    /// The file's bytes.
    pub fn build(&self) -> Vec<u8> {
        let align = self.alignment();
        let pad = |n: usize| n.div_ceil(align) * align;
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            put_value(&mut out, v, true);
        }
        let mut offset = 0usize;
        for (name, ne, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = pad(offset + data.len());
        }
        out.resize(pad(out.len()), 0);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            out.resize(pad(out.len()), 0);
        }
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &MetadataValue, with_type: bool) {
    if with_type {
        out.extend_from_slice(&v.type_id().to_le_bytes());
    }
    match v {
        MetadataValue::U8(x) => out.push(*x),
        MetadataValue::I8(x) => out.push(*x as u8),
        MetadataValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::Bool(x) => out.push(u8::from(*x)),
        MetadataValue::String(s) => put_str(out, s),
        MetadataValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::Array(a) => {
            // Element type, count, elements (each written without its own type id).
            let elems: Vec<MetadataValue> = match a {
                MetadataArray::U8(v) => v.iter().map(|&x| MetadataValue::U8(x)).collect(),
                MetadataArray::I8(v) => v.iter().map(|&x| MetadataValue::I8(x)).collect(),
                MetadataArray::U16(v) => v.iter().map(|&x| MetadataValue::U16(x)).collect(),
                MetadataArray::I16(v) => v.iter().map(|&x| MetadataValue::I16(x)).collect(),
                MetadataArray::U32(v) => v.iter().map(|&x| MetadataValue::U32(x)).collect(),
                MetadataArray::I32(v) => v.iter().map(|&x| MetadataValue::I32(x)).collect(),
                MetadataArray::F32(v) => v.iter().map(|&x| MetadataValue::F32(x)).collect(),
                MetadataArray::Bool(v) => v.iter().map(|&x| MetadataValue::Bool(x)).collect(),
                MetadataArray::String(v) => {
                    v.iter().map(|x| MetadataValue::String(x.into())).collect()
                }
                MetadataArray::U64(v) => v.iter().map(|&x| MetadataValue::U64(x)).collect(),
                MetadataArray::I64(v) => v.iter().map(|&x| MetadataValue::I64(x)).collect(),
                MetadataArray::F64(v) => v.iter().map(|&x| MetadataValue::F64(x)).collect(),
            };
            out.extend_from_slice(&a.element_type_id().to_le_bytes());
            out.extend_from_slice(&(elems.len() as u64).to_le_bytes());
            for e in &elems {
                put_value(out, e, false);
            }
        }
    }
}

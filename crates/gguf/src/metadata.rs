//! GGUF metadata: typed key-value pairs (`gemma3.block_count = 18u32`,
//! `tokenizer.ggml.tokens = [string; 262144]`, ...), parsed once and looked up by key with typed
//! accessors that return [`GgufError::MissingKey`] or [`GgufError::WrongType`].
//!
//! On disk each pair is: key (GGUF string), value type (u32), value. Scalars are little-endian;
//! a string is a u64 length then bytes; an array is element type (u32), count (u64), elements.

use std::collections::HashMap;
use std::fmt;
use std::ops::Index;

use crate::error::{GgufError, Result};
use crate::reader::Cursor;

/// GGUF value type ids (`enum gguf_type` in llama.cpp's `ggml/include/gguf.h`).
mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
    /// Each type's short name, indexed by id.
    pub const NAMES: [&str; 13] = [
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64",
        "f64",
    ];
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    /// GGUF type 0 (`GGUF_TYPE_UINT8`).
    U8(u8),
    /// GGUF type 1 (`GGUF_TYPE_INT8`).
    I8(i8),
    /// GGUF type 2 (`GGUF_TYPE_UINT16`), little-endian like every scalar.
    U16(u16),
    /// GGUF type 3 (`GGUF_TYPE_INT16`).
    I16(i16),
    /// GGUF type 4 (`GGUF_TYPE_UINT32`): most hyperparameters, e.g. `llama.block_count`.
    U32(u32),
    /// GGUF type 5 (`GGUF_TYPE_INT32`).
    I32(i32),
    /// GGUF type 6 (`GGUF_TYPE_FLOAT32`), e.g. `llama.rope.freq_base`.
    F32(f32),
    /// GGUF type 7 (`GGUF_TYPE_BOOL`): one byte; any nonzero byte reads as `true`.
    Bool(bool),
    /// GGUF type 8 (`GGUF_TYPE_STRING`): u64 length, then UTF-8 bytes (no NUL).
    String(String),
    /// GGUF type 10 (`GGUF_TYPE_UINT64`).
    U64(u64),
    /// GGUF type 11 (`GGUF_TYPE_INT64`).
    I64(i64),
    /// GGUF type 12 (`GGUF_TYPE_FLOAT64`).
    F64(f64),
    /// GGUF type 9 (`GGUF_TYPE_ARRAY`): element type (u32), count (u64), elements.
    Array(MetadataArray),
}

/// A homogeneous metadata array. Arrays of arrays are legal GGUF but no model uses them and
/// llama.cpp rejects them too; this reader reports them as [`GgufError::BadMetadataValue`].
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataArray {
    /// Elements of GGUF type 0 (u8).
    U8(Vec<u8>),
    /// Elements of GGUF type 1 (i8).
    I8(Vec<i8>),
    /// Elements of GGUF type 2 (u16).
    U16(Vec<u16>),
    /// Elements of GGUF type 3 (i16).
    I16(Vec<i16>),
    /// Elements of GGUF type 4 (u32).
    U32(Vec<u32>),
    /// Elements of GGUF type 5 (i32), e.g. `tokenizer.ggml.token_type` (vocab_size,).
    I32(Vec<i32>),
    /// Elements of GGUF type 6 (f32), e.g. `tokenizer.ggml.scores` (vocab_size,).
    F32(Vec<f32>),
    /// Elements of GGUF type 7 (bool, one byte each).
    Bool(Vec<bool>),
    /// Elements of GGUF type 8 (string), e.g. `tokenizer.ggml.tokens` (vocab_size,).
    String(StringArray),
    /// Elements of GGUF type 10 (u64).
    U64(Vec<u64>),
    /// Elements of GGUF type 11 (i64).
    I64(Vec<i64>),
    /// Elements of GGUF type 12 (f64).
    F64(Vec<f64>),
}

/// An array of strings kept back to back in one buffer, e.g. `tokenizer.ggml.tokens`
/// (vocab_size,): two allocations however many strings, instead of one `String` each (Gemma 3's
/// 262,144 tokens take 2.4 MB of text and 2 MB of offsets this way, not ~15 MB as `Vec<String>`).
///
/// Built by the parser, or from any list of strings (`vec!["a".to_string()].into()`,
/// `StringArray::from_iter(["a", "b"])`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StringArray {
    /// All strings concatenated.
    text: String,
    /// `ends[i]`: byte offset in `text` one past string i. (len,)
    ends: Vec<usize>,
}

impl StringArray {
    /// An empty array with room for `n` strings of `text_bytes` bytes in all.
    pub fn with_capacity(n: usize, text_bytes: usize) -> Self {
        StringArray {
            text: String::with_capacity(text_bytes),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends a string.
    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.ends.push(self.text.len());
    }

    /// Number of strings.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are no strings.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// String `i`, or `None` if `i >= len()`.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.text[start..end])
    }

    /// The strings in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + DoubleEndedIterator + Clone + '_ {
        (0..self.ends.len()).map(|i| &self[i])
    }

    /// Bytes of all strings together (the sum of their lengths).
    pub fn text_len(&self) -> usize {
        self.text.len()
    }
}

/// String `i`; panics if `i >= len()`, like a slice (use [`StringArray::get`] otherwise).
impl Index<usize> for StringArray {
    type Output = str;
    fn index(&self, i: usize) -> &str {
        match self.get(i) {
            Some(s) => s,
            None => panic!("index {i} out of range for a StringArray of {}", self.len()),
        }
    }
}

impl<S: AsRef<str>> FromIterator<S> for StringArray {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut a = StringArray::default();
        for s in iter {
            a.push(s.as_ref());
        }
        a
    }
}

impl From<Vec<String>> for StringArray {
    fn from(v: Vec<String>) -> Self {
        v.iter().collect()
    }
}

impl From<Vec<&str>> for StringArray {
    fn from(v: Vec<&str>) -> Self {
        v.iter().collect()
    }
}

impl fmt::Debug for StringArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl MetadataArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetadataArray::U8(v) => v.len(),
            MetadataArray::I8(v) => v.len(),
            MetadataArray::U16(v) => v.len(),
            MetadataArray::I16(v) => v.len(),
            MetadataArray::U32(v) => v.len(),
            MetadataArray::I32(v) => v.len(),
            MetadataArray::F32(v) => v.len(),
            MetadataArray::Bool(v) => v.len(),
            MetadataArray::String(v) => v.len(),
            MetadataArray::U64(v) => v.len(),
            MetadataArray::I64(v) => v.len(),
            MetadataArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements' GGUF value type id.
    pub(crate) fn element_type_id(&self) -> u32 {
        match self {
            MetadataArray::U8(_) => ty::U8,
            MetadataArray::I8(_) => ty::I8,
            MetadataArray::U16(_) => ty::U16,
            MetadataArray::I16(_) => ty::I16,
            MetadataArray::U32(_) => ty::U32,
            MetadataArray::I32(_) => ty::I32,
            MetadataArray::F32(_) => ty::F32,
            MetadataArray::Bool(_) => ty::BOOL,
            MetadataArray::String(_) => ty::STRING,
            MetadataArray::U64(_) => ty::U64,
            MetadataArray::I64(_) => ty::I64,
            MetadataArray::F64(_) => ty::F64,
        }
    }

    /// Element type name, as in [`MetadataValue::type_name`].
    pub fn element_type_name(&self) -> &'static str {
        ty::NAMES[self.element_type_id() as usize]
    }
}

impl MetadataValue {
    /// The value's GGUF type id.
    pub(crate) fn type_id(&self) -> u32 {
        match self {
            MetadataValue::U8(_) => ty::U8,
            MetadataValue::I8(_) => ty::I8,
            MetadataValue::U16(_) => ty::U16,
            MetadataValue::I16(_) => ty::I16,
            MetadataValue::U32(_) => ty::U32,
            MetadataValue::I32(_) => ty::I32,
            MetadataValue::F32(_) => ty::F32,
            MetadataValue::Bool(_) => ty::BOOL,
            MetadataValue::String(_) => ty::STRING,
            MetadataValue::Array(_) => ty::ARRAY,
            MetadataValue::U64(_) => ty::U64,
            MetadataValue::I64(_) => ty::I64,
            MetadataValue::F64(_) => ty::F64,
        }
    }

    /// The value's type as a short name: `u32`, `f32`, `string`, `array<string>`, ...
    pub fn type_name(&self) -> String {
        match self {
            MetadataValue::Array(a) => format!("array<{}>", a.element_type_name()),
            v => ty::NAMES[v.type_id() as usize].into(),
        }
    }

    /// The value as an integer if it is one of the integer types (any width, any sign).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    fn parse(c: &mut Cursor<'_>, type_id: u32, key: &str) -> Result<Self> {
        let what = format!("value of metadata key '{key}'");
        let w = what.as_str();
        Ok(match type_id {
            ty::U8 => MetadataValue::U8(c.u8(w)?),
            ty::I8 => MetadataValue::I8(c.i8(w)?),
            ty::U16 => MetadataValue::U16(c.u16(w)?),
            ty::I16 => MetadataValue::I16(c.i16(w)?),
            ty::U32 => MetadataValue::U32(c.u32(w)?),
            ty::I32 => MetadataValue::I32(c.i32(w)?),
            ty::F32 => MetadataValue::F32(c.f32(w)?),
            ty::BOOL => MetadataValue::Bool(c.u8(w)? != 0),
            ty::STRING => MetadataValue::String(c.string(w)?.to_owned()),
            ty::U64 => MetadataValue::U64(c.u64(w)?),
            ty::I64 => MetadataValue::I64(c.i64(w)?),
            ty::F64 => MetadataValue::F64(c.f64(w)?),
            ty::ARRAY => MetadataValue::Array(parse_array(c, key)?),
            other => {
                return Err(GgufError::BadMetadataValue {
                    key: key.to_string(),
                    reason: format!("value type id {other} is not in GGUF's table 0..=12"),
                });
            }
        })
    }
}

/// Reads `count` items with `read`, after checking that `count * min_bytes` bytes remain.
fn read_vec<T>(
    c: &mut Cursor<'_>,
    count: u64,
    min_bytes: u64,
    what: &str,
    mut read: impl FnMut(&mut Cursor<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let n = c.check_count(count, min_bytes, what)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(read(c)?);
    }
    Ok(v)
}

/// Reads `count` GGUF strings into one [`StringArray`]. A first pass over a copy of the cursor
/// checks every length against the bytes left and sums them, so the text buffer is allocated
/// once at its exact size (bounded by the file), then a second pass copies and checks UTF-8.
fn parse_strings(c: &mut Cursor<'_>, count: u64, what: &str) -> Result<StringArray> {
    // Each string takes at least its 8-byte length.
    let n = c.check_count(count, 8, what)?;
    let mut sizing = c.clone();
    let mut text_bytes = 0usize;
    for _ in 0..n {
        let len = sizing.u64(what)?;
        // `bytes` fails unless `len` bytes remain, so the sum stays below the file's length.
        text_bytes += sizing.bytes(len, what)?.len();
    }
    let mut a = StringArray::with_capacity(n, text_bytes);
    for _ in 0..n {
        a.push(c.string(what)?);
    }
    Ok(a)
}

fn parse_array(c: &mut Cursor<'_>, key: &str) -> Result<MetadataArray> {
    let what = format!("array for metadata key '{key}'");
    let w = what.as_str();
    let elem = c.u32(w)?;
    let n = c.u64(w)?;
    Ok(match elem {
        ty::U8 => MetadataArray::U8(read_vec(c, n, 1, w, |c| c.u8(w))?),
        ty::I8 => MetadataArray::I8(read_vec(c, n, 1, w, |c| c.i8(w))?),
        ty::U16 => MetadataArray::U16(read_vec(c, n, 2, w, |c| c.u16(w))?),
        ty::I16 => MetadataArray::I16(read_vec(c, n, 2, w, |c| c.i16(w))?),
        ty::U32 => MetadataArray::U32(read_vec(c, n, 4, w, |c| c.u32(w))?),
        ty::I32 => MetadataArray::I32(read_vec(c, n, 4, w, |c| c.i32(w))?),
        ty::F32 => MetadataArray::F32(read_vec(c, n, 4, w, |c| c.f32(w))?),
        ty::BOOL => MetadataArray::Bool(read_vec(c, n, 1, w, |c| Ok(c.u8(w)? != 0))?),
        ty::STRING => MetadataArray::String(parse_strings(c, n, w)?),
        ty::U64 => MetadataArray::U64(read_vec(c, n, 8, w, |c| c.u64(w))?),
        ty::I64 => MetadataArray::I64(read_vec(c, n, 8, w, |c| c.i64(w))?),
        ty::F64 => MetadataArray::F64(read_vec(c, n, 8, w, |c| c.f64(w))?),
        ty::ARRAY => {
            return Err(GgufError::BadMetadataValue {
                key: key.to_string(),
                reason: "arrays of arrays are not supported (llama.cpp rejects them too)".into(),
            });
        }
        other => {
            return Err(GgufError::BadMetadataValue {
                key: key.to_string(),
                reason: format!("array element type id {other} is not in GGUF's table 0..=12"),
            });
        }
    })
}

/// Smallest possible key-value pair on disk: key length (8) + value type (4) + 1 byte of value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;

/// All metadata of a file, in file order, with lookup by key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, MetadataValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub(crate) fn parse(c: &mut Cursor<'_>, count: u64) -> Result<Self> {
        let n = c.check_count(count, MIN_KV_BYTES, "metadata key-value pairs")?;
        let mut md = Metadata {
            entries: Vec::with_capacity(n),
            index: HashMap::with_capacity(n),
        };
        for i in 0..n {
            let key = c.string(&format!("key of metadata pair {i}"))?.to_owned();
            let type_id = c.u32(&format!("value type of metadata key '{key}'"))?;
            let value = MetadataValue::parse(c, type_id, &key)?;
            md.insert(key, value)?;
        }
        Ok(md)
    }

    /// Adds a pair; fails on a duplicate key.
    pub(crate) fn insert(&mut self, key: String, value: MetadataValue) -> Result<()> {
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key });
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// Number of key-value pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the file has no metadata.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// All pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The raw value of `key`, or `None`.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// The raw value of `key`, or [`GgufError::MissingKey`].
    pub fn require(&self, key: &str) -> Result<&MetadataValue> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn wrong(key: &str, expected: &'static str, v: &MetadataValue) -> GgufError {
        let found = match v.as_i128() {
            Some(i) => format!("{} {i}", v.type_name()),
            None => v.type_name(),
        };
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found,
        }
    }

    fn int<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|i| T::try_from(i).ok())
            .ok_or_else(|| Self::wrong(key, expected, v))
    }

    /// An unsigned integer that fits u32. Any integer type is accepted when its value fits
    /// (writers differ: llama.cpp writes u32, some tools write i32 or u64).
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.int(key, "an integer that fits u32")
    }

    /// An unsigned integer that fits u64 (any integer type whose value is >= 0).
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.int(key, "an integer that fits u64")
    }

    /// A non-negative integer as usize (any integer type whose value fits).
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.int(key, "an integer that fits usize")
    }

    /// A signed integer that fits i64.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.int(key, "an integer that fits i64")
    }

    /// A float: f32 as is, f64 narrowed to f32.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            MetadataValue::F32(v) => Ok(*v),
            MetadataValue::F64(v) => Ok(*v as f32),
            v => Err(Self::wrong(key, "f32", v)),
        }
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            MetadataValue::Bool(v) => Ok(*v),
            v => Err(Self::wrong(key, "bool", v)),
        }
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            MetadataValue::String(v) => Ok(v),
            v => Err(Self::wrong(key, "string", v)),
        }
    }

    /// An array of strings, e.g. `tokenizer.ggml.tokens` (vocab_size,).
    pub fn get_str_array(&self, key: &str) -> Result<&StringArray> {
        match self.require(key)? {
            MetadataValue::Array(MetadataArray::String(v)) => Ok(v),
            v => Err(Self::wrong(key, "array<string>", v)),
        }
    }

    /// An array of f32, e.g. `tokenizer.ggml.scores` (vocab_size,).
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32]> {
        match self.require(key)? {
            MetadataValue::Array(MetadataArray::F32(v)) => Ok(v),
            v => Err(Self::wrong(key, "array<f32>", v)),
        }
    }

    /// An array of i32, e.g. `tokenizer.ggml.token_type` (vocab_size,): 1 normal, 2 unknown,
    /// 3 control, 4 user defined, 5 unused, 6 byte (llama.cpp's `llama_token_type`).
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32]> {
        match self.require(key)? {
            MetadataValue::Array(MetadataArray::I32(v)) => Ok(v),
            v => Err(Self::wrong(key, "array<i32>", v)),
        }
    }

    /// Like [`Metadata::get_u32`] but `Ok(None)` when the key is absent (a wrong type is still
    /// an error). For optional keys such as `gemma3.attention.sliding_window`.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.optional(key, Self::get_u32)
    }

    /// Like [`Metadata::get_f32`] but `Ok(None)` when the key is absent.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.optional(key, Self::get_f32)
    }

    /// Like [`Metadata::get_bool`] but `Ok(None)` when the key is absent.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.optional(key, Self::get_bool)
    }

    fn optional<T>(&self, key: &str, f: impl Fn(&Self, &str) -> Result<T>) -> Result<Option<T>> {
        if self.contains(key) {
            f(self, key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// `general.architecture`, e.g. `"gemma3"`; model keys are prefixed with it.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    /// `general.alignment` if present (validated at parse time), else GGUF's default 32.
    pub fn alignment(&self) -> u64 {
        match self.get("general.alignment") {
            Some(MetadataValue::U32(a)) => u64::from(*a),
            _ => crate::file::DEFAULT_ALIGNMENT,
        }
    }
}

/// Shows scalars in full and arrays abbreviated: `[string; 262144] ["<pad>", "<eos>", ...]`.
impl fmt::Display for MetadataValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T: fmt::Debug>(
            f: &mut fmt::Formatter<'_>,
            name: &str,
            v: impl ExactSizeIterator<Item = T>,
        ) -> fmt::Result {
            const SHOW: usize = 4;
            let len = v.len();
            write!(f, "[{name}; {len}] [")?;
            for (i, x) in v.take(SHOW).enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{x:?}")?;
            }
            if len > SHOW {
                f.write_str(", ...")?;
            }
            f.write_str("]")
        }
        match self {
            MetadataValue::U8(v) => write!(f, "{v}"),
            MetadataValue::I8(v) => write!(f, "{v}"),
            MetadataValue::U16(v) => write!(f, "{v}"),
            MetadataValue::I16(v) => write!(f, "{v}"),
            MetadataValue::U32(v) => write!(f, "{v}"),
            MetadataValue::I32(v) => write!(f, "{v}"),
            MetadataValue::F32(v) => write!(f, "{v:e}"),
            MetadataValue::Bool(v) => write!(f, "{v}"),
            MetadataValue::String(v) if v.chars().count() > 120 => {
                let head: String = v.chars().take(117).collect();
                write!(f, "{head:?}... ({} bytes)", v.len())
            }
            MetadataValue::String(v) => write!(f, "{v:?}"),
            MetadataValue::U64(v) => write!(f, "{v}"),
            MetadataValue::I64(v) => write!(f, "{v}"),
            MetadataValue::F64(v) => write!(f, "{v:e}"),
            MetadataValue::Array(a) => match a {
                MetadataArray::U8(v) => list(f, "u8", v.iter()),
                MetadataArray::I8(v) => list(f, "i8", v.iter()),
                MetadataArray::U16(v) => list(f, "u16", v.iter()),
                MetadataArray::I16(v) => list(f, "i16", v.iter()),
                MetadataArray::U32(v) => list(f, "u32", v.iter()),
                MetadataArray::I32(v) => list(f, "i32", v.iter()),
                MetadataArray::F32(v) => list(f, "f32", v.iter()),
                MetadataArray::Bool(v) => list(f, "bool", v.iter()),
                MetadataArray::String(v) => list(f, "string", v.iter()),
                MetadataArray::U64(v) => list(f, "u64", v.iter()),
                MetadataArray::I64(v) => list(f, "i64", v.iter()),
                MetadataArray::F64(v) => list(f, "f64", v.iter()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md() -> Metadata {
        let mut m = Metadata::default();
        m.insert("a.u32".into(), MetadataValue::U32(18)).unwrap();
        m.insert("a.i32".into(), MetadataValue::I32(-1)).unwrap();
        m.insert("a.u64".into(), MetadataValue::U64(7)).unwrap();
        m.insert("a.f32".into(), MetadataValue::F32(1e-6)).unwrap();
        m.insert("a.str".into(), MetadataValue::String("gemma3".into()))
            .unwrap();
        m.insert(
            "a.toks".into(),
            MetadataValue::Array(MetadataArray::String(vec!["<pad>", "x"].into())),
        )
        .unwrap();
        m
    }

    #[test]
    fn typed_getters() {
        let m = md();
        assert_eq!(m.get_u32("a.u32").unwrap(), 18);
        assert_eq!(m.get_u32("a.u64").unwrap(), 7);
        assert_eq!(m.get_i64("a.i32").unwrap(), -1);
        assert_eq!(m.get_f32("a.f32").unwrap(), 1e-6);
        assert_eq!(m.get_str("a.str").unwrap(), "gemma3");
        assert_eq!(m.get_str_array("a.toks").unwrap().len(), 2);
        assert_eq!(m.opt_u32("nope").unwrap(), None);
        assert_eq!(m.opt_u32("a.u32").unwrap(), Some(18));
    }

    #[test]
    fn missing_key_and_wrong_type_are_typed_errors() {
        let m = md();
        let e = m.get_u32("gemma3.block_count").unwrap_err();
        assert!(matches!(e, GgufError::MissingKey { ref key } if key == "gemma3.block_count"));
        assert!(e.to_string().contains("kvlab info"), "{e}");
        let e = m.get_u32("a.str").unwrap_err();
        assert!(
            matches!(e, GgufError::WrongType { ref found, .. } if found == "string"),
            "{e}"
        );
        // A negative integer does not fit u32: wrong type, with the value in the message.
        let e = m.get_u32("a.i32").unwrap_err();
        assert!(e.to_string().contains("i32 -1"), "{e}");
        let e = m.get_f32_array("a.toks").unwrap_err();
        assert!(e.to_string().contains("array<string>"), "{e}");
        assert!(m.opt_u32("a.str").is_err());
    }

    #[test]
    fn duplicate_key_is_rejected() {
        let mut m = md();
        let e = m.insert("a.u32".into(), MetadataValue::U32(1)).unwrap_err();
        assert!(matches!(e, GgufError::DuplicateKey { .. }));
    }

    #[test]
    fn string_array_indexes_like_a_slice() {
        let a = StringArray::from(vec!["<pad>", "", "▁a"]);
        assert_eq!(a.len(), 3);
        assert_eq!((&a[0], &a[1], &a[2]), ("<pad>", "", "▁a"));
        assert_eq!(a.get(3), None);
        assert_eq!(a.iter().collect::<Vec<_>>(), ["<pad>", "", "▁a"]);
        assert_eq!(a.text_len(), "<pad>▁a".len());
        let v = MetadataValue::Array(MetadataArray::String(a));
        assert_eq!(v.to_string(), r#"[string; 3] ["<pad>", "", "▁a"]"#);
    }

    #[test]
    fn display_abbreviates_arrays() {
        let v = MetadataValue::Array(MetadataArray::I32(vec![1, 2, 3, 4, 5, 6]));
        assert_eq!(v.to_string(), "[i32; 6] [1, 2, 3, 4, ...]");
    }
}

//! GGUF v2/v3 reader over a byte slice: zero-copy, validating everything up front.
//!
//! [`Gguf::parse`] walks the whole header once and checks magic, version, counts, every
//! string and array length, value types, tensor dimensions (overflow-checked), tensor
//! types, the data layout (`general.alignment`, offsets in order) and that all tensor
//! data lies inside the file. After that, lookups cannot fail on malformed bytes. Errors
//! name what is wrong, the byte offset, and the key or tensor.
//!
//! Owns: the file format. Does not know what any key means to a model (see `model`).

mod error;
mod reader;
mod value;

pub use error::{name_from, GgufError, GgufErrorKind, Name};
pub use value::{Array, StrIter, Value, ValueType};

use crate::ggml_type::GgmlType;
use reader::Reader;

/// The most metadata keys keel indexes (real models have well under 100).
pub const MAX_KEYS: usize = 512;
/// The most tensors a file may declare (the largest dense models have under 1,000).
pub const MAX_TENSORS: u64 = 6144;
/// Slots of the duplicate-name table (a power of two, > MAX_TENSORS / 0.75).
const NAME_TABLE: usize = 8192;
/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

#[derive(Clone, Copy, Debug)]
struct KeyEntry {
    /// Offset of the key string's bytes and its length.
    key_at: u32,
    key_len: u32,
    /// Offset of the value (after its type id).
    value_at: u32,
    vtype: ValueType,
}

/// A parsed GGUF file borrowing its bytes.
#[derive(Clone, Debug)]
pub struct Gguf<'a> {
    bytes: &'a [u8],
    version: u32,
    keys: heapless::Vec<KeyEntry, MAX_KEYS>,
    n_tensors: usize,
    tensor_infos_at: usize,
    alignment: u64,
    data_start: u64,
    rows16: &'a [u64],
    splits: &'a [Split],
}

/// A tensor whose bytes the host moved after reading the file ([`Gguf::with_splits`]):
/// the header's `offset` (as [`TensorInfo::offset`]) names it, its first `lo_bytes`
/// bytes are now at `at` and, for a matrix placed in two parts, the rest at `hi_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Split {
    /// The tensor's data offset as its header says (absolute, as [`TensorInfo::offset`]).
    pub offset: u64,
    /// Where its bytes (its first part's) are now.
    pub at: u64,
    /// Bytes of that part: all of them, or the first part's (whole rows).
    pub lo_bytes: u64,
    /// Where the rest of its bytes are (none when `lo_bytes` is all of them).
    pub hi_at: u64,
}

/// Where a tensor is and what it holds.
#[derive(Clone, Copy, Debug)]
pub struct TensorInfo<'a> {
    /// Tensor name (raw bytes).
    pub name: &'a [u8],
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions, ggml order (`ne[0]` is the row length); unused ones are 1.
    pub ne: [u64; 4],
    /// Number of dimensions declared.
    pub n_dims: u32,
    /// Absolute offset of the data in the file.
    pub offset: u64,
    /// The data bytes (the first part of a split matrix: [`TensorInfo::hi`]).
    pub data: &'a [u8],
    /// The rest of a matrix the host placed in two parts ([`Gguf::with_splits`]); empty
    /// for every other tensor.
    pub hi: &'a [u8],
    /// Whether the host rearranged this matrix's bytes in the rows16 layout
    /// ([`Gguf::with_rows16`]).
    pub rows16: bool,
}

impl TensorInfo<'_> {
    /// Total element count.
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// The name as text (lossy).
    pub fn name_str(&self) -> Name {
        name_from(self.name)
    }

    /// Number of rows (`ne[1] * ne[2] * ne[3]`).
    pub fn n_rows(&self) -> u64 {
        self.ne[1] * self.ne[2] * self.ne[3]
    }
}

impl<'a> Gguf<'a> {
    /// Parses and validates a whole GGUF file held in `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Gguf<'a>, GgufError> {
        let mut r = Reader::new(bytes);
        let magic = r.array4("magic")?;
        if &magic != b"GGUF" {
            return Err(GgufError::at(GgufErrorKind::BadMagic(magic), 0));
        }
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::at(GgufErrorKind::UnsupportedVersion(version), 4));
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata key count")?;
        // Each tensor info takes at least 8 (name len) + 4 + 4 + 8 bytes; each key at least
        // 8 + 4 + 1. Counts that cannot fit are rejected before looping over them.
        if n_tensors.saturating_mul(24) > bytes.len() as u64 {
            return Err(GgufError::at(GgufErrorKind::AbsurdCount { what: "tensor", count: n_tensors }, 8));
        }
        if n_tensors > MAX_TENSORS {
            return Err(GgufError::at(GgufErrorKind::AbsurdCount { what: "tensor (keel reads at most 6144)", count: n_tensors }, 8));
        }
        if n_kv.saturating_mul(13) > bytes.len() as u64 {
            return Err(GgufError::at(GgufErrorKind::AbsurdCount { what: "metadata key", count: n_kv }, 16));
        }
        if n_kv > MAX_KEYS as u64 {
            return Err(GgufError::at(GgufErrorKind::TooManyKeys { count: n_kv, max: MAX_KEYS }, 16));
        }

        let mut g = Gguf { bytes, version, keys: heapless::Vec::new(), n_tensors: n_tensors as usize, tensor_infos_at: 0, alignment: DEFAULT_ALIGNMENT, data_start: 0, rows16: &[], splits: &[] };
        for _ in 0..n_kv {
            let key_pos = r.pos();
            let key = r.string("metadata key")?;
            let tid_pos = r.pos();
            let tid = r.u32("value type")?;
            let vtype = ValueType::from_id(tid).ok_or_else(|| GgufError::at(GgufErrorKind::BadValueType(tid), tid_pos as u64).named(key))?;
            let value_at = r.pos();
            r.skip_value(vtype).map_err(|e| e.named(key))?;
            if g.find_key(key).is_some() {
                return Err(GgufError::at(GgufErrorKind::DuplicateKey, key_pos as u64).named(key));
            }
            let entry = KeyEntry { key_at: (key_pos + 8) as u32, key_len: key.len() as u32, value_at: value_at as u32, vtype };
            // Offsets are checked to fit in u32 below: the header of any real model is far smaller.
            if value_at > u32::MAX as usize {
                return Err(GgufError::at(GgufErrorKind::AbsurdCount { what: "metadata bytes", count: value_at as u64 }, value_at as u64));
            }
            let _ = g.keys.push(entry);
        }

        if let Some(v) = g.get("general.alignment") {
            let a = match v {
                Value::U32(a) => a as u64,
                other => match other.as_int() {
                    Some(a) if a >= 0 => a as u64,
                    _ => return Err(GgufError::at(GgufErrorKind::WrongType { expected: "u32", found: other.value_type().name() }, 0).named_str("general.alignment")),
                },
            };
            if a == 0 || !a.is_power_of_two() || a > 65536 {
                return Err(GgufError::at(GgufErrorKind::BadAlignment(a), 0).named_str("general.alignment"));
            }
            g.alignment = a;
        }

        g.tensor_infos_at = r.pos();
        // First pass: validate each tensor info, reject duplicate names (through a small
        // open-addressing table of info positions keyed by name hash, so hostile files
        // with many tensors stay linear), and check the data layout.
        let mut seen = [0u32; NAME_TABLE];
        let mut expected_offset = 0u64;
        for _ in 0..g.n_tensors {
            let at = r.pos();
            if at >= u32::MAX as usize {
                return Err(GgufError::at(GgufErrorKind::AbsurdCount { what: "header bytes", count: at as u64 }, at as u64));
            }
            let info = r.tensor_info()?;
            let mut slot = (fnv1a(info.name) as usize) & (NAME_TABLE - 1);
            loop {
                match seen[slot] {
                    0 => {
                        seen[slot] = at as u32 + 1;
                        break;
                    }
                    p => {
                        let other = Reader::at(bytes, p as usize - 1).string("tensor name")?;
                        if other == info.name {
                            return Err(GgufError::at(GgufErrorKind::DuplicateTensor, at as u64).named(info.name));
                        }
                        slot = (slot + 1) & (NAME_TABLE - 1);
                    }
                }
            }
            if info.rel_offset != expected_offset {
                return Err(GgufError::at(GgufErrorKind::BadTensorOffset { offset: info.rel_offset, expected: expected_offset }, at as u64).named(info.name));
            }
            let padded = pad(info.size, g.alignment).ok_or_else(|| GgufError::at(GgufErrorKind::SizeOverflow, at as u64).named(info.name))?;
            expected_offset = expected_offset.checked_add(padded).ok_or_else(|| GgufError::at(GgufErrorKind::SizeOverflow, at as u64).named(info.name))?;
        }
        g.data_start = pad(r.pos() as u64, g.alignment).ok_or_else(|| GgufError::at(GgufErrorKind::SizeOverflow, r.pos() as u64))?;
        // Second pass: all data inside the file.
        let file_len = bytes.len() as u64;
        let mut r = Reader::at(bytes, g.tensor_infos_at);
        for _ in 0..g.n_tensors {
            let at = r.pos();
            let info = r.tensor_info()?;
            let end = g.data_start.checked_add(info.rel_offset).and_then(|s| s.checked_add(info.size)).ok_or_else(|| GgufError::at(GgufErrorKind::SizeOverflow, at as u64).named(info.name))?;
            if end > file_len {
                return Err(GgufError::at(GgufErrorKind::TensorOutOfBounds { end, file_len }, at as u64).named(info.name));
            }
        }
        Ok(g)
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The whole file.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Data alignment in bytes.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Offset of the tensor data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// Offset of the first tensor info (the metadata entries end there).
    pub fn tensor_infos_at(&self) -> usize {
        self.tensor_infos_at
    }

    /// Number of metadata keys.
    pub fn n_keys(&self) -> usize {
        self.keys.len()
    }

    /// Number of tensors.
    pub fn n_tensors(&self) -> usize {
        self.n_tensors
    }

    fn find_key(&self, key: &[u8]) -> Option<&KeyEntry> {
        self.keys.iter().find(|e| &self.bytes[e.key_at as usize..(e.key_at + e.key_len) as usize] == key)
    }

    fn value_of(&self, e: &KeyEntry) -> Value<'a> {
        // The value was validated during parse; re-reading it cannot fail.
        let mut r = Reader::at(self.bytes, e.value_at as usize);
        r.value(e.vtype).unwrap_or(Value::Bool(false))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<Value<'a>> {
        self.find_key(key.as_bytes()).map(|e| self.value_of(e))
    }

    /// Key `i` (in file order) and its value.
    pub fn key_at(&self, i: usize) -> Option<(&'a [u8], Value<'a>)> {
        let e = self.keys.get(i)?;
        Some((&self.bytes[e.key_at as usize..(e.key_at + e.key_len) as usize], self.value_of(e)))
    }

    /// Byte offset of `key`'s value (for error messages).
    pub fn key_offset(&self, key: &str) -> u64 {
        self.find_key(key.as_bytes()).map(|e| e.value_at as u64).unwrap_or(0)
    }

    fn wrong_type(&self, key: &str, expected: &'static str, v: &Value<'_>) -> GgufError {
        GgufError::at(GgufErrorKind::WrongType { expected, found: v.value_type().name() }, self.key_offset(key)).named_str(key)
    }

    /// A required key.
    pub fn require(&self, key: &str) -> Result<Value<'a>, GgufError> {
        self.get(key).ok_or_else(|| GgufError::at(GgufErrorKind::MissingKey, 0).named_str(key))
    }

    /// An integer key that fits in `u32` (any integer type), if present.
    pub fn u32_opt(&self, key: &str) -> Result<Option<u32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_int() {
                Some(i) if (0..=u32::MAX as i128).contains(&i) => Ok(Some(i as u32)),
                Some(_) => Err(GgufError::at(GgufErrorKind::BadValue("integer out of range for u32"), self.key_offset(key)).named_str(key)),
                None => Err(self.wrong_type(key, "integer", &v)),
            },
        }
    }

    /// A required integer key that fits in `u32`.
    pub fn u32(&self, key: &str) -> Result<u32, GgufError> {
        self.u32_opt(key)?.ok_or_else(|| GgufError::at(GgufErrorKind::MissingKey, 0).named_str(key))
    }

    /// A float key (f32 or f64), if present.
    pub fn f32_opt(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_float().map(|f| Some(f as f32)).ok_or_else(|| self.wrong_type(key, "f32", &v)),
        }
    }

    /// A bool key, if present.
    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(v) => Err(self.wrong_type(key, "bool", &v)),
        }
    }

    /// A string key, if present.
    pub fn str_opt(&self, key: &str) -> Result<Option<&'a [u8]>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Str(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong_type(key, "string", &v)),
        }
    }

    /// An array key, if present.
    pub fn array_opt(&self, key: &str) -> Result<Option<Array<'a>>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.wrong_type(key, "array", &v)),
        }
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> TensorIter<'a> {
        TensorIter { r: Reader::at(self.bytes, self.tensor_infos_at), left: self.n_tensors, data_start: self.data_start, rows16: self.rows16, splits: self.splits }
    }

    /// Marks the tensors whose data starts at the file offsets `offsets` (sorted) as
    /// rearranged in the rows16 layout: the host packed them in place
    /// ([`crate::quant::rows16::pack_in_place`]) after reading the file, and their
    /// [`TensorInfo::rows16`] (so the model's [`crate::model::Layout`]) says so.
    pub fn with_rows16(mut self, offsets: &'a [u64]) -> Self {
        self.rows16 = offsets;
        self
    }

    /// Tells where the host moved tensors' bytes after reading the file (`splits`, sorted
    /// by the header's offset; the header is left as it is): their [`TensorInfo::data`]
    /// is read at the new place and, for a matrix placed in two parts (each a run of
    /// whole rows16 groups), [`TensorInfo::hi`] is the rest. The host does so for
    /// one-token products on several threads, so that each thread's shares of
    /// consecutive products lie one after another (BENCHMARKS.md, "One stream per
    /// thread").
    pub fn with_splits(mut self, splits: &'a [Split]) -> Self {
        self.splits = splits;
        self
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<TensorInfo<'a>> {
        self.tensors().find(|t| t.name == name.as_bytes())
    }
}

/// Iterator over the tensors of a validated file.
#[derive(Clone, Debug)]
pub struct TensorIter<'a> {
    r: Reader<'a>,
    left: usize,
    data_start: u64,
    rows16: &'a [u64],
    splits: &'a [Split],
}

impl<'a> Iterator for TensorIter<'a> {
    type Item = TensorInfo<'a>;

    fn next(&mut self) -> Option<TensorInfo<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Validated during parse; a failure here would be a bug, so stop iterating.
        let raw = self.r.tensor_info().ok()?;
        let bytes = self.r.bytes();
        let start = (self.data_start + raw.rel_offset) as usize;
        let size = raw.size as usize;
        let (data, hi) = match self.splits.binary_search_by_key(&(start as u64), |s| s.offset) {
            Ok(i) => {
                let sp = self.splits[i];
                let (at, lo, hi_at) = (sp.at as usize, (sp.lo_bytes as usize).min(size), sp.hi_at as usize);
                (bytes.get(at..at + lo)?, if lo < size { bytes.get(hi_at..hi_at + size - lo)? } else { &[][..] })
            }
            Err(_) => (bytes.get(start..start + size)?, &[][..]),
        };
        Some(TensorInfo { name: raw.name, ty: raw.ty, ne: raw.ne, n_dims: raw.n_dims, offset: start as u64, data, hi, rows16: self.rows16.binary_search(&(start as u64)).is_ok() })
    }
}

fn fnv1a(b: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &c in b {
        h = (h ^ c as u32).wrapping_mul(0x0100_0193);
    }
    h
}

fn pad(x: u64, align: u64) -> Option<u64> {
    Some(x.checked_add(align - 1)? / align * align)
}

#[cfg(test)]
pub(crate) mod tests;

//! Bounds-checked little-endian cursor over the file bytes.

use super::error::{GgufError, GgufErrorKind};
use super::value::{Array, Value, ValueType};
use crate::ggml_type::GgmlType;

#[derive(Clone, Debug)]
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// A tensor info record as stored (offset relative to the data section).
pub(super) struct RawTensorInfo<'a> {
    pub name: &'a [u8],
    pub n_dims: u32,
    pub ne: [u64; 4],
    pub ty: GgmlType,
    pub rel_offset: u64,
    pub size: u64,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    pub fn at(bytes: &'a [u8], pos: usize) -> Self {
        Reader { bytes, pos }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        let left = (self.bytes.len() - self.pos) as u64;
        if n > left {
            return Err(GgufError::at(GgufErrorKind::Truncated { what, need: n }, self.pos as u64));
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    pub fn array4(&mut self, what: &'static str) -> Result<[u8; 4], GgufError> {
        let b = self.take(4, what)?;
        Ok([b[0], b[1], b[2], b[3]])
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array4(what)?))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }

    /// A GGUF string: u64 length then bytes.
    pub fn string(&mut self, what: &'static str) -> Result<&'a [u8], GgufError> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > (self.bytes.len() - self.pos) as u64 {
            return Err(GgufError::at(GgufErrorKind::Truncated { what, need: len }, at as u64));
        }
        self.take(len, what)
    }

    /// Reads a value of type `t` (validating nested lengths).
    pub fn value(&mut self, t: ValueType) -> Result<Value<'a>, GgufError> {
        if let Some(sz) = t.fixed_size() {
            let b = self.take(sz as u64, "metadata value")?;
            return Ok(Value::decode_fixed(t, b));
        }
        match t {
            ValueType::Str => Ok(Value::Str(self.string("string value")?)),
            ValueType::Array => {
                let at = self.pos;
                let et_id = self.u32("array element type")?;
                let et = ValueType::from_id(et_id).ok_or_else(|| GgufError::at(GgufErrorKind::BadValueType(et_id), at as u64))?;
                if et == ValueType::Array {
                    return Err(GgufError::at(GgufErrorKind::NestedArray, at as u64));
                }
                let n_at = self.pos;
                let n = self.u64("array length")?;
                let left = (self.bytes.len() - self.pos) as u64;
                let min_each = et.fixed_size().unwrap_or(8) as u64;
                if n.checked_mul(min_each).map_or(true, |b| b > left) {
                    return Err(GgufError::at(GgufErrorKind::AbsurdCount { what: "array element", count: n }, n_at as u64));
                }
                let start = self.pos;
                match et.fixed_size() {
                    Some(sz) => {
                        self.take(n * sz as u64, "array data")?;
                    }
                    None => {
                        for _ in 0..n {
                            self.string("array string")?;
                        }
                    }
                }
                Ok(Value::Array(Array::new(et, n as usize, &self.bytes[start..self.pos], start as u64)))
            }
            _ => unreachable!("fixed-size types handled above"),
        }
    }

    pub fn skip_value(&mut self, t: ValueType) -> Result<(), GgufError> {
        self.value(t).map(|_| ())
    }

    pub fn tensor_info(&mut self) -> Result<RawTensorInfo<'a>, GgufError> {
        let at = self.pos as u64;
        let name = self.string("tensor name")?;
        let n_dims = self.u32("tensor dimension count").map_err(|e| e.named(name))?;
        if n_dims > 4 {
            return Err(GgufError::at(GgufErrorKind::TooManyDims(n_dims), at).named(name));
        }
        let mut ne = [1u64; 4];
        let mut n: u64 = 1;
        for d in ne.iter_mut().take(n_dims as usize) {
            *d = self.u64("tensor dimension").map_err(|e| e.named(name))?;
            // ggml keeps dimensions as int64.
            if *d > i64::MAX as u64 {
                return Err(GgufError::at(GgufErrorKind::SizeOverflow, at).named(name));
            }
            n = n.checked_mul(*d).filter(|&n| n <= i64::MAX as u64).ok_or_else(|| GgufError::at(GgufErrorKind::SizeOverflow, at).named(name))?;
        }
        let ty_id = self.u32("tensor type").map_err(|e| e.named(name))?;
        let ty = GgmlType::from_id(ty_id).ok_or_else(|| GgufError::at(GgufErrorKind::UnknownTensorType(ty_id), at).named(name))?;
        let rel_offset = self.u64("tensor offset").map_err(|e| e.named(name))?;
        let row = ty.row_bytes(ne[0]).ok_or_else(|| {
            if ne[0] % ty.block_size() as u64 != 0 {
                GgufError::at(GgufErrorKind::PartialBlock { ne0: ne[0], block: ty.block_size() }, at).named(name)
            } else {
                GgufError::at(GgufErrorKind::SizeOverflow, at).named(name)
            }
        })?;
        let size = row
            .checked_mul(ne[1])
            .and_then(|s| s.checked_mul(ne[2]))
            .and_then(|s| s.checked_mul(ne[3]))
            .ok_or_else(|| GgufError::at(GgufErrorKind::SizeOverflow, at).named(name))?;
        Ok(RawTensorInfo { name, n_dims, ne, ty, rel_offset, size })
    }
}

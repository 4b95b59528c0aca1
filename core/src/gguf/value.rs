//! Metadata values: zero-copy views of what a key holds.

use super::error::{GgufError, GgufErrorKind};

/// A GGUF metadata value type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    Str,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    /// The type with GGUF id `id`.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => Str,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes of one value of a fixed-size type (`None` for strings and arrays).
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            Str | Array => None,
        }
    }

    /// The GGUF spelling of the type, for messages.
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            Str => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A metadata value, borrowing from the file.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    /// Raw string bytes (GGUF says UTF-8; vocabularies may hold arbitrary bytes).
    Str(&'a [u8]),
    Array(Array<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> Value<'a> {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::Str(_) => ValueType::Str,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value as `i128` (`None` for non-integers).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// A float value (f32 or f64) as `f64`.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// Decodes a fixed-size value of type `t` from exactly its bytes.
    pub(crate) fn decode_fixed(t: ValueType, b: &'a [u8]) -> Value<'a> {
        let a2 = |b: &[u8]| [b[0], b[1]];
        let a4 = |b: &[u8]| [b[0], b[1], b[2], b[3]];
        let a8 = |b: &[u8]| [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
        match t {
            ValueType::U8 => Value::U8(b[0]),
            ValueType::I8 => Value::I8(b[0] as i8),
            ValueType::Bool => Value::Bool(b[0] != 0),
            ValueType::U16 => Value::U16(u16::from_le_bytes(a2(b))),
            ValueType::I16 => Value::I16(i16::from_le_bytes(a2(b))),
            ValueType::U32 => Value::U32(u32::from_le_bytes(a4(b))),
            ValueType::I32 => Value::I32(i32::from_le_bytes(a4(b))),
            ValueType::F32 => Value::F32(f32::from_le_bytes(a4(b))),
            ValueType::U64 => Value::U64(u64::from_le_bytes(a8(b))),
            ValueType::I64 => Value::I64(i64::from_le_bytes(a8(b))),
            ValueType::F64 => Value::F64(f64::from_le_bytes(a8(b))),
            ValueType::Str | ValueType::Array => unreachable!("not fixed-size"),
        }
    }
}

/// An array value: `len` elements of `elem`, stored back to back in `data`
/// (already validated to lie inside the file).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Array<'a> {
    /// Element type (never `Array`).
    pub elem: ValueType,
    len: usize,
    data: &'a [u8],
    /// File offset of `data`, for error messages.
    offset: u64,
}

impl<'a> Array<'a> {
    pub(crate) fn new(elem: ValueType, len: usize, data: &'a [u8], offset: u64) -> Self {
        Array { elem, len, data, offset }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element `i` of a fixed-size array (`None` if out of range or a string array).
    pub fn get(&self, i: usize) -> Option<Value<'a>> {
        let sz = self.elem.fixed_size()?;
        if i >= self.len {
            return None;
        }
        Some(Value::decode_fixed(self.elem, &self.data[i * sz..(i + 1) * sz]))
    }

    /// Element `i` as an integer, if the array holds integers.
    pub fn int(&self, i: usize) -> Option<i128> {
        self.get(i)?.as_int()
    }

    /// Element `i` as a float (f32/f64 arrays), if the array holds floats.
    pub fn float(&self, i: usize) -> Option<f64> {
        self.get(i)?.as_float()
    }

    /// The strings of a string array, in order (empty for other arrays).
    pub fn strings(&self) -> StrIter<'a> {
        StrIter { data: if self.elem == ValueType::Str { self.data } else { &[] }, left: if self.elem == ValueType::Str { self.len } else { 0 } }
    }

    /// Checks that the array holds `expected` elements, else an error for `key`.
    pub fn expect_type(&self, key: &str, expected: ValueType) -> Result<(), GgufError> {
        if self.elem == expected || (self.elem.fixed_size().is_some() && expected.fixed_size().is_some() && is_int(self.elem) && is_int(expected)) {
            Ok(())
        } else {
            Err(GgufError::at(GgufErrorKind::WrongType { expected: expected.name(), found: self.elem.name() }, self.offset).named_str(key))
        }
    }
}

fn is_int(t: ValueType) -> bool {
    matches!(t, ValueType::U8 | ValueType::I8 | ValueType::U16 | ValueType::I16 | ValueType::U32 | ValueType::I32 | ValueType::U64 | ValueType::I64)
}

/// Iterator over a validated string array.
#[derive(Clone, Debug)]
pub struct StrIter<'a> {
    data: &'a [u8],
    left: usize,
}

impl<'a> Iterator for StrIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        // The array was validated at parse time: every length prefix and string lies
        // inside `data`. Stay defensive anyway and stop rather than panic.
        let len_bytes = self.data.get(..8)?;
        let len = u64::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3], len_bytes[4], len_bytes[5], len_bytes[6], len_bytes[7]]) as usize;
        let s = self.data.get(8..8usize.checked_add(len)?)?;
        self.data = &self.data[8 + len..];
        self.left -= 1;
        Some(s)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

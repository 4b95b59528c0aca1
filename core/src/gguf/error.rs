//! What can be wrong with a GGUF file, and where.

use core::fmt;

/// A name taken from the file (a key or tensor name), truncated to fit.
pub type Name = heapless::String<96>;

/// Copies `bytes` (lossily, as UTF-8) into a [`Name`], truncating with `...` if needed.
pub fn name_from(bytes: &[u8]) -> Name {
    let mut s = Name::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars().chain(if chunk.invalid().is_empty() { None } else { Some('\u{fffd}') }) {
            if s.len() + c.len_utf8() > s.capacity() - 3 {
                let _ = s.push_str("...");
                return s;
            }
            let _ = s.push(c);
        }
    }
    s
}

/// Which kind of problem a [`GgufError`] reports.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
#[allow(missing_docs)] // fields are described by their variant's doc
pub enum GgufErrorKind {
    /// The file ends before `what` could be read (`need` bytes at the error offset).
    Truncated { what: &'static str, need: u64 },
    /// The first four bytes are not `GGUF`.
    BadMagic([u8; 4]),
    /// A GGUF version keel cannot read (it reads 2 and 3).
    UnsupportedVersion(u32),
    /// A count (of keys, tensors, array elements, string bytes) that cannot fit in the file.
    AbsurdCount { what: &'static str, count: u64 },
    /// More metadata keys than keel indexes.
    TooManyKeys { count: u64, max: usize },
    /// A metadata value type id that GGUF does not define.
    BadValueType(u32),
    /// An array whose elements are arrays (GGUF readers do not accept these).
    NestedArray,
    /// The same key twice.
    DuplicateKey,
    /// The same tensor name twice.
    DuplicateTensor,
    /// A tensor with more than 4 dimensions.
    TooManyDims(u32),
    /// A tensor type id keel does not know.
    UnknownTensorType(u32),
    /// A tensor dimension product or byte size that overflows.
    SizeOverflow,
    /// The first dimension is not a whole number of blocks of the tensor's type.
    PartialBlock { ne0: u64, block: usize },
    /// `general.alignment` is not a power of two between 1 and 2^16.
    BadAlignment(u64),
    /// A tensor's data offset is not where the GGUF layout puts it (in order, padded
    /// to the alignment).
    BadTensorOffset { offset: u64, expected: u64 },
    /// A tensor's data runs past the end of the file.
    TensorOutOfBounds { end: u64, file_len: u64 },
    /// A metadata key holds a different type than the reader needs.
    WrongType { expected: &'static str, found: &'static str },
    /// A required metadata key is absent.
    MissingKey,
    /// A required tensor is absent.
    MissingTensor,
    /// A tensor has a different shape than the model needs.
    BadShape,
    /// A metadata value is out of the range the model accepts.
    BadValue(&'static str),
    /// The file declares something keel does not implement (what, in words, and what to
    /// do when there is something); running it anyway would give wrong answers.
    Unsupported(&'static str),
}

/// An error while reading a GGUF file: what, at which byte offset, and for which
/// key or tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufError {
    /// What is wrong.
    pub kind: GgufErrorKind,
    /// Byte offset in the file where the problem was found (0 if not tied to a place).
    pub offset: u64,
    /// The key or tensor concerned, if any.
    pub name: Option<Name>,
}

impl GgufError {
    /// An error at `offset` with no name.
    pub fn at(kind: GgufErrorKind, offset: u64) -> Self {
        GgufError { kind, offset, name: None }
    }

    /// The same error, naming the key or tensor (given as raw bytes from the file).
    pub fn named(mut self, name: &[u8]) -> Self {
        self.name = Some(name_from(name));
        self
    }

    /// The same error, naming `name`.
    pub fn named_str(self, name: &str) -> Self {
        self.named(name.as_bytes())
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgufErrorKind::*;
        match &self.kind {
            Truncated { what, need } => write!(f, "file is truncated: {what} needs {need} bytes at offset {}", self.offset)?,
            BadMagic(m) => write!(f, "not a GGUF file: magic is {m:02x?}, expected \"GGUF\"")?,
            UnsupportedVersion(v) => write!(f, "GGUF version {v} is not supported (keel reads versions 2 and 3)")?,
            AbsurdCount { what, count } => write!(f, "{what} count {count} at offset {} cannot fit in the file", self.offset)?,
            TooManyKeys { count, max } => write!(f, "{count} metadata keys; keel indexes at most {max}")?,
            BadValueType(t) => write!(f, "unknown metadata value type {t} at offset {}", self.offset)?,
            NestedArray => write!(f, "array of arrays at offset {} is not supported", self.offset)?,
            DuplicateKey => write!(f, "duplicate metadata key at offset {}", self.offset)?,
            DuplicateTensor => write!(f, "duplicate tensor name at offset {}", self.offset)?,
            TooManyDims(n) => write!(f, "tensor has {n} dimensions (at most 4) at offset {}", self.offset)?,
            UnknownTensorType(t) => write!(f, "unknown tensor type id {t} at offset {}", self.offset)?,
            SizeOverflow => write!(f, "tensor size overflows at offset {}", self.offset)?,
            PartialBlock { ne0, block } => write!(f, "row length {ne0} is not a multiple of the type's block size {block}")?,
            BadAlignment(a) => write!(f, "general.alignment = {a} is not a power of two in 1..=65536")?,
            BadTensorOffset { offset, expected } => write!(f, "tensor data offset {offset} is not where the layout puts it ({expected}): misaligned or overlapping data")?,
            TensorOutOfBounds { end, file_len } => write!(f, "tensor data ends at byte {end}, past the end of the file ({file_len} bytes)")?,
            WrongType { expected, found } => write!(f, "metadata value has type {found}, expected {expected}")?,
            MissingKey => write!(f, "required metadata key is missing")?,
            MissingTensor => write!(f, "required tensor is missing")?,
            BadShape => write!(f, "tensor has the wrong shape")?,
            BadValue(why) => write!(f, "bad metadata value: {why}")?,
            Unsupported(what) => write!(f, "not implemented by keel: {what}")?,
        }
        if let Some(n) = &self.name {
            write!(f, " [{n}]")?;
        }
        Ok(())
    }
}

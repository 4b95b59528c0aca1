//! Parser tests over small files built in a fixed buffer.

use super::*;

/// Builds GGUF bytes into a fixed buffer (no allocation in the core's tests either).
pub(crate) struct Builder {
    pub buf: [u8; 4096],
    pub len: usize,
}

impl Builder {
    pub fn new(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut b = Builder { buf: [0; 4096], len: 0 };
        b.raw(b"GGUF");
        b.u32(version);
        b.u64(n_tensors);
        b.u64(n_kv);
        b
    }
    pub fn raw(&mut self, x: &[u8]) -> &mut Self {
        self.buf[self.len..self.len + x.len()].copy_from_slice(x);
        self.len += x.len();
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).raw(s.as_bytes())
    }
    pub fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.str(k).u32(4).u32(v)
    }
    pub fn kv_str(&mut self, k: &str, v: &str) -> &mut Self {
        self.str(k).u32(8).str(v)
    }
    pub fn kv_f32(&mut self, k: &str, v: f32) -> &mut Self {
        self.str(k).u32(6).raw(&v.to_le_bytes())
    }
    pub fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, off: u64) -> &mut Self {
        self.str(name).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ty).u64(off)
    }
    pub fn pad_to(&mut self, align: usize) -> &mut Self {
        while self.len % align != 0 {
            self.raw(&[0]);
        }
        self
    }
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A valid file: 3 keys (one string array), 2 f32 tensors.
pub(crate) fn sample() -> Builder {
    let mut b = Builder::new(3, 2, 3);
    b.kv_str("general.architecture", "llama");
    b.kv_f32("llama.rope.freq_base", 10000.0);
    b.str("tokenizer.ggml.tokens").u32(9).u32(8).u64(3).str("a").str("bc").str("");
    b.tensor("w", &[4, 2], 0, 0);
    b.tensor("v", &[8], 0, 32);
    b.pad_to(32);
    for i in 0..8u32 {
        b.raw(&(i as f32).to_le_bytes());
    }
    for i in 0..8u32 {
        b.raw(&(10.0 + i as f32).to_le_bytes());
    }
    b
}

#[test]
fn parses_a_valid_file() {
    let b = sample();
    let g = Gguf::parse(b.bytes()).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.n_keys(), 3);
    assert_eq!(g.str_opt("general.architecture").unwrap(), Some(&b"llama"[..]));
    assert_eq!(g.f32_opt("llama.rope.freq_base").unwrap(), Some(10000.0));
    let toks = g.array_opt("tokenizer.ggml.tokens").unwrap().unwrap();
    let mut it = toks.strings();
    assert_eq!(it.next(), Some(&b"a"[..]));
    assert_eq!(it.next(), Some(&b"bc"[..]));
    assert_eq!(it.next(), Some(&b""[..]));
    assert_eq!(it.next(), None);
    let w = g.tensor("w").unwrap();
    assert_eq!(w.ne, [4, 2, 1, 1]);
    assert_eq!(w.data.len(), 32);
    assert_eq!(&w.data[4..8], &1.0f32.to_le_bytes());
    let v = g.tensor("v").unwrap();
    assert_eq!(&v.data[0..4], &10.0f32.to_le_bytes());
    assert!(g.tensor("nope").is_none());
}

#[test]
fn every_truncation_is_an_error() {
    let b = sample();
    for cut in 0..b.len {
        let e = Gguf::parse(&b.bytes()[..cut]);
        assert!(e.is_err(), "truncated at {cut} parsed");
    }
}

#[test]
fn wrong_key_types_are_named() {
    let b = sample();
    let g = Gguf::parse(b.bytes()).unwrap();
    let e = g.u32("general.architecture").unwrap_err();
    assert!(matches!(e.kind, GgufErrorKind::WrongType { expected: "integer", found: "string" }));
    assert_eq!(e.name.as_deref(), Some("general.architecture"));
    let e = g.u32("llama.block_count").unwrap_err();
    assert_eq!(e.kind, GgufErrorKind::MissingKey);
}

#[test]
fn rejects_bad_headers() {
    let mut b = sample();
    b.buf[0] = b'X';
    assert!(matches!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::BadMagic(_)));
    let mut b = sample();
    b.buf[4] = 1;
    assert_eq!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::UnsupportedVersion(1));
    let mut b = sample();
    b.buf[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::AbsurdCount { .. }));
    let mut b = sample();
    b.buf[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::AbsurdCount { .. }));
}

#[test]
fn rejects_bad_tensors() {
    // Unknown type id.
    let mut b = Builder::new(3, 1, 0);
    b.tensor("t", &[4], 4, 0).pad_to(32).raw(&[0; 16]);
    assert_eq!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::UnknownTensorType(4));
    // Partial block.
    let mut b = Builder::new(3, 1, 0);
    b.tensor("t", &[33], 2, 0).pad_to(32).raw(&[0; 64]);
    assert!(matches!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::PartialBlock { .. }));
    // Dimension product overflow.
    let mut b = Builder::new(3, 1, 0);
    b.tensor("t", &[1 << 40, 1 << 40], 0, 0).pad_to(32);
    assert_eq!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::SizeOverflow);
    // Past the end.
    let mut b = Builder::new(3, 1, 0);
    b.tensor("t", &[64], 0, 0).pad_to(32).raw(&[0; 16]);
    let e = Gguf::parse(b.bytes()).unwrap_err();
    assert!(matches!(e.kind, GgufErrorKind::TensorOutOfBounds { .. }));
    assert_eq!(e.name.as_deref(), Some("t"));
    // Misaligned offset.
    let mut b = Builder::new(3, 2, 0);
    b.tensor("a", &[4], 0, 0).tensor("b", &[4], 0, 16).pad_to(32).raw(&[0; 64]);
    assert!(matches!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::BadTensorOffset { .. }));
    // Duplicate name.
    let mut b = Builder::new(3, 2, 0);
    b.tensor("a", &[4], 0, 0).tensor("a", &[4], 0, 32).pad_to(32).raw(&[0; 64]);
    assert_eq!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::DuplicateTensor);
    // Too many dims.
    let mut b = Builder::new(3, 1, 0);
    b.tensor("a", &[1, 1, 1, 1, 1], 0, 0).pad_to(32).raw(&[0; 64]);
    assert_eq!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::TooManyDims(5));
}

#[test]
fn alignment_key_is_checked_and_used() {
    let mut b = Builder::new(3, 1, 1);
    b.kv_u32("general.alignment", 64).tensor("t", &[4], 0, 0).pad_to(64).raw(&[0; 16]);
    let g = Gguf::parse(b.bytes()).unwrap();
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_start() % 64, 0);
    let mut b = Builder::new(3, 0, 1);
    b.kv_u32("general.alignment", 48);
    assert_eq!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::BadAlignment(48));
}

#[test]
fn rejects_bad_values() {
    let mut b = Builder::new(3, 0, 1);
    b.str("k").u32(13).u32(0);
    assert_eq!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::BadValueType(13));
    let mut b = Builder::new(3, 0, 1);
    b.str("k").u32(9).u32(9).u64(1);
    assert_eq!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::NestedArray);
    let mut b = Builder::new(3, 0, 1);
    b.str("k").u32(9).u32(4).u64(1 << 60);
    assert!(matches!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::AbsurdCount { .. }));
    let mut b = Builder::new(3, 0, 2);
    b.kv_u32("k", 1).kv_u32("k", 2);
    assert_eq!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::DuplicateKey);
    let mut b = Builder::new(3, 0, 1);
    b.str("k").u32(8).u64(1 << 50);
    assert!(matches!(Gguf::parse(b.bytes()).unwrap_err().kind, GgufErrorKind::Truncated { .. }));
}

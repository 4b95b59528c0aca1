//! A streaming GGUF v3 writer: the header first, then tensor data as it is produced.
//!
//! Owns the file format on the way out (keel-core only reads). Metadata values are
//! re-encoded from the [`Value`]s keel's parser returns, which is lossless (integers and
//! floats keep their bits, strings and arrays their bytes and element types), so
//! copying a file's keys through [`encode_kv`] reproduces its metadata bytes exactly.
//!
//! Failure model: the file is written to a [`TempFile`] (a fresh, randomly named file in
//! the output directory), synced and renamed over `NAME` only by [`GgufWriter::finish`],
//! after every declared tensor got exactly its declared bytes. Any error, a fatal signal,
//! or dropping the writer unfinished removes the temporary file, so a failed run never
//! leaves a half-written model.

use anyhow::{bail, Context, Result};
use keel_core::ggml_type::GgmlType;
use keel_core::gguf::{Value, ValueType};
use crate::fsutil::TempFile;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// One tensor as the new file declares it.
#[derive(Clone, Debug)]
pub struct TensorDecl {
    /// Name bytes.
    pub name: Vec<u8>,
    /// Dimensions, ggml order (`ne[0]` is the row length); unused ones are 1.
    pub ne: [u64; 4],
    /// Number of dimensions written (as in the source file).
    pub n_dims: u32,
    /// Element type of the data that will be written.
    pub ty: GgmlType,
}

impl TensorDecl {
    /// Bytes of this tensor's data, or `None` if a row is not whole blocks.
    pub fn data_bytes(&self) -> Option<u64> {
        let rows = self.ne[1].checked_mul(self.ne[2])?.checked_mul(self.ne[3])?;
        self.ty.row_bytes(self.ne[0])?.checked_mul(rows)
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s);
}

fn type_id(t: ValueType) -> u32 {
    use ValueType::*;
    match t {
        U8 => 0,
        I8 => 1,
        U16 => 2,
        I16 => 3,
        U32 => 4,
        I32 => 5,
        F32 => 6,
        Bool => 7,
        Str => 8,
        Array => 9,
        U64 => 10,
        I64 => 11,
        F64 => 12,
    }
}

/// Appends the bytes of a value without its type id.
fn put_value(out: &mut Vec<u8>, v: &Value<'_>) {
    match *v {
        Value::U8(x) => out.push(x),
        Value::I8(x) => out.push(x as u8),
        Value::Bool(x) => out.push(x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
        Value::Str(s) => put_str(out, s),
        Value::Array(a) => {
            put_u32(out, type_id(a.elem));
            put_u64(out, a.len() as u64);
            if a.elem == ValueType::Str {
                for s in a.strings() {
                    put_str(out, s);
                }
            } else {
                for i in 0..a.len() {
                    // A validated array of a fixed-size type yields every element.
                    if let Some(e) = a.get(i) {
                        put_value(out, &e);
                    }
                }
            }
        }
    }
}

/// Appends one metadata entry: key string, value type id, value.
pub fn encode_kv(out: &mut Vec<u8>, key: &[u8], v: &Value<'_>) {
    put_str(out, key);
    put_u32(out, type_id(v.value_type()));
    put_value(out, v);
}

/// Appends one tensor info: name, dimension count, the first `n_dims` of `ne`, type id,
/// and the data offset (relative to the data section).
pub fn encode_tensor_info(out: &mut Vec<u8>, name: &[u8], n_dims: u32, ne: &[u64; 4], ty: GgmlType, offset: u64) {
    put_str(out, name);
    put_u32(out, n_dims);
    for &d in &ne[..n_dims as usize] {
        put_u64(out, d);
    }
    put_u32(out, ty.id());
    put_u64(out, offset);
}

fn pad_to(x: u64, align: u64) -> u64 {
    x.div_ceil(align) * align
}

/// A GGUF file being written: header done, tensor data streamed in declaration order.
pub struct GgufWriter {
    out: BufWriter<TempFile>,
    tmp: PathBuf,
    path: PathBuf,
    alignment: u64,
    /// Declared data bytes per tensor, in order.
    sizes: Vec<u64>,
    /// Index of the tensor being written and bytes written to it so far.
    cur: usize,
    cur_bytes: u64,
}

impl GgufWriter {
    /// Creates the temporary file next to `path` and writes the header: `n_kv` metadata
    /// entries already encoded in `kv_bytes` (see [`encode_kv`]), then the tensor infos
    /// with offsets laid out at `alignment`, then padding up to the data section.
    pub fn create(path: &Path, kv_bytes: &[u8], n_kv: u64, tensors: &[TensorDecl], alignment: u64) -> Result<Self> {
        if alignment == 0 || !alignment.is_power_of_two() {
            bail!("alignment {alignment} is not a power of two");
        }
        let mut header = Vec::with_capacity(kv_bytes.len() + 64 * tensors.len() + 24);
        header.extend_from_slice(b"GGUF");
        put_u32(&mut header, 3);
        put_u64(&mut header, tensors.len() as u64);
        put_u64(&mut header, n_kv);
        header.extend_from_slice(kv_bytes);
        let mut sizes = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for t in tensors {
            let size = t.data_bytes().with_context(|| {
                format!("tensor {}: {} elements per row do not make whole {} blocks", String::from_utf8_lossy(&t.name), t.ne[0], t.ty)
            })?;
            encode_tensor_info(&mut header, &t.name, t.n_dims, &t.ne, t.ty, offset);
            sizes.push(size);
            offset = pad_to(offset + size, alignment);
        }
        let data_start = pad_to(header.len() as u64, alignment);
        header.resize(data_start as usize, 0);

        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let file = TempFile::create(path).with_context(|| format!("cannot create the output file {} in {}", path.display(), dir.display()))?;
        let tmp = file.tmp_path().to_path_buf();
        let mut w = GgufWriter { out: BufWriter::with_capacity(1 << 20, file), tmp, path: path.to_path_buf(), alignment, sizes, cur: 0, cur_bytes: 0 };
        w.write_raw(&header)?;
        Ok(w)
    }

    fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).with_context(|| format!("writing {}", self.tmp.display()))
    }

    /// Appends data bytes of the current tensor.
    pub fn write_data(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(&size) = self.sizes.get(self.cur) else { bail!("more tensor data than the header declares") };
        if self.cur_bytes + bytes.len() as u64 > size {
            bail!("tensor {} gets more than its {size} declared bytes", self.cur);
        }
        self.cur_bytes += bytes.len() as u64;
        self.write_raw(bytes)
    }

    /// Ends the current tensor (which must have all its bytes) and pads to the alignment.
    pub fn end_tensor(&mut self) -> Result<()> {
        let Some(&size) = self.sizes.get(self.cur) else { bail!("more tensors than the header declares") };
        if self.cur_bytes != size {
            bail!("tensor {} got {} of its {size} declared bytes", self.cur, self.cur_bytes);
        }
        let pad = pad_to(size, self.alignment) - size;
        self.write_raw(&vec![0u8; pad as usize])?;
        self.cur += 1;
        self.cur_bytes = 0;
        Ok(())
    }

    /// Checks that every tensor was written, syncs, and renames the file into place.
    pub fn finish(self) -> Result<()> {
        if self.cur != self.sizes.len() {
            bail!("only {} of {} tensors were written", self.cur, self.sizes.len());
        }
        let (tmp, path) = (self.tmp, self.path);
        let file = self.out.into_inner().map_err(|e| e.into_error()).with_context(|| format!("writing {}", tmp.display()))?;
        file.commit().with_context(|| format!("syncing {} and renaming it to {}", tmp.display(), path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::gguf::Gguf;

    fn decl(name: &str, ne: [u64; 4], n_dims: u32, ty: GgmlType) -> TensorDecl {
        TensorDecl { name: name.as_bytes().to_vec(), ne, n_dims, ty }
    }

    fn tmpdir(tag: &str) -> PathBuf {
        crate::fsutil::test_dir(&format!("gguf-write-{tag}"))
    }

    #[test]
    fn round_trips_through_keels_parser() {
        let d = tmpdir("rt");
        let path = d.join("m.gguf");
        let mut kv = Vec::new();
        encode_kv(&mut kv, b"general.architecture", &Value::Str(b"llama"));
        encode_kv(&mut kv, b"general.alignment", &Value::U32(64));
        encode_kv(&mut kv, b"x.f", &Value::F32(-1.5));
        let ts = [decl("a", [32, 2, 1, 1], 2, GgmlType::Q8_0), decl("b", [3, 1, 1, 1], 1, GgmlType::F32)];
        let mut w = GgufWriter::create(&path, &kv, 3, &ts, 64).unwrap();
        w.write_data(&[7u8; 34]).unwrap();
        w.write_data(&[8u8; 34]).unwrap();
        w.end_tensor().unwrap();
        w.write_data(&[1u8; 12]).unwrap();
        w.end_tensor().unwrap();
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let g = Gguf::parse(&bytes).unwrap();
        assert_eq!(g.alignment(), 64);
        assert_eq!(g.get("x.f"), Some(Value::F32(-1.5)));
        let t: Vec<_> = g.tensors().collect();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].ty, GgmlType::Q8_0);
        assert_eq!(&t[0].data[..34], &[7u8; 34]);
        assert_eq!(t[1].data, &[1u8; 12]);
        assert_eq!(t[1].offset % 64, 0);
        // Re-encoding every key of the written file gives back its metadata bytes.
        let mut again = Vec::new();
        for i in 0..g.n_keys() {
            let (k, v) = g.key_at(i).unwrap();
            encode_kv(&mut again, k, &v);
        }
        assert_eq!(&bytes[24..24 + again.len()], &again[..]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn unfinished_or_short_writes_leave_no_file() {
        let d = tmpdir("fail");
        let path = d.join("m.gguf");
        let ts = [decl("a", [32, 1, 1, 1], 2, GgmlType::Q8_0)];
        let mut w = GgufWriter::create(&path, &[], 0, &ts, 32).unwrap();
        w.write_data(&[0u8; 10]).unwrap();
        assert!(w.end_tensor().is_err());
        assert!(w.write_data(&[0u8; 30]).is_err(), "overlong data is refused");
        drop(w);
        let w = GgufWriter::create(&path, &[], 0, &ts, 32).unwrap();
        assert!(w.finish().is_err(), "a missing tensor is an error");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "no output and no temporary file remain");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

//! `keel quantize IN OUT TYPE [--allow-requantize] [-t THREADS] [--json]`: writes a copy of
//! a model with its tensors converted to one of llama.cpp's mixes.
//!
//! Which tensor gets which type is `quant_mix`'s job (llama.cpp's rules); this module
//! checks the whole job up front (every conversion has a kernel, re-quantizing was
//! allowed), then streams: per tensor, either its bytes are copied (same type) or each
//! row is dequantized to f32 with the reference kernels and quantized with llama.cpp's
//! reference rounding (`quantize_row_ref`). Rows are split across threads; each row's
//! bytes depend only on that row, so the file is the same for any `-t`.
//!
//! Metadata is copied key by key in the input's order and types; only
//! `general.file_type` (the mix's llama.cpp ftype, u32) and
//! `general.quantization_version` (2) change, and are appended if absent. Tensors keep
//! the input's order. Nothing is written to OUT until the whole file is done
//! (`gguf_write`).

use super::common::mib;
use super::load::open;
use crate::gguf_write::{encode_kv, GgufWriter, TensorDecl};
use serde::Serialize;
use crate::progress::Progress;
use crate::quant_mix::{choose_types, Choice, Mix, ModelFacts, TensorShape, ALL_MIXES};
use anyhow::{bail, Context, Result};
use keel_core::ggml_type::GgmlType;
use keel_core::gguf::{Gguf, TensorInfo, Value};
use keel_core::quant::{quantize_row_ref, Kernels};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// Output bytes converted per slab (bounds memory whatever the tensor size).
const SLAB_BYTES: u64 = 16 << 20;
/// `general.quantization_version` that llama.cpp writes (`GGML_QNT_VERSION`).
const QNT_VERSION: u32 = 2;

fn can_quantize(ty: GgmlType) -> bool {
    quantize_row_ref(ty, &vec![0.0; ty.block_size()], &mut vec![0u8; ty.type_size()]).is_ok()
}

fn can_dequantize(ty: GgmlType) -> bool {
    Kernels::reference().dequantize_row(ty, &vec![0u8; ty.type_size()], &mut vec![0.0; ty.block_size()]).is_ok()
}

/// The mixes whose main type keel can quantize to today.
pub fn supported_mixes() -> Vec<Mix> {
    ALL_MIXES.into_iter().filter(|m| can_quantize(m.default_type())).collect()
}

fn names(ms: &[Mix]) -> String {
    ms.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
}

fn parse_mix(s: &str) -> Result<Mix> {
    let supported = supported_mixes();
    let later: Vec<Mix> = ALL_MIXES.into_iter().filter(|m| !supported.contains(m)).collect();
    let later = if later.is_empty() { String::new() } else { format!(" (not yet: {})", names(&later)) };
    match Mix::parse(s) {
        Some(m) if supported.contains(&m) => Ok(m),
        Some(m) => bail!("TYPE {}: keel has no {} quantizer yet; supported: {}", m.name(), m.default_type(), names(&supported)),
        None => bail!("unknown TYPE '{s}'; supported: {}{later}", names(&supported)),
    }
}

/// What happens to one tensor.
struct Job<'a> {
    src: TensorInfo<'a>,
    name: String,
    choice: Choice,
}

impl Job<'_> {
    fn converts(&self) -> bool {
        self.src.ty != self.choice.target
    }
}

/// Refuses the whole job before anything is written: split files, kernels keel lacks,
/// re-quantizing without `--allow-requantize`.
fn check(input: &Path, g: &Gguf<'_>, jobs: &[Job<'_>], allow_requantize: bool) -> Result<()> {
    if let Some(n) = g.u32_opt("split.count")?.filter(|&n| n > 1) {
        bail!("{}: is one of {n} split files; merge them first (llama-gguf-split --merge)", input.display());
    }
    for j in jobs.iter().filter(|j| j.converts()) {
        let (from, to) = (j.src.ty, j.choice.target);
        if !can_dequantize(from) {
            bail!("{}: tensor {} is {from}, which keel cannot dequantize yet", input.display(), j.name);
        }
        if !can_quantize(to) {
            bail!("tensor {} needs type {to} in this mix, and keel has no {to} quantizer yet", j.name);
        }
    }
    let requant: Vec<&Job<'_>> = jobs.iter().filter(|j| j.converts() && is_quantized(j.src.ty)).collect();
    if let (Some(first), false) = (requant.first(), allow_requantize) {
        bail!(
            "{}: {} tensors are already quantized (e.g. {} is {}); quantizing them again adds a second rounding error. \
             Pass --allow-requantize to do it anyway, or start from an F32/F16/BF16 model",
            input.display(),
            requant.len(),
            first.name,
            first.src.ty
        );
    }
    Ok(())
}

fn is_quantized(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::F64 | GgmlType::I8 | GgmlType::I16 | GgmlType::I32 | GgmlType::I64)
}

/// The input's metadata with the file type and quantization version set.
fn metadata(g: &Gguf<'_>, mix: Mix) -> (Vec<u8>, u64) {
    let mut out = Vec::new();
    let (mut n, mut saw_ftype, mut saw_qv) = (0u64, false, false);
    for i in 0..g.n_keys() {
        let Some((k, v)) = g.key_at(i) else { continue };
        let v = match k {
            b"general.file_type" => {
                saw_ftype = true;
                Value::U32(mix.ftype())
            }
            b"general.quantization_version" => {
                saw_qv = true;
                Value::U32(QNT_VERSION)
            }
            _ => v,
        };
        encode_kv(&mut out, k, &v);
        n += 1;
    }
    if !saw_qv {
        encode_kv(&mut out, b"general.quantization_version", &Value::U32(QNT_VERSION));
        n += 1;
    }
    if !saw_ftype {
        encode_kv(&mut out, b"general.file_type", &Value::U32(mix.ftype()));
        n += 1;
    }
    (out, n)
}

/// Converts `rows` rows of `src` (type `from`, `n` per row) into `dst` (type `to`).
fn convert_rows(from: GgmlType, to: GgmlType, n: usize, src: &[u8], dst: &mut [u8], threads: usize) -> Result<()> {
    let (sb, db) = (from.row_bytes(n as u64).unwrap_or(0) as usize, to.row_bytes(n as u64).unwrap_or(0) as usize);
    let rows = dst.len() / db.max(1);
    let per = rows.div_ceil(threads.max(1)).max(1);
    let work = |src: &[u8], dst: &mut [u8]| -> Result<()> {
        let k = Kernels::reference();
        let mut row = vec![0f32; n];
        for (s, d) in src.chunks_exact(sb).zip(dst.chunks_exact_mut(db)) {
            k.dequantize_row(from, s, &mut row).map_err(|e| anyhow::anyhow!("{e}"))?;
            quantize_row_ref(to, &row, d).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        Ok(())
    };
    if threads <= 1 || rows <= 1 {
        return work(src, dst);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = src.chunks(per * sb).zip(dst.chunks_mut(per * db)).map(|(sc, dc)| s.spawn(move || work(sc, dc))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a quantize thread panicked")))).collect::<Result<()>>()
    })
}

/// Writes one tensor's data: copied, or converted slab by slab.
fn write_tensor(w: &mut GgufWriter, j: &Job<'_>, threads: usize, bar: &mut Progress) -> Result<()> {
    let data = j.src.data;
    if !j.converts() {
        for c in data.chunks(SLAB_BYTES as usize) {
            w.write_data(c)?;
            bar.inc(c.len() as u64);
        }
        return Ok(());
    }
    let (from, to, n) = (j.src.ty, j.choice.target, j.src.ne[0]);
    let (sb, db) = match (from.row_bytes(n), to.row_bytes(n)) {
        (Some(s), Some(d)) if s > 0 && d > 0 => (s as usize, d as usize),
        _ => bail!("tensor {}: rows of {n} elements do not fit {from} → {to}", j.name),
    };
    let slab_rows = ((SLAB_BYTES as usize) / db).max(1);
    let mut out = vec![0u8; slab_rows.min(data.len() / sb) * db];
    for src in data.chunks(slab_rows * sb) {
        let rows = src.len() / sb;
        let dst = &mut out[..rows * db];
        convert_rows(from, to, n as usize, src, dst, threads).with_context(|| format!("tensor {}", j.name))?;
        w.write_data(dst)?;
        bar.inc(src.len() as u64);
    }
    Ok(())
}

/// The TYPE help: every mix keel can write, from [`supported_mixes`] (so it cannot drift).
fn type_help() -> String {
    format!("The mix, as llama-quantize names it: {}", names(&supported_mixes()))
}

/// `keel quantize`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Every file keel writes goes to a temp file beside it, renamed on success and removed on error or SIGINT/SIGTERM/SIGHUP. JSON: {\"converted\",\"copied\",\"fallbacks\",\"input_bytes\",\"output_bytes\",...}")]
pub struct QuantizeArgs {
    /// The model to convert (a .gguf file or a known name)
    #[arg(value_name = "IN")]
    pub input: String,
    /// The file to write (never IN itself)
    #[arg(value_name = "OUT")]
    pub output: String,
    /// The mix (see the list above).
    #[arg(value_name = "TYPE", help = type_help())]
    pub ty: String,
    /// Convert tensors that are already quantized (from their dequantized values)
    #[arg(long = "allow-requantize")]
    pub allow_requantize: bool,
    /// Threads (1..=256); the file is the same for any -t
    #[arg(short = 't', long = "threads", value_name = "N", default_value_t = crate::pool::ThreadPool::default_threads())]
    pub threads: usize,
    /// JSON output
    #[arg(long = "json")]
    pub json: bool,
}

/// `keel quantize --json`.
#[derive(Serialize)]
struct QuantizeJson<'a> {
    input: String,
    output: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
    ftype: u32,
    n_tensors: usize,
    converted: usize,
    copied: usize,
    fallbacks: usize,
    input_bytes: u64,
    output_bytes: u64,
    seconds: f64,
    threads: usize,
    tensor_types: BTreeMap<&'static str, usize>,
}

/// `keel quantize IN OUT TYPE`.
pub fn main(a: QuantizeArgs) -> Result<()> {
    let allow_requantize = a.allow_requantize;
    let as_json = a.json;
    let threads = super::common::threads(a.threads)?;
    let (input, output, ty) = (&a.input, &a.output, &a.ty);
    let mix = parse_mix(ty)?;
    let start = Instant::now();
    let opened = open(input)?;
    let g = opened.gguf()?;
    let facts = ModelFacts::from_gguf(&g).map_err(|e| anyhow::anyhow!("{}: {e}", opened.path.display()))?;
    let infos: Vec<TensorInfo<'_>> = g.tensors().collect();
    let shapes: Vec<TensorShape> = infos.iter().map(|t| TensorShape { name: t.name_str().to_string(), ne: t.ne, ty: t.ty }).collect();
    let choices = choose_types(mix, &facts, &shapes)?;
    let jobs: Vec<Job<'_>> = infos.into_iter().zip(shapes).zip(choices).map(|((src, s), choice)| Job { src, name: s.name, choice }).collect();
    check(&opened.path, &g, &jobs, allow_requantize)?;

    let (kv, n_kv) = metadata(&g, mix);
    let decls: Vec<TensorDecl> = jobs.iter().map(|j| TensorDecl { name: j.src.name.to_vec(), ne: j.src.ne, n_dims: j.src.n_dims, ty: j.choice.target }).collect();
    let out_path = Path::new(output);
    crate::fsutil::refuse_own_input(&opened.path, out_path, "OUT")?;
    let mut w = GgufWriter::create(out_path, &kv, n_kv, &decls, g.alignment()).with_context(|| format!("writing {}", out_path.display()))?;
    let total: u64 = jobs.iter().map(|j| j.src.data.len() as u64).sum();
    let mut bar = Progress::bytes(&format!("quantize {}", mix.name()), total);
    for j in &jobs {
        write_tensor(&mut w, j, threads, &mut bar).with_context(|| format!("writing {}", out_path.display()))?;
        w.end_tensor()?;
    }
    w.finish()?;
    bar.finish();
    let secs = start.elapsed().as_secs_f64();

    let in_bytes = opened.file.bytes().len() as u64;
    let out_bytes = std::fs::metadata(out_path).map(|m| m.len()).unwrap_or(0);
    let converted = jobs.iter().filter(|j| j.converts()).count();
    let fallbacks = jobs.iter().filter(|j| j.choice.fallback).count();
    let mut by_type: BTreeMap<&str, usize> = BTreeMap::new();
    for j in &jobs {
        *by_type.entry(j.choice.target.name()).or_default() += 1;
    }
    if as_json {
        crate::cli::print_json(&QuantizeJson {
            input: opened.path.display().to_string(),
            output,
            ty: mix.name(),
            ftype: mix.ftype() as u32,
            n_tensors: jobs.len(),
            converted,
            copied: jobs.len() - converted,
            fallbacks,
            input_bytes: in_bytes,
            output_bytes: out_bytes,
            seconds: secs,
            threads,
            tensor_types: by_type.clone(),
        });
    } else {
        let types: Vec<String> = by_type.iter().map(|(k, n)| format!("{n} {k}")).collect();
        println!(
            "keel quantize: {} ({}) -> {} ({}, {}) in {secs:.1} s\n  {} tensors: {converted} converted, {} copied, {fallbacks} by fallback; now {}",
            opened.path.display(),
            mib(in_bytes),
            output,
            mix.name(),
            mib(out_bytes),
            jobs.len(),
            jobs.len() - converted,
            types.join(", ")
        );
    }
    Ok(())
}

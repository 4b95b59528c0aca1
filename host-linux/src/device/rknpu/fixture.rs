//! Capture-tool fixtures (`manifest.json`, `weights.bin`, `bias.bin`, `input.bin`) in and
//! keel's stream and buffers for the same convolution out, so any capture of Mesa's rocket
//! driver can be compared with keel's output (`keel rknpu gen FIXTURE_DIR OUT_DIR`).
//!
//! Buffer addresses are the fixture's own (`submits[0].bos[].dma` by role), so keel's
//! stream relocated to them must equal Mesa's entry for entry.

use super::conv::{self, Addrs, Conv, Quant};
use super::{pack, regcmd};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::Path;

/// What a fixture asks for and where its buffers live.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// The convolution.
    pub conv: Conv,
    /// The buffer addresses (by role).
    pub addrs: Addrs,
    /// Raw weights (OHWI), biases, input (NHWC), as in the model.
    pub weights: Vec<u8>,
    /// Bias.
    pub bias: Vec<i32>,
    /// Input.
    pub input: Vec<u8>,
}

/// keel's output for a fixture: one stream per task and the three packed buffers.
#[derive(Debug, Clone)]
pub struct Generated {
    /// Task streams in submission order.
    pub tasks: Vec<Vec<u64>>,
    /// Packed weights, biases, input (as allocated: full buffer sizes).
    pub weights: Vec<u8>,
    /// Bias.
    pub bias: Vec<u8>,
    /// Input.
    pub input: Vec<u8>,
}

fn field<'a>(v: &'a Value, path: &str, file: &Path) -> Result<&'a Value> {
    let mut cur = v;
    for p in path.split('.') {
        cur = match p.parse::<usize>() {
            Ok(i) => cur.get(i),
            Err(_) => cur.get(p),
        }
        .with_context(|| format!("{}: field '{path}' is missing (is this a rocket-capture fixture v1?)", file.display()))?;
    }
    Ok(cur)
}

fn int(v: &Value, path: &str, file: &Path) -> Result<i64> {
    field(v, path, file)?.as_i64().with_context(|| format!("{}: field '{path}' is not an integer", file.display()))
}

fn num(v: &Value, path: &str, file: &Path) -> Result<f32> {
    Ok(field(v, path, file)?.as_f64().with_context(|| format!("{}: field '{path}' is not a number", file.display()))? as f32)
}

fn u32_of(v: &Value, path: &str, file: &Path) -> Result<u32> {
    let x = int(v, path, file)?;
    u32::try_from(x).with_context(|| format!("{}: field '{path}' = {x} is out of range", file.display()))
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>> {
    let p = dir.join(name);
    std::fs::read(&p).with_context(|| format!("cannot read {} (a fixture folder holds manifest.json, weights.bin, bias.bin, input.bin)", p.display()))
}

/// Reads a fixture folder.
pub fn load(dir: &Path) -> Result<Fixture> {
    let mpath = dir.join("manifest.json");
    let text = std::fs::read_to_string(&mpath).with_context(|| format!("cannot read {}", mpath.display()))?;
    let m: Value = serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", mpath.display()))?;
    let f = mpath.as_path();
    let (k, stride) = (int(&m, "spec.k", f)?, int(&m, "spec.stride", f)?);
    let padding = field(&m, "spec.padding", f)?.as_str().unwrap_or("");
    if k != 1 || stride != 1 {
        bail!("{}: spec k={k} stride={stride}: keel generates 1x1, stride-1 convolutions (GEMM) only", mpath.display());
    }
    if padding != "valid" && padding != "same" {
        bail!("{}: spec.padding '{padding}' is neither 'valid' nor 'same'", mpath.display());
    }
    let dtype = field(&m, "spec.dtype", f)?.as_str().unwrap_or("");
    if dtype != "int8" && dtype != "uint8" {
        bail!("{}: spec.dtype '{dtype}': keel handles int8 and uint8", mpath.display());
    }
    let conv = Conv {
        h: u32_of(&m, "spec.h", f)?,
        w: u32_of(&m, "spec.w", f)?,
        k: u32_of(&m, "spec.cin", f)?,
        n: u32_of(&m, "spec.cout", f)?,
        q: Quant {
            in_zp: int(&m, "spec.in_zp", f)? as i32,
            w_zp: int(&m, "spec.w_zp", f)? as i32,
            out_zp: int(&m, "spec.out_zp", f)? as i32,
            in_scale: num(&m, "spec.in_scale", f)?,
            w_scale: num(&m, "spec.w_scale", f)?,
            out_scale: num(&m, "spec.out_scale", f)?,
        },
        out32: false,
    };
    let bos = field(&m, "submits.0.bos", f)?.as_array().with_context(|| format!("{}: submits[0].bos is not a list", mpath.display()))?;
    let dma = |role: &str| -> Result<u32> {
        let bo = bos
            .iter()
            .find(|b| b.get("role").and_then(Value::as_str) == Some(role))
            .with_context(|| format!("{}: no buffer with role '{role}' in submits[0].bos", mpath.display()))?;
        u32_of(bo, "dma", f)
    };
    let addrs = Addrs { input: dma("input")?, weights: dma("weights")?, output: dma("output")?, bias: dma("bias")?, regcmd: dma("regcmd")? };
    let bias_bytes = read(dir, "bias.bin")?;
    if bias_bytes.len() != 4 * conv.n as usize {
        bail!("{}: {} bytes, expected {} (int32 per output channel)", dir.join("bias.bin").display(), bias_bytes.len(), 4 * conv.n);
    }
    let bias = bias_bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(Fixture { conv, addrs, weights: read(dir, "weights.bin")?, bias, input: read(dir, "input.bin")? })
}

/// keel's stream and buffers for a fixture.
pub fn generate(fx: &Fixture) -> Result<Generated, String> {
    let c = &fx.conv;
    let tasks = conv::plan(c, &fx.addrs)?;
    Ok(Generated {
        tasks: tasks.iter().map(conv::encode).collect(),
        weights: pack::weights(&fx.weights, c.k, c.n, c.q.w_zp)?,
        bias: pack::biases(&fx.bias, &fx.weights, c.k, c.n, c.q.in_zp, c.q.w_zp, conv::truncate_bits(c.q.w_scale))?,
        input: pack::input(&fx.input, c.h, c.w, c.k, c.q.in_zp)?,
    })
}

/// `keel rknpu gen FIXTURE_DIR OUT_DIR`: writes `OUT_DIR/regcmd/t<i>.bin` and
/// `OUT_DIR/{weights,bias,input}.bin`; returns the files written.
pub fn gen(fixture_dir: &Path, out_dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let fx = load(fixture_dir)?;
    let g = generate(&fx).map_err(|e| anyhow::anyhow!("{}: {e}", fixture_dir.display()))?;
    if conv::plan(&fx.conv, &fx.addrs).map_err(anyhow::Error::msg)?.iter().any(conv::wraps) {
        eprintln!(
            "warning: {}: like Mesa, a task has more than {} rows, so its 11-bit height fields wrap; the stream equals Mesa's and is wrong on hardware (keel's own GEMMs split such tasks)",
            fixture_dir.display(),
            conv::MAX_ROWS
        );
    }
    let rdir = out_dir.join("regcmd");
    std::fs::create_dir_all(&rdir).with_context(|| format!("cannot create {}", rdir.display()))?;
    let mut written = Vec::new();
    let mut files: Vec<(std::path::PathBuf, Vec<u8>)> = g.tasks.iter().enumerate().map(|(i, t)| (rdir.join(format!("t{i}.bin")), regcmd::to_bytes(t))).collect();
    files.push((out_dir.join("weights.bin"), g.weights));
    files.push((out_dir.join("bias.bin"), g.bias));
    files.push((out_dir.join("input.bin"), g.input));
    for (p, bytes) in files {
        for src in ["manifest.json", "weights.bin", "bias.bin", "input.bin"] {
            crate::fsutil::refuse_own_input(&fixture_dir.join(src), &p, "output file")?;
        }
        crate::fsutil::write_atomic(&p, &bytes)?;
        written.push(p);
    }
    Ok(written)
}

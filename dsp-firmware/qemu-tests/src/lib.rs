//! Host side of the firmware tests: random ggml inputs, op batches built with
//! keel-npu-hal's types ([`batch`]), a runner that feeds a request to the harness
//! ELF under `qemu-hexagon`, and the expected values — every one of them a
//! keel-core call on the host with its scalar reference kernels
//! (`Kernels::reference()`, [`expect`]), chained into a whole llama layer by
//! [`llama`]. The firmware computes by calling the same keel-core code built for
//! Hexagon, so every comparison here is of bits ([`assert_same_f32`],
//! [`assert_same_bytes`]): no tolerances. This crate computes no value itself.
//!
//! Environment (set by `dsp-firmware/ci.sh`): `KEEL_DSP_ELF` (the harness),
//! `KEEL_DSP_ELF_BROKEN` (built with `broken-hvx-zeros`), `KEEL_QEMU_CPU`
//! (`v68`, `v73`, or `v67`), optionally `KEEL_QEMU` (the qemu-hexagon binary).

pub mod batch;
pub mod expect;
pub mod llama;

use std::io::Write;
use std::process::{Command, Stdio};

use keel_npu_hal::op::DType;

/// Harness request magic and commands (see the firmware's `harness` module).
pub const MAGIC: &[u8; 4] = b"KDSP";
/// Matrix product command.
pub const CMD_MATMUL: u32 = 1;
/// Self-test command.
pub const CMD_SELFTEST: u32 = 2;
/// f16 ↔ f32 conversions command.
pub const CMD_F16: u32 = 4;
/// Thread pool start/run/stop cycles command.
pub const CMD_THREADS: u32 = 5;
/// Attention's K·Q dots command.
pub const CMD_DOT: u32 = 6;
/// Attention's value-update command.
pub const CMD_MAD: u32 = 7;

pub use keel_test_support::{activations, Rng};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run dsp-firmware/ci.sh, which builds the ELFs and sets it"))
}

/// Runs `elf` under qemu-hexagon with `input` on stdin; returns stdout (exit code must be 0).
pub fn run_elf(elf: &str, input: &[u8]) -> Vec<u8> {
    let qemu = std::env::var("KEEL_QEMU").unwrap_or_else(|_| "qemu-hexagon".into());
    let cpu = env("KEEL_QEMU_CPU");
    let mut child = Command::new(&qemu)
        .args(["-cpu", &cpu, elf])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {qemu}: {e}"));
    // Feed stdin from a thread so a large response cannot deadlock us.
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    assert!(out.status.success(), "{elf} under {qemu} -cpu {cpu}: {:?}, stderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// The harness ELF under test.
pub fn elf() -> String {
    env("KEEL_DSP_ELF")
}

/// The ELF built with `broken-hvx-zeros`.
pub fn broken_elf() -> String {
    env("KEEL_DSP_ELF_BROKEN")
}

/// Little-endian words of a response.
pub fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()))
}

/// Appends little-endian u32 words.
pub fn put(req: &mut Vec<u8>, ws: &[u32]) {
    ws.iter().for_each(|w| req.extend_from_slice(&w.to_le_bytes()));
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Bytes as f32 values.
pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// f16 values as little-endian bytes.
pub fn f16_bytes(v: &[half::f16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

/// Random ggml weight rows of `t` (Q8_0, Q4_0, IQ4_NL): scales of both signs and
/// many magnitudes, random quants.
pub fn ggml_weights(t: DType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..rows * k / 32 {
        let d = rng.f32() * [1e-3, 0.02, 0.5, 4.0][(rng.u32() % 4) as usize];
        v.extend_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
        (0..t.block_bytes() - 2).for_each(|_| v.push(rng.u32() as u8));
    }
    v
}

/// Weights with modest scales (so activations stay O(1) through a layer).
pub fn small_weights(t: DType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut w = ggml_weights(t, rows, k, rng);
    for blk in w.chunks_mut(t.block_bytes() as usize) {
        let d = (0.01 + 0.02 * (rng.f32() + 1.0) / 2.0) / if t == DType::Q8_0 { 16.0 } else { 2.0 };
        blk[..2].copy_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
    }
    w
}

/// Asserts that `got` and `want` hold the same f32 values bit for bit (a NaN must
/// meet a NaN; its payload is not compared: Rust leaves NaN payloads unspecified, and
/// Hexagon's default NaN is not x86's). On failure, names the first differing index
/// with both values and their bits, and how many differ.
pub fn assert_same_f32(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let same = |g: f32, w: f32| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
    if let Some(i) = (0..got.len()).find(|&i| !same(got[i], want[i])) {
        let n = got.iter().zip(want).filter(|(&g, &w)| !same(g, w)).count();
        let max = got.iter().zip(want).filter(|(&g, &w)| !same(g, w)).map(|(&g, &w)| (g - w).abs()).fold(0f32, f32::max);
        panic!(
            "{what}: {n} of {} values differ (max |Δ| {max:e}); first at [{i}]: DSP {:e} ({:#010x}) vs keel-core {:e} ({:#010x})",
            got.len(),
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

/// Asserts equal bytes; on failure names the first differing byte and how many differ.
pub fn assert_same_bytes(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        let n = got.iter().zip(want).filter(|(g, w)| g != w).count();
        panic!("{what}: {n} of {} bytes differ; first at [{i}]: DSP {:#04x} vs keel-core {:#04x}", got.len(), got[i], want[i]);
    }
}

/// Asserts equal int32 values; on failure names the first differing index.
pub fn assert_same_i32(got: &[i32], want: &[i32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        let n = got.iter().zip(want).filter(|(g, w)| g != w).count();
        panic!("{what}: {n} of {} values differ; first at [{i}]: DSP {} vs keel-core {}", got.len(), got[i], want[i]);
    }
}

/// All 65,536 f16 bit patterns as f32 (±0, subnormals, ±∞ and NaNs included).
pub fn every_f16() -> Vec<f32> {
    (0..=u16::MAX).map(|b| half::f16::from_bits(b).to_f32()).collect()
}

/// `n` f32 values of every kind: random bit patterns (any exponent; NaNs and ±∞
/// among them), subnormals, ±0, ±∞, NaN, extremes, values around the exponentials'
/// limits (|x| ≈ 87–104 for expf, ≈ 133 where ggml's expf saturates), ranges where
/// SiLU/GELU/GeGLU change regime (|x| < 20, ±10), and tiny ones.
pub fn wide_values(rng: &mut Rng, n: usize) -> Vec<f32> {
    let specials = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::from_bits(0x007f_ffff),
        f32::EPSILON,
        1.0,
        -1.0,
        10.0,
        -10.0,
        9.999_999,
        -9.999_999,
        88.72284,
        -88.72284,
        -87.33655,
        -103.97208,
        133.0,
        -133.0,
        133.1,
        -133.1,
        192.0,
        -192.0,
    ];
    let mut v: Vec<f32> = specials.to_vec();
    while v.len() < n {
        let r = rng.u32();
        v.push(match rng.u32() % 8 {
            0 => f32::from_bits(r),                                                             // any bits
            1 => f32::from_bits(r & 0x807f_ffff),                                               // subnormal (or ±0)
            2 => rng.f32() * 20.0,                                                              // the curved part
            3 => rng.f32() * 150.0,                                                             // exp's whole range
            4 => (87.0 + 50.0 * (rng.f32() + 1.0) / 2.0) * if r & 1 == 0 { 1.0 } else { -1.0 }, // the range limits
            5 => rng.f32() * 1e-3,                                                              // near 0
            6 => f32::from_bits((r & 0x8000_0000) | (0x3f80_0000 + (r % (40 << 23)))),          // |x| in [1, 2^40)
            _ if r.is_multiple_of(4) => specials[(r / 4) as usize % specials.len()],            // the specials again, anywhere
            _ => rng.f32() * 10.5,                                                              // around ±10
        });
    }
    v
}

//! Host side of the firmware tests: random ggml inputs, scalar references
//! written from the ggml block definitions ([`reference`]) and the op
//! definitions ([`layer_ref`]), independent of the firmware code, op batches
//! built with keel-npu-hal's types ([`batch`]), and a runner that feeds a
//! request to the harness ELF under `qemu-hexagon`.
//!
//! Environment (set by `dsp-firmware/ci.sh`): `KEEL_DSP_ELF` (the harness),
//! `KEEL_DSP_ELF_BROKEN` (built with `broken-hvx-zeros`), `KEEL_QEMU_CPU`
//! (`v68`, `v73`, or `v67`), optionally `KEEL_QEMU` (the qemu-hexagon binary).

pub mod batch;
pub mod layer_ref;
pub mod reference;

use std::io::Write;
use std::process::{Command, Stdio};

/// Harness request magic and commands (see the firmware's `harness` module).
pub const MAGIC: &[u8; 4] = b"KDSP";
/// Matrix product command.
pub const CMD_MATMUL: u32 = 1;
/// Self-test command.
pub const CMD_SELFTEST: u32 = 2;

/// xorshift64*: small, seeded, reproducible.
pub struct Rng(pub u64);

impl Rng {
    /// Next 32 random bits.
    pub fn u32(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    }
}

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

/// Random ggml weight rows of `t`: scales of both signs and many magnitudes.
pub fn ggml_weights(t: reference::WType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..rows * k / 32 {
        let d = rng.f32() * [1e-3, 0.02, 0.5, 4.0][(rng.u32() % 4) as usize];
        v.extend_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
        (0..t.block_bytes() - 2).for_each(|_| v.push(rng.u32() as u8));
    }
    v
}

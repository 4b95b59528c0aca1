//! keel with no libc and no allocator: the model embedded in the executable, the arena a
//! `static` sized at build time (build.rs), the kernel reached through raw system calls.
//! Prints the greedy continuation of config::PROMPT, then its token ids, the kernels and
//! the arena size, and exits 0.
#![no_std]
#![no_main]
// src/mem.rs is this program's memcpy & co.: the compiler must not turn its loops into calls.
#![no_builtins]
#![deny(unsafe_op_in_unsafe_fn)]

mod config;
mod mem;
mod sys;

use config::{N_BATCH, N_CTX, N_OUTPUTS, N_PREDICT, N_THREADS, PROMPT};
use core::fmt::Write;
use keel_core::engine::Engine;
use keel_core::gguf::Gguf;
use keel_core::parallel::Sequential;
use keel_core::quant::{Isa, Kernels};
use keel_core::sampler::SamplerConfig;
use keel_core::session::{Outputs, SessionConfig};
use keel_core::tokenizer::{Tokenizer, Utf8Stream};
use sys::{exit, Fd};

// PLAN_BYTES and ARENA_BYTES, from keel-core's plan (build.rs).
include!(concat!(env!("OUT_DIR"), "/arena.rs"));
// build.rs refuses a smaller arena (stating both sizes); this holds it to that.
const _: () = assert!(ARENA_BYTES >= PLAN_BYTES, "the static arena is smaller than keel-core's plan");

/// Bytes aligned for keel-core: the arena's regions and the weights' blocks.
#[repr(C, align(64))]
struct Aligned<T: ?Sized>(T);

/// The model, in the executable's read-only data.
static MODEL: &Aligned<[u8]> = &Aligned(*include_bytes!(env!("KEEL_NOLIBC_MODEL")));
/// Everything keel-core needs beyond the model: layer table, tokenizer index, KV cache,
/// activations, logits, sampler candidates (in .bss: costs no file size).
static mut ARENA: Aligned<[u8; ARENA_BYTES]> = Aligned([0; ARENA_BYTES]);
/// The tokenizer's scratch for PROMPT.
static mut WORK: [u8; Tokenizer::work_bytes(PROMPT.len())] = [0; Tokenizer::work_bytes(PROMPT.len())];

/// Called once by `_start` (sys.rs) with the kernel's auxiliary vector for CPU features.
fn main(hwcap: usize) -> i32 {
    let mut out = Fd(1);
    let mut err = Fd(2);
    // SAFETY: main runs once, on the only thread, so these are the statics' only borrows.
    let (arena, work): (&mut [u8], &mut [u8]) = unsafe { (&mut (*core::ptr::addr_of_mut!(ARENA)).0, &mut *core::ptr::addr_of_mut!(WORK)) };
    let gguf = match Gguf::parse(&MODEL.0) {
        Ok(g) => g,
        Err(e) => return fail(&mut err, format_args!("the embedded model: {e}")),
    };
    let cfg = SessionConfig { n_ctx: N_CTX, n_batch: N_BATCH, n_outputs: N_OUTPUTS, n_threads: N_THREADS };
    let greedy = SamplerConfig { temp: 0.0, ..SamplerConfig::default() };
    let mut e = match Engine::new(&gguf, arena, cfg, Kernels::new(isa(hwcap)), greedy) {
        Ok(e) => e,
        Err(er) => return fail(&mut err, format_args!("loading the model: {er}")),
    };

    let mut ids = [0u32; N_CTX];
    let n = match e.tokenizer.tokenize(PROMPT, true, true, &mut ids, work) {
        Ok(n) => n,
        Err(er) => return fail(&mut err, format_args!("tokenizing the prompt: {er}")),
    };
    let mut generated = [0u32; N_PREDICT];
    let mut n_gen = 0;
    let mut piece = [0u8; 256];
    let mut stream = Utf8Stream::new();
    let mut step = e.eval(&ids[..n], Outputs::Last, &Sequential).map(|_| ());
    while step.is_ok() && n_gen < N_PREDICT {
        let tok = e.sample();
        if e.tokenizer.is_eog(tok) {
            break;
        }
        generated[n_gen] = tok;
        n_gen += 1;
        match e.tokenizer.piece(tok, true, &mut piece) {
            Ok(len) => stream.push(&piece[..len], |s: &str| out.put(s)),
            Err(er) => return fail(&mut err, format_args!("token {tok}: {er}")),
        }
        if e.session.n_past() >= N_CTX {
            break;
        }
        step = e.eval(&[tok], Outputs::Last, &Sequential).map(|_| ());
    }
    if let Err(er) = step {
        return fail(&mut err, format_args!("evaluating: {er}"));
    }
    stream.finish(|s: &str| out.put(s));
    let _ = write!(out, "\ntokens:");
    for t in &generated[..n_gen] {
        let _ = write!(out, " {t}");
    }
    let _ = writeln!(out, "\nkernels: {}", Kernels::new(isa(hwcap)).name());
    let _ = writeln!(out, "arena: {ARENA_BYTES} bytes (keel-core's plan: {PLAN_BYTES})");
    0
}

/// The SIMD kernels this CPU may run. keel-core confirms the x86_64 claims with CPUID
/// itself; on aarch64, NEON is part of the target and `sdot` is the kernel's `HWCAP_ASIMDDP`.
fn isa(hwcap: usize) -> Isa {
    let _ = hwcap;
    #[cfg(target_arch = "x86_64")]
    return Isa { avx2_fma: true, avx512: true, avx512_vnni: true, avx512_fp16: true, ..Isa::default() };
    #[cfg(target_arch = "aarch64")]
    return Isa { neon: true, neon_dotprod: hwcap & 1 << 20 != 0, ..Isa::default() };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    Isa::default()
}

/// Writes `error: msg` to stderr; the exit status.
fn fail(err: &mut Fd, msg: core::fmt::Arguments<'_>) -> i32 {
    let _ = writeln!(err, "error: {msg}");
    1
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let _ = writeln!(Fd(2), "keel-example-linux-nolibc: {info}");
    exit(101)
}

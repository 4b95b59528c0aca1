//! The keel-wasi guest: keel-core with the scalar reference kernels, built for
//! `wasm32-unknown-unknown` as a module with **no imports** (no clock, no random, no
//! WASI), so nothing outside its own linear memory can change what it computes.
//!
//! Memory: every buffer is a fresh range of linear memory taken with `memory.grow`
//! ([`reserve`]); nothing is ever freed, and no allocator exists. The host writes the
//! model file into one such range once (the only copy) and the guest parses it in place.
//!
//! ABI (all integers are wasm `i32`; pointers are offsets in the exported `memory`):
//!
//! ```text
//! keel_abi_version() -> 1
//! keel_alloc(len) -> ptr          a new range of len bytes (0: memory limit reached)
//! keel_load(ptr, len, n_ctx, n_batch) -> status
//!                                 parse the GGUF at ptr, plan and carve the arena
//! keel_input(len) -> ptr          a buffer for the next prompt's UTF-8 bytes (reused)
//! keel_run(len, n_predict) -> status
//!                                 tokenize the prompt, evaluate it, generate greedily
//! keel_result_ptr() / keel_result_len()   the record of the last keel_run
//! keel_error_ptr() / keel_error_len()     the message of the last failure or panic
//! ```
//!
//! Status 0 is success; anything else is a failure described by `keel_error_*`. A
//! panic writes its message there and traps.
//!
//! The result record, little-endian u32 words then bytes:
//!
//! ```text
//! [1 (version), stop, n_prompt, n_generated, n_rows, n_text]
//! prompt token ids      n_prompt x u32
//! generated token ids   n_generated x u32
//! logits_sha256         32 bytes: SHA-256 of all rows below, concatenated in order
//! row digests           n_rows x 32 bytes: SHA-256 of each row alone
//! text                  n_text bytes: the generated tokens' pieces (may split UTF-8)
//! ```
//!
//! Rows: one logits row per greedy choice, in order: the last prompt position's row,
//! then the row after each generated token that was evaluated, including the row that
//! chose end-of-generation if generation stopped there; each row is the `n_vocab` f32
//! logits as IEEE-754 binary32 little-endian bytes, in token-id order.
//! `stop`: 0 = n_predict tokens generated, 1 = end of generation, 2 = context full.
#![no_std]

use core::cell::UnsafeCell;
use core::fmt::Write as _;
use keel_core::engine::{plan, Engine};
use keel_core::gguf::Gguf;
use keel_core::parallel::Sequential;
use keel_core::quant::Kernels;
use keel_core::sampler::SamplerConfig;
use keel_core::session::{Outputs, SessionConfig};
use keel_core::tokenizer::Tokenizer;
use sha2::{Digest, Sha256};

const PAGE: usize = 65536;
const ERROR_CAP: usize = 2048;

/// Guest state. wasm32 without the threads proposal has exactly one thread, so the
/// cells below are never accessed concurrently.
struct Global<T>(UnsafeCell<T>);
// SAFETY: the guest is single-threaded (the host disables wasm threads), so no two
// references to the contents exist at the same time across threads.
unsafe impl<T> Sync for Global<T> {}

impl<T> Global<T> {
    /// The contents. Callers keep the borrow within one exported call and never hold
    /// two borrows of the same cell.
    #[allow(clippy::mut_from_ref)]
    fn get(&self) -> &mut T {
        // SAFETY: single-threaded (see `Sync` above), and every exported function takes
        // each cell's borrow once, for the duration of that call only.
        unsafe { &mut *self.0.get() }
    }
}

struct State {
    engine: Engine<'static>,
    n_ctx: usize,
}

static STATE: Global<Option<State>> = Global(UnsafeCell::new(None));
static INPUT: Global<Scratch> = Global(UnsafeCell::new(Scratch::EMPTY));
static WORK: Global<Scratch> = Global(UnsafeCell::new(Scratch::EMPTY));
static RESULT: Global<(usize, usize)> = Global(UnsafeCell::new((0, 0)));
static ERROR: Global<ErrorBuf> = Global(UnsafeCell::new(ErrorBuf { buf: [0; ERROR_CAP], len: 0 }));

/// A fresh range of `len` bytes of linear memory (grown for it, page-aligned), or `None`
/// when the host's memory limit refuses the growth.
fn reserve(len: usize) -> Option<&'static mut [u8]> {
    let pages = len.div_ceil(PAGE).max(1);
    let old = core::arch::wasm32::memory_grow(0, pages);
    if old == usize::MAX {
        return None;
    }
    // SAFETY: `memory.grow` just added pages `old..old + pages`; nothing else refers to
    // them (Rust's stack and statics live below the initial memory size, and no
    // allocator exists), and they are never released, so a `'static` slice is sound.
    // New pages are zeroed by wasm.
    Some(unsafe { core::slice::from_raw_parts_mut((old * PAGE) as *mut u8, len) })
}

/// A reusable buffer that grows (by taking a new, larger range) when asked for more.
struct Scratch {
    mem: Option<&'static mut [u8]>,
}

impl Scratch {
    const EMPTY: Scratch = Scratch { mem: None };

    fn get(&mut self, len: usize) -> Option<&mut [u8]> {
        let have = self.mem.as_ref().map_or(0, |m| m.len());
        if have < len || self.mem.is_none() {
            self.mem = Some(reserve(len.max(2 * have))?);
        }
        self.mem.as_deref_mut().map(|m| &mut m[..len])
    }
}

struct ErrorBuf {
    buf: [u8; ERROR_CAP],
    len: usize,
}

impl core::fmt::Write for ErrorBuf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(ERROR_CAP - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Records `msg` as the last error and returns the failure status.
fn fail(msg: core::fmt::Arguments<'_>) -> i32 {
    let e = ERROR.get();
    e.len = 0;
    let _ = e.write_fmt(msg);
    1
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    fail(format_args!("guest panicked: {info}"));
    core::arch::wasm32::unreachable()
}

/// The ABI version the host checks.
#[no_mangle]
pub extern "C" fn keel_abi_version() -> u32 {
    1
}

/// A new range of `len` bytes, or 0 if the memory limit refuses it.
#[no_mangle]
pub extern "C" fn keel_alloc(len: u32) -> u32 {
    reserve(len as usize).map_or(0, |m| m.as_ptr() as u32)
}

/// The buffer the host writes the next prompt (`len` UTF-8 bytes) into, or 0.
#[no_mangle]
pub extern "C" fn keel_input(len: u32) -> u32 {
    INPUT.get().get(len as usize).map_or(0, |m| m.as_ptr() as u32)
}

/// Loads the GGUF file the host wrote at `ptr` (a range from `keel_alloc`, `len` bytes).
#[no_mangle]
pub extern "C" fn keel_load(ptr: u32, len: u32, n_ctx: u32, n_batch: u32) -> i32 {
    if STATE.get().is_some() {
        return fail(format_args!("a model is already loaded"));
    }
    if ptr == 0 || !(ptr as usize).is_multiple_of(PAGE) {
        return fail(format_args!("keel_load: {ptr:#x} is not a range from keel_alloc"));
    }
    // SAFETY: the host got `ptr` from `keel_alloc(len)`: a reserved range of `len`
    // bytes that nothing else uses and that is never freed; from now on it is only read.
    let bytes: &'static [u8] = unsafe { core::slice::from_raw_parts(ptr as *const u8, len as usize) };
    let g = match Gguf::parse(bytes) {
        Ok(g) => g,
        Err(e) => return fail(format_args!("model: {e}")),
    };
    let n_ctx = (n_ctx as usize).max(1);
    let cfg = SessionConfig { n_ctx, n_batch: (n_batch as usize).clamp(1, n_ctx), n_outputs: 1, n_threads: 1 };
    let p = match plan(&g, &cfg) {
        Ok(p) => p,
        Err(e) => return fail(format_args!("model: {e}")),
    };
    let Some(arena) = reserve(p.total_bytes()) else {
        return fail(format_args!("the {} byte arena does not fit in the memory limit", p.total_bytes()));
    };
    let greedy = SamplerConfig { temp: 0.0, repeat_penalty: 1.0, ..SamplerConfig::default() };
    match Engine::new(&g, arena, cfg, Kernels::reference(), greedy) {
        Ok(engine) => {
            *STATE.get() = Some(State { engine, n_ctx });
            0
        }
        Err(e) => fail(format_args!("model: {e}")),
    }
}

/// Tokenizes the `len` prompt bytes in the input buffer (BOS/EOS as the model says,
/// special tokens parsed), evaluates them from an empty context, and generates up to
/// `n_predict` tokens greedily, hashing every logits row a token was chosen from.
#[no_mangle]
pub extern "C" fn keel_run(len: u32, n_predict: u32) -> i32 {
    let Some(st) = STATE.get().as_mut() else {
        return fail(format_args!("no model loaded"));
    };
    let input = match INPUT.get().mem.as_deref() {
        Some(m) if m.len() >= len as usize => &m[..len as usize],
        _ => return fail(format_args!("keel_run: the prompt was not written with keel_input")),
    };
    let Ok(text) = core::str::from_utf8(input) else {
        return fail(format_args!("the prompt is not UTF-8"));
    };
    let (e, n_ctx, n_predict) = (&mut st.engine, st.n_ctx, n_predict as usize);
    let n_vocab = e.n_vocab();
    let max_piece = e.tokenizer.max_piece_len();

    // Work buffer: prompt ids (n_ctx), generated ids (n_predict), row digests (one per
    // choice: at most n_predict + 1), text, tokenizer work, then the record itself.
    let sizes = [4 * n_ctx, 4 * n_predict, 32 * (n_predict + 1), max_piece * n_predict, Tokenizer::work_bytes(text.len())];
    let record_max = 4 * 6 + sizes[0] + sizes[1] + 32 + sizes[2] + sizes[3];
    let total = sizes.iter().sum::<usize>() + record_max;
    let Some(work) = WORK.get().get(total) else {
        return fail(format_args!("the {total} byte work buffer does not fit in the memory limit"));
    };
    let (ids, rest) = work.split_at_mut(sizes[0]);
    let (gen, rest) = rest.split_at_mut(sizes[1]);
    let (rows, rest) = rest.split_at_mut(sizes[2]);
    let (text_out, rest) = rest.split_at_mut(sizes[3]);
    let (tok_work, record) = rest.split_at_mut(sizes[4]);
    let (ids, gen) = (as_u32s(ids), as_u32s(gen));

    e.reset();
    let n_prompt = match e.tokenizer.tokenize(text, true, true, ids, tok_work) {
        Ok(0) => return fail(format_args!("the prompt is empty after tokenization")),
        Ok(n) => n,
        Err(err) => return fail(format_args!("tokenizing: {err}")),
    };
    if let Err(err) = e.eval(&ids[..n_prompt], Outputs::Last, &Sequential) {
        return fail(format_args!("evaluating the prompt: {err}"));
    }
    let mut all = Sha256::new();
    let (mut n_gen, mut n_rows, mut n_text, mut stop) = (0usize, 0usize, 0usize, 0u32);
    while n_gen < n_predict {
        // Hash the row this choice is made from: f32 little-endian, token-id order.
        let mut one = Sha256::new();
        let mut le = [0u8; 4096];
        for chunk in e.session.last_logits(n_vocab).chunks(1024) {
            for (b, v) in le.chunks_exact_mut(4).zip(chunk) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            one.update(&le[..4 * chunk.len()]);
            all.update(&le[..4 * chunk.len()]);
        }
        rows[32 * n_rows..32 * (n_rows + 1)].copy_from_slice(&one.finalize());
        n_rows += 1;
        let tok = e.sample();
        if e.tokenizer.is_eog(tok) {
            stop = 1;
            break;
        }
        gen[n_gen] = tok;
        n_gen += 1;
        n_text += e.tokenizer.piece(tok, true, &mut text_out[n_text..n_text + max_piece]).unwrap_or(0);
        if e.session.n_past() >= e.session.n_ctx() {
            stop = 2;
            break;
        }
        // Stop before evaluating a token no choice will be made after.
        if n_gen == n_predict {
            break;
        }
        if let Err(err) = e.eval(&[tok], Outputs::Last, &Sequential) {
            return fail(format_args!("evaluating generated token {n_gen}: {err}"));
        }
    }

    let mut w = Writer { buf: record, at: 0 };
    for v in [1, stop, n_prompt as u32, n_gen as u32, n_rows as u32, n_text as u32] {
        w.bytes(&v.to_le_bytes());
    }
    for &t in ids[..n_prompt].iter().chain(&gen[..n_gen]) {
        w.bytes(&t.to_le_bytes());
    }
    w.bytes(&all.finalize());
    w.bytes(&rows[..32 * n_rows]);
    w.bytes(&text_out[..n_text]);
    *RESULT.get() = (w.buf.as_ptr() as usize, w.at);
    0
}

/// Appends bytes to a record.
struct Writer<'b> {
    buf: &'b mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, b: &[u8]) {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
}

/// Views scratch bytes as u32s: every split above is at a multiple of 4 from a
/// page-aligned start, so the whole slice is aligned.
fn as_u32s(b: &mut [u8]) -> &mut [u32] {
    // SAFETY: u32 has no invalid bit patterns; `align_to_mut` hands out only the aligned
    // middle part, which is all of `b` here (see above).
    let (_, mid, _) = unsafe { b.align_to_mut::<u32>() };
    mid
}

/// Offset of the last result record.
#[no_mangle]
pub extern "C" fn keel_result_ptr() -> u32 {
    RESULT.get().0 as u32
}

/// Length in bytes of the last result record.
#[no_mangle]
pub extern "C" fn keel_result_len() -> u32 {
    RESULT.get().1 as u32
}

/// Offset of the last error message (UTF-8).
#[no_mangle]
pub extern "C" fn keel_error_ptr() -> u32 {
    ERROR.get().buf.as_ptr() as u32
}

/// Length in bytes of the last error message.
#[no_mangle]
pub extern "C" fn keel_error_len() -> u32 {
    ERROR.get().len as u32
}

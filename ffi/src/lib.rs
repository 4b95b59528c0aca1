//! keel's C ABI (header: `include/keel.h`, which states ownership and lifetimes).
//!
//! No global state and no heap: a session lives inside the arena the caller hands to
//! [`keel_session_init`], next to the tokenizer's scratch and keel-core's arena regions,
//! and it borrows the caller's model bytes. Every function returns a [`KEEL_OK`] or one
//! of the `KEEL_ERR_*` codes; a null pointer, a bad length, a corrupt model or a too-small
//! arena is a code, never a crash, and a panic inside keel-core is caught at the boundary
//! and reported as [`KEEL_ERR_INTERNAL`].
//!
//! This is a `std` crate only so that panics can be caught (`catch_unwind`); nothing here
//! allocates, and keel-core itself is `no_std`. The kernels are keel-core's portable
//! scalar reference set ([`Kernels::reference`]), so the library runs on any CPU and
//! under valgrind, and its greedy tokens are those of `keel run --reference`.

use core::ffi::{c_char, c_int, c_void, CStr};
use core::mem::{align_of, size_of};
use core::panic::AssertUnwindSafe;
use keel_core::engine::{plan, Engine};
use keel_core::error::Error;
use keel_core::gguf::Gguf;
use keel_core::parallel::Sequential;
use keel_core::quant::Kernels;
use keel_core::sampler::SamplerConfig;
use keel_core::session::{Outputs, SessionConfig};
use keel_core::tokenizer::{Tokenizer, TokenizerError};

/// Success.
pub const KEEL_OK: c_int = 0;
/// A pointer argument that must not be null was null.
pub const KEEL_ERR_NULL_POINTER: c_int = 1;
/// An argument is out of range (zero `n_ctx` or `n_batch`, zero tokens, a misaligned
/// token buffer).
pub const KEEL_ERR_BAD_ARGUMENT: c_int = 2;
/// The model bytes are not a GGUF file keel can run (corrupt, truncated, unsupported).
pub const KEEL_ERR_BAD_MODEL: c_int = 3;
/// The arena is smaller than `keel_plan_size` says.
pub const KEEL_ERR_ARENA_TOO_SMALL: c_int = 4;
/// The handle is not a live session (never initialised, or its arena was reused).
pub const KEEL_ERR_BAD_HANDLE: c_int = 5;
/// The tokens do not fit in the context that is left.
pub const KEEL_ERR_CONTEXT_FULL: c_int = 6;
/// A token id outside the vocabulary.
pub const KEEL_ERR_BAD_TOKEN: c_int = 7;
/// The output buffer is too small; the `out_n`/`out_len` argument holds the size needed.
pub const KEEL_ERR_BUFFER_TOO_SMALL: c_int = 8;
/// The text is longer than the session's tokenizer scratch holds (`KEEL_TEXT_BYTES_PER_CTX * n_ctx`).
pub const KEEL_ERR_TEXT_TOO_LONG: c_int = 9;
/// The text is not valid UTF-8.
pub const KEEL_ERR_INVALID_UTF8: c_int = 10;
/// `keel_sample` before any `keel_eval` since the session began or was reset.
pub const KEEL_ERR_NO_LOGITS: c_int = 11;
/// keel-core failed in a way no other code describes (a bug: please report it).
pub const KEEL_ERR_INTERNAL: c_int = 12;

/// Every code with its message, in code order (`keel_error_message`, the header check).
pub const ERRORS: [(c_int, &str, &CStr); 13] = [
    (KEEL_OK, "KEEL_OK", c"ok"),
    (KEEL_ERR_NULL_POINTER, "KEEL_ERR_NULL_POINTER", c"a required pointer argument is null"),
    (KEEL_ERR_BAD_ARGUMENT, "KEEL_ERR_BAD_ARGUMENT", c"an argument is out of range or misaligned"),
    (KEEL_ERR_BAD_MODEL, "KEEL_ERR_BAD_MODEL", c"the model bytes are not a GGUF file keel can run"),
    (KEEL_ERR_ARENA_TOO_SMALL, "KEEL_ERR_ARENA_TOO_SMALL", c"the arena is smaller than keel_plan_size says"),
    (KEEL_ERR_BAD_HANDLE, "KEEL_ERR_BAD_HANDLE", c"the handle is not a live session"),
    (KEEL_ERR_CONTEXT_FULL, "KEEL_ERR_CONTEXT_FULL", c"the tokens do not fit in the context"),
    (KEEL_ERR_BAD_TOKEN, "KEEL_ERR_BAD_TOKEN", c"a token id is outside the vocabulary"),
    (KEEL_ERR_BUFFER_TOO_SMALL, "KEEL_ERR_BUFFER_TOO_SMALL", c"the output buffer is too small"),
    (KEEL_ERR_TEXT_TOO_LONG, "KEEL_ERR_TEXT_TOO_LONG", c"the text is longer than the session's tokenizer scratch"),
    (KEEL_ERR_INVALID_UTF8, "KEEL_ERR_INVALID_UTF8", c"the text is not valid UTF-8"),
    (KEEL_ERR_NO_LOGITS, "KEEL_ERR_NO_LOGITS", c"nothing was evaluated since the session began or was reset"),
    (KEEL_ERR_INTERNAL, "KEEL_ERR_INTERNAL", c"internal error in keel"),
];

/// Text bytes per context position the tokenizer scratch is sized for: a session with
/// context `n_ctx` tokenizes texts of up to `KEEL_TEXT_BYTES_PER_CTX * n_ctx` bytes.
pub const KEEL_TEXT_BYTES_PER_CTX: usize = 8;

/// Marks a live session; cleared by nothing (a reused arena simply stops matching).
const MAGIC: u64 = 0x6b65_656c_5f73_6573; // "keel_ses"

/// A session: lives at the start of the caller's arena (aligned), borrowing the rest of
/// the arena and the caller's model bytes. The `'static` lifetimes stand for the caller's
/// promise in keel.h: the model and the arena outlive every use of the handle.
/// `repr(C)`: the two marks are the first words, so checking a handle reads no further.
#[repr(C)]
pub struct KeelSession {
    magic: u64,
    /// The address of this struct, so a copy of the bytes elsewhere is not mistaken for a session.
    this: usize,
    engine: Engine<'static>,
    work: &'static mut [u8],
    text_cap: usize,
    has_logits: bool,
}

/// The session configuration both `keel_plan_size` and `keel_session_init` use.
fn config(n_ctx: u32, n_batch: u32) -> Result<SessionConfig, c_int> {
    if n_ctx == 0 || n_batch == 0 {
        return Err(KEEL_ERR_BAD_ARGUMENT);
    }
    let n_ctx = n_ctx as usize;
    Ok(SessionConfig { n_ctx, n_batch: (n_batch as usize).min(n_ctx), n_outputs: 1, n_threads: 1 })
}

/// The code for a keel-core error.
fn code(e: &Error) -> c_int {
    match e {
        Error::Gguf(_) | Error::Tokenizer(_) | Error::UnsupportedType { .. } => KEEL_ERR_BAD_MODEL,
        Error::Arena(_) => KEEL_ERR_ARENA_TOO_SMALL,
        Error::ContextFull { .. } => KEEL_ERR_CONTEXT_FULL,
        Error::BadToken { .. } => KEEL_ERR_BAD_TOKEN,
        Error::BadConfig(_) | Error::Plan(_) | Error::TooManyOutputs { .. } => KEEL_ERR_BAD_ARGUMENT,
        _ => KEEL_ERR_INTERNAL,
    }
}

/// Runs `f`, turning a panic into [`KEEL_ERR_INTERNAL`] so none crosses into C.
fn guarded(f: impl FnOnce() -> Result<(), c_int>) -> c_int {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => KEEL_OK,
        Ok(Err(c)) => c,
        Err(_) => KEEL_ERR_INTERNAL,
    }
}

/// The caller's `len` bytes at `ptr` (null only when `len` is 0).
///
/// # Safety
/// `ptr` is null or points to `len` readable bytes that stay valid and unmodified for `'a`.
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> Result<&'a [u8], c_int> {
    if ptr.is_null() {
        return Err(KEEL_ERR_NULL_POINTER);
    }
    if len > isize::MAX as usize {
        return Err(KEEL_ERR_BAD_ARGUMENT);
    }
    // SAFETY: non-null, and the caller promises `len` readable bytes for `'a`.
    Ok(unsafe { core::slice::from_raw_parts(ptr, len) })
}

/// Writes `v` through `out` if it is not null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, v: T) {
    if !out.is_null() {
        // SAFETY: non-null, and the caller promises it is valid for writes.
        unsafe { out.write(v) };
    }
}

/// Where the session, the tokenizer scratch and keel-core's arena go in an arena of
/// `len` bytes at address `base`: (offset of the session, scratch bytes, bytes needed).
fn layout(base: usize, core_bytes: usize, n_ctx: usize) -> Result<(usize, usize, usize), c_int> {
    let pad = base.next_multiple_of(align_of::<KeelSession>()) - base;
    let work = Tokenizer::work_bytes(KEEL_TEXT_BYTES_PER_CTX.saturating_mul(n_ctx));
    let need = [pad, size_of::<KeelSession>(), work, core_bytes].iter().try_fold(0usize, |a, &b| a.checked_add(b)).ok_or(KEEL_ERR_BAD_ARGUMENT)?;
    Ok((pad, work, need))
}

/// The worst-case arena bytes (any alignment of the arena's start).
fn plan_bytes(model: &[u8], cfg: &SessionConfig) -> Result<usize, c_int> {
    let g = Gguf::parse(model).map_err(|_| KEEL_ERR_BAD_MODEL)?;
    let p = plan(&g, cfg).map_err(|e| code(&e))?;
    let (_, _, need) = layout(0, p.total_bytes(), cfg.n_ctx)?;
    need.checked_add(align_of::<KeelSession>() - 1).ok_or(KEEL_ERR_BAD_ARGUMENT)
}

/// Writes the arena bytes a session over this model and context needs to `*out_size`.
///
/// # Safety
/// See keel.h: `model` points to `model_len` readable bytes; `out_size` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn keel_plan_size(model: *const u8, model_len: usize, n_ctx: u32, n_batch: u32, out_size: *mut usize) -> c_int {
    guarded(|| {
        if out_size.is_null() {
            return Err(KEEL_ERR_NULL_POINTER);
        }
        // SAFETY: the caller promises `model_len` readable bytes at `model` for this call.
        let m = unsafe { bytes(model, model_len)? };
        let n = plan_bytes(m, &config(n_ctx, n_batch)?)?;
        // SAFETY: checked non-null above; the caller promises it is writable.
        unsafe { put(out_size, n) };
        Ok(())
    })
}

/// Builds a session over the caller's model and arena; writes its handle to `*out_handle`.
///
/// # Safety
/// See keel.h: `model` (`model_len` bytes) and `arena` (`arena_len` writable bytes) stay
/// valid, and the arena untouched by the caller, for as long as the handle is used.
#[no_mangle]
pub unsafe extern "C" fn keel_session_init(
    model: *const u8,
    model_len: usize,
    arena: *mut c_void,
    arena_len: usize,
    n_ctx: u32,
    n_batch: u32,
    temperature: f32,
    seed: u64,
    out_handle: *mut *mut KeelSession,
) -> c_int {
    guarded(|| {
        if out_handle.is_null() || arena.is_null() {
            return Err(KEEL_ERR_NULL_POINTER);
        }
        // SAFETY: `out_handle` is non-null and the caller promises it is writable.
        unsafe { out_handle.write(core::ptr::null_mut()) };
        if arena_len > isize::MAX as usize {
            return Err(KEEL_ERR_BAD_ARGUMENT);
        }
        // SAFETY: the caller promises `model_len` bytes at `model` that outlive the handle
        // and are not modified while it is used (keel.h).
        let m: &'static [u8] = unsafe { bytes(model, model_len)? };
        let cfg = config(n_ctx, n_batch)?;
        let g = Gguf::parse(m).map_err(|_| KEEL_ERR_BAD_MODEL)?;
        let p = plan(&g, &cfg).map_err(|e| code(&e))?;
        let (pad, work_len, need) = layout(arena as usize, p.total_bytes(), cfg.n_ctx)?;
        if arena_len < need {
            return Err(KEEL_ERR_ARENA_TOO_SMALL);
        }
        // SAFETY: the caller gives `arena_len` writable bytes at `arena`, used by nothing
        // else while the handle lives (keel.h); the session's slot is cut off first, so the
        // slice below never overlaps it.
        let after: &'static mut [u8] = unsafe {
            let start = (arena as *mut u8).add(pad + size_of::<KeelSession>());
            core::slice::from_raw_parts_mut(start, arena_len - pad - size_of::<KeelSession>())
        };
        let (work, core_mem) = after.split_at_mut(work_len);
        let sampling = SamplerConfig { temp: temperature, seed, ..SamplerConfig::default() };
        let engine = Engine::new(&g, core_mem, cfg, Kernels::reference(), sampling).map_err(|e| code(&e))?;
        // SAFETY: `layout` aligned this address for `KeelSession` and left
        // `size_of::<KeelSession>()` bytes there, inside the arena and before `after`.
        let slot = unsafe { (arena as *mut u8).add(pad) as *mut KeelSession };
        let s = KeelSession { magic: MAGIC, this: slot as usize, engine, work, text_cap: KEEL_TEXT_BYTES_PER_CTX * cfg.n_ctx, has_logits: false };
        // SAFETY: `slot` is aligned, in bounds and not aliased (see above); the previous
        // contents are arena bytes with nothing to drop.
        unsafe { slot.write(s) };
        // SAFETY: `out_handle` was checked non-null and written above.
        unsafe { out_handle.write(slot) };
        Ok(())
    })
}

/// The live session behind `h`.
///
/// # Safety
/// `h` is null or a handle from `keel_session_init` whose arena is still valid (keel.h).
unsafe fn session<'a>(h: *mut KeelSession) -> Result<&'a mut KeelSession, c_int> {
    if h.is_null() {
        return Err(KEEL_ERR_NULL_POINTER);
    }
    if !(h as usize).is_multiple_of(align_of::<KeelSession>()) {
        return Err(KEEL_ERR_BAD_HANDLE);
    }
    // SAFETY: aligned and, per the caller's promise, pointing at readable memory: the
    // first two words (`repr(C)`) are plain integers, valid whatever the bytes are.
    let (magic, this) = unsafe { ((*h).magic, (*h).this) };
    if magic != MAGIC || this != h as usize {
        return Err(KEEL_ERR_BAD_HANDLE);
    }
    // SAFETY: the marks match, so `keel_session_init` wrote a session here, and the caller
    // does not use the handle from two threads at once (keel.h).
    Ok(unsafe { &mut *h })
}

/// Evaluates `n` tokens, appending them to the context.
///
/// # Safety
/// `handle` as in keel.h; `tokens` points to `n` readable `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn keel_eval(handle: *mut KeelSession, tokens: *const u32, n: usize) -> c_int {
    guarded(|| {
        // SAFETY: the caller's promise for `handle` (keel.h).
        let s = unsafe { session(handle)? };
        if tokens.is_null() {
            return Err(KEEL_ERR_NULL_POINTER);
        }
        if n == 0 || !tokens.is_aligned() || n > isize::MAX as usize / 4 {
            return Err(KEEL_ERR_BAD_ARGUMENT);
        }
        // SAFETY: non-null, aligned, and the caller promises `n` readable ids.
        let ids = unsafe { core::slice::from_raw_parts(tokens, n) };
        let n_vocab = s.engine.n_vocab();
        if ids.iter().any(|&t| t as usize >= n_vocab) {
            return Err(KEEL_ERR_BAD_TOKEN);
        }
        let (past, ctx) = (s.engine.session.n_past(), s.engine.session.n_ctx());
        if n > ctx - past.min(ctx) {
            return Err(KEEL_ERR_CONTEXT_FULL);
        }
        // A failed eval may leave the last logits row half written.
        s.has_logits = false;
        s.engine.eval(ids, Outputs::Last, &Sequential).map_err(|e| code(&e))?;
        s.has_logits = true;
        Ok(())
    })
}

/// Samples the next token from the last evaluation's logits into `*out_token`.
///
/// # Safety
/// `handle` as in keel.h; `out_token` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn keel_sample(handle: *mut KeelSession, out_token: *mut u32) -> c_int {
    guarded(|| {
        // SAFETY: the caller's promise for `handle` (keel.h).
        let s = unsafe { session(handle)? };
        if out_token.is_null() {
            return Err(KEEL_ERR_NULL_POINTER);
        }
        if !s.has_logits {
            return Err(KEEL_ERR_NO_LOGITS);
        }
        let t = s.engine.sample();
        // SAFETY: non-null, and the caller promises it is writable.
        unsafe { put(out_token, t) };
        Ok(())
    })
}

/// Writes 1 to `*out_is_eog` if `token` ends generation (EOS, EOT, ...), else 0.
///
/// # Safety
/// `handle` as in keel.h; `out_is_eog` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn keel_token_is_eog(handle: *mut KeelSession, token: u32, out_is_eog: *mut c_int) -> c_int {
    guarded(|| {
        // SAFETY: the caller's promise for `handle` (keel.h).
        let s = unsafe { session(handle)? };
        if out_is_eog.is_null() {
            return Err(KEEL_ERR_NULL_POINTER);
        }
        if token as usize >= s.engine.n_vocab() {
            return Err(KEEL_ERR_BAD_TOKEN);
        }
        // SAFETY: non-null, and the caller promises it is writable.
        unsafe { put(out_is_eog, s.engine.tokenizer.is_eog(token) as c_int) };
        Ok(())
    })
}

/// Writes a tokenizer call's count to `*out` (on [`KEEL_ERR_BUFFER_TOO_SMALL`], the
/// count needed) and turns its error into a code.
///
/// # Safety
/// `out` is null or valid for a write.
unsafe fn counted(out: *mut usize, r: Result<usize, TokenizerError>) -> Result<(), c_int> {
    let (n, status) = match r {
        Ok(n) => (n, Ok(())),
        Err(TokenizerError::OutOfSpace { needed, .. } | TokenizerError::BufferTooSmall { needed, .. }) => (needed, Err(KEEL_ERR_BUFFER_TOO_SMALL)),
        Err(TokenizerError::WorkTooSmall { .. }) => return Err(KEEL_ERR_TEXT_TOO_LONG),
        Err(TokenizerError::BadTokenId { .. }) => return Err(KEEL_ERR_BAD_TOKEN),
        Err(_) => return Err(KEEL_ERR_INTERNAL),
    };
    // SAFETY: the caller's promise.
    unsafe { put(out, n) };
    status
}

/// Tokenizes `len` UTF-8 bytes of `text` into `out_tokens` (`cap` ids); `*out_n` gets the
/// count, or on `KEEL_ERR_BUFFER_TOO_SMALL` the count needed.
///
/// # Safety
/// `handle` as in keel.h; `text` points to `len` readable bytes; `out_tokens` to `cap`
/// writable `uint32_t`; `out_n` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn keel_tokenize(handle: *mut KeelSession, text: *const c_char, len: usize, add_bos: c_int, out_tokens: *mut u32, cap: usize, out_n: *mut usize) -> c_int {
    guarded(|| {
        // SAFETY: the caller's promise for `handle` (keel.h).
        let s = unsafe { session(handle)? };
        if out_tokens.is_null() || out_n.is_null() {
            return Err(KEEL_ERR_NULL_POINTER);
        }
        if !out_tokens.is_aligned() || cap > isize::MAX as usize / 4 {
            return Err(KEEL_ERR_BAD_ARGUMENT);
        }
        // SAFETY: the caller promises `len` readable bytes at `text`.
        let raw = unsafe { bytes(text as *const u8, len)? };
        if raw.len() > s.text_cap {
            return Err(KEEL_ERR_TEXT_TOO_LONG);
        }
        let text = core::str::from_utf8(raw).map_err(|_| KEEL_ERR_INVALID_UTF8)?;
        // SAFETY: non-null, aligned, and the caller promises `cap` writable ids.
        let out = unsafe { core::slice::from_raw_parts_mut(out_tokens, cap) };
        let r = s.engine.tokenizer.tokenize(text, add_bos != 0, true, out, s.work);
        // SAFETY: checked non-null above; the caller promises it is writable.
        unsafe { counted(out_n, r) }
    })
}

/// Writes the bytes `token` stands for to `buf` (`cap` bytes, not NUL-terminated);
/// `*out_len` gets their count, or on `KEEL_ERR_BUFFER_TOO_SMALL` the count needed.
///
/// # Safety
/// `handle` as in keel.h; `buf` points to `cap` writable bytes; `out_len` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn keel_token_to_text(handle: *mut KeelSession, token: u32, buf: *mut c_char, cap: usize, out_len: *mut usize) -> c_int {
    guarded(|| {
        // SAFETY: the caller's promise for `handle` (keel.h).
        let s = unsafe { session(handle)? };
        if buf.is_null() || out_len.is_null() {
            return Err(KEEL_ERR_NULL_POINTER);
        }
        if cap > isize::MAX as usize {
            return Err(KEEL_ERR_BAD_ARGUMENT);
        }
        // SAFETY: non-null, and the caller promises `cap` writable bytes.
        let out = unsafe { core::slice::from_raw_parts_mut(buf as *mut u8, cap) };
        let r = s.engine.tokenizer.piece(token, true, out);
        // SAFETY: checked non-null above; the caller promises it is writable.
        unsafe { counted(out_len, r) }
    })
}

/// Starts a new sequence: empties the context and the sampler's history.
///
/// # Safety
/// `handle` as in keel.h.
#[no_mangle]
pub unsafe extern "C" fn keel_reset(handle: *mut KeelSession) -> c_int {
    guarded(|| {
        // SAFETY: the caller's promise for `handle` (keel.h).
        let s = unsafe { session(handle)? };
        s.engine.reset();
        s.has_logits = false;
        Ok(())
    })
}

/// A static, NUL-terminated English message for `code` (never null; unknown codes get
/// "unknown keel error code").
#[no_mangle]
pub extern "C" fn keel_error_message(code: c_int) -> *const c_char {
    ERRORS.iter().find(|e| e.0 == code).map_or(c"unknown keel error code", |e| e.2).as_ptr()
}

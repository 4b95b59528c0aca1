//! The C ABI called from Rust: greedy generation is repeatable across reset and arena
//! addresses, and damaged model bytes give a status code, never a panic or a crash.

use keel_ffi::*;
use std::ptr::null_mut;

fn model() -> Vec<u8> {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden/synth/synth-llama-q8_0.gguf");
    std::fs::read(p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

fn plan_size(m: &[u8], n_ctx: u32) -> Result<usize, i32> {
    let mut need = 0usize;
    // SAFETY: `m` is a live slice and `need` a live local.
    match unsafe { keel_plan_size(m.as_ptr(), m.len(), n_ctx, 16, &mut need) } {
        KEEL_OK => Ok(need),
        c => Err(c),
    }
}

/// Greedy ids for `prompt`: init over `arena[offset..]`, tokenize, `n` tokens.
fn greedy(m: &[u8], arena: &mut [u8], offset: usize, prompt: &str, n: usize) -> Vec<u32> {
    let mut h: *mut KeelSession = null_mut();
    let arena = &mut arena[offset..];
    // SAFETY: `m` and `arena` outlive every use of `h` below (all within this function).
    unsafe {
        assert_eq!(keel_session_init(m.as_ptr(), m.len(), arena.as_mut_ptr().cast(), arena.len(), 128, 16, 0.0, 0, &mut h), KEEL_OK);
        let mut out = Vec::new();
        for _ in 0..2 {
            let (mut ids, mut n_ids) = ([0u32; 64], 0usize);
            assert_eq!(keel_tokenize(h, prompt.as_ptr().cast(), prompt.len(), 1, ids.as_mut_ptr(), ids.len(), &mut n_ids), KEEL_OK);
            assert_eq!(keel_eval(h, ids.as_ptr(), n_ids), KEEL_OK);
            let mut gen = Vec::new();
            for _ in 0..n {
                let mut t = 0u32;
                assert_eq!(keel_sample(h, &mut t), KEEL_OK);
                gen.push(t);
                assert_eq!(keel_eval(h, &t, 1), KEEL_OK);
            }
            out.push(gen);
            assert_eq!(keel_reset(h), KEEL_OK);
        }
        assert_eq!(out[0], out[1], "the same prompt after keel_reset gave other tokens");
        out.pop().unwrap()
    }
}

#[test]
fn greedy_tokens_repeat_across_reset_and_arena_addresses() {
    let m = model();
    let need = plan_size(&m, 128).unwrap();
    let mut arena = vec![0u8; need + 64];
    let a = greedy(&m, &mut arena, 0, "Once upon a time", 8);
    for offset in [1, 3, 8, 17] {
        assert_eq!(greedy(&m, &mut arena, offset, "Once upon a time", 8), a, "arena at offset {offset}");
    }
    assert_eq!(a.len(), 8);
}

#[test]
fn damaged_models_give_codes() {
    let m = model();
    let need = plan_size(&m, 32).unwrap();
    let mut arena = vec![0u8; need];
    let mut check = |bytes: &[u8], what: &str| {
        let mut h: *mut KeelSession = null_mut();
        // SAFETY: `bytes` and `arena` are live for the call; a handle is not used after.
        let c = unsafe { keel_session_init(bytes.as_ptr(), bytes.len(), arena.as_mut_ptr().cast(), arena.len(), 32, 16, 0.0, 0, &mut h) };
        assert_ne!(c, KEEL_ERR_INTERNAL, "{what}: a panic inside keel");
        assert!(c == KEEL_OK || c == KEEL_ERR_BAD_MODEL || c == KEEL_ERR_ARENA_TOO_SMALL, "{what}: code {c}");
        if let Err(p) = plan_size(bytes, 32) {
            assert_eq!(p, c, "{what}: keel_plan_size and keel_session_init disagree");
        }
    };
    // Truncations through the header, then single-byte damage to the first 4 KiB
    // (the header and key/value section), deterministic positions and values.
    for cut in (0..m.len().min(8192)).step_by(61) {
        check(&m[..cut], &format!("truncated to {cut} bytes"));
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..300 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let (at, v) = ((x % 4096) as usize, (x >> 32) as u8);
        let mut bad = m.clone();
        bad[at] ^= v | 1;
        check(&bad, &format!("byte {at} xor {:#x}", v | 1));
    }
}

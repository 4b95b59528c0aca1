//! Byte-level BPE merges within one pre-tokenized word (llama.cpp's
//! `llm_tokenizer_bpe_session`).
//!
//! Owns: turning a word into ids. The word's bytes are mapped to GPT-2's byte
//! alphabet, split into one symbol per byte, and the adjacent pair whose merge
//! (`"left right"` in `tokenizer.ggml.merges`) has the lowest rank is merged first
//! (ties: leftmost), until no pair has a merge. Each final symbol is its token; a
//! symbol that is not in the vocabulary falls back to single-byte tokens (llama.cpp
//! looks up each byte of the mapped text and drops bytes with no token).

use super::error::LoopError;
use super::scratch::{Cand, Heap, Sink, Symbols, HEAP_BYTES, NONE, SYM_BYTES};
use super::unicode::{encode, utf8_len, BYTE_TO_CP};
use super::vocab::Index;

/// Scratch bytes a word of `m` bytes needs: mapped text (≤ 2 bytes a byte), symbols, heap.
pub(crate) const fn work_per_byte() -> usize {
    2 + SYM_BYTES + 3 * HEAP_BYTES
}

fn try_pair(idx: &Index<'_>, text: &[u8], syms: &Symbols<'_>, heap: &mut Heap<'_>, left: u32, right: u32) -> Result<(), LoopError> {
    if left == NONE || right == NONE {
        return Ok(());
    }
    let (l, r) = (syms.get(left), syms.get(right));
    let lt = &text[l.start as usize..(l.start + l.n) as usize];
    let rt = &text[r.start as usize..(r.start + r.n) as usize];
    if let Some(rank) = idx.merge_rank(lt, rt) {
        heap.push(Cand::by_rank(rank, left, l.n + r.n))?;
    }
    Ok(())
}

/// Tokenizes one word into `sink`. `ignore_merges`: a word that is a token as a
/// whole is that token (LLaMA 3 vocabularies).
pub(crate) fn word(idx: &Index<'_>, word: &[u8], ignore_merges: bool, scratch: &mut [u8], sink: &mut Sink<'_>) -> Result<(), LoopError> {
    let need = word.len() * work_per_byte();
    if scratch.len() < need {
        return Err(LoopError::WorkTooSmall { needed: need, got: scratch.len() });
    }
    let (mapped, rest) = scratch.split_at_mut(2 * word.len());
    let mut len = 0;
    for &b in word {
        let mut buf = [0u8; 4];
        let n = encode(BYTE_TO_CP[b as usize] as u32, &mut buf);
        mapped[len..len + n].copy_from_slice(&buf[..n]);
        len += n;
    }
    let text = &mapped[..len];
    if ignore_merges {
        if let Some(id) = idx.id(text) {
            sink.push(id);
            return Ok(());
        }
    }

    let (sym_mem, heap_mem) = rest.split_at_mut(SYM_BYTES * word.len());
    let mut syms = Symbols::new(sym_mem);
    let n = syms.init(text, utf8_len)?;
    let mut heap = Heap::new(heap_mem);
    for i in 1..n {
        try_pair(idx, text, &syms, &mut heap, i - 1, i)?;
    }
    while let Some(c) = heap.pop() {
        let left = c.left();
        let l = syms.get(left);
        if l.n == 0 || l.next == NONE {
            continue;
        }
        let r = syms.get(l.next);
        if l.n + r.n != c.size {
            continue; // stale: one side changed since this pair was queued
        }
        syms.merge(left, l.next);
        let l = syms.get(left);
        try_pair(idx, text, &syms, &mut heap, l.prev, left)?;
        try_pair(idx, text, &syms, &mut heap, left, l.next)?;
    }

    let mut i = if n > 0 { 0 } else { NONE };
    while i != NONE {
        let s = syms.get(i);
        let t = &text[s.start as usize..(s.start + s.n) as usize];
        match idx.id(t) {
            Some(id) => sink.push(id),
            None => {
                for b in t {
                    if let Some(id) = idx.id(core::slice::from_ref(b)) {
                        sink.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
    Ok(())
}

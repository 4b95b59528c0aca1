//! SentencePiece-style tokenization of one raw fragment (llama.cpp's
//! `llm_tokenizer_spm_session`, used for `tokenizer.ggml.model = llama`, e.g. Gemma).
//!
//! Owns: turning a fragment into ids. Spaces become `▁` (U+2581), with one `▁`
//! prepended when the caller asks (`add_space_prefix` after a special token or at
//! the start). The text is split into UTF-8 characters; the adjacent pair whose
//! concatenation is a token with the highest score is merged first (ties: leftmost),
//! until no pair forms a token. A final symbol that is not a token falls back to
//! byte tokens `<0xAB>` (or the single byte's own token).

use super::error::LoopError;
use super::scratch::{Cand, Heap, Sink, Symbols, HEAP_BYTES, NONE, SYM_BYTES};
use super::unicode::utf8_len;
use super::vocab::Index;
use crate::gguf::Array;

/// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's visible space.
pub(crate) const SPACE: &[u8] = "\u{2581}".as_bytes();

/// Scratch bytes per input byte (+1 for the prefix): escaped text (≤ 3), symbols, heap.
pub(crate) const fn work_per_byte() -> usize {
    3 + SYM_BYTES + 3 * HEAP_BYTES
}

/// Score of token `id` (llama.cpp reads f32 scores, or i32 ones cast to float; none = 0).
pub(crate) fn score(scores: Option<&Array<'_>>, id: u32) -> f32 {
    scores.and_then(|s| s.float(id as usize).or_else(|| s.int(id as usize).map(|v| v as f64))).unwrap_or(0.0) as f32
}

/// The byte-fallback token for `b`.
pub(crate) fn byte_token(idx: &Index<'_>, b: u8) -> Result<u32, LoopError> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let name = [b'<', b'0', b'x', HEX[(b >> 4) as usize], HEX[(b & 15) as usize], b'>'];
    idx.id(&name).or_else(|| idx.id(&[b])).ok_or(LoopError::NoByteToken(b))
}

struct Ctx<'x, 'a> {
    idx: &'x Index<'a>,
    scores: Option<&'x Array<'a>>,
    max_len: usize,
}

impl Ctx<'_, '_> {
    fn try_pair(&self, text: &[u8], syms: &Symbols<'_>, heap: &mut Heap<'_>, left: u32, right: u32) -> Result<(), LoopError> {
        if left == NONE || right == NONE {
            return Ok(());
        }
        let (l, r) = (syms.get(left), syms.get(right));
        let size = l.n + r.n;
        if size as usize > self.max_len {
            return Ok(()); // longer than any token
        }
        if let Some(id) = self.idx.id(&text[l.start as usize..(l.start + size) as usize]) {
            heap.push(Cand::by_score(score(self.scores, id), left, size))?;
        }
        Ok(())
    }
}

/// Tokenizes one raw fragment into `sink`.
pub(crate) fn fragment(
    idx: &Index<'_>,
    scores: Option<&Array<'_>>,
    max_len: usize,
    raw: &[u8],
    prefix_space: bool,
    scratch: &mut [u8],
    sink: &mut Sink<'_>,
) -> Result<(), LoopError> {
    let chars = raw.len() + 1;
    let need = chars * work_per_byte();
    if scratch.len() < need {
        return Err(LoopError::WorkTooSmall { needed: need, got: scratch.len() });
    }
    let (esc, rest) = scratch.split_at_mut(3 * chars);
    let mut len = 0;
    for &b in prefix_space.then_some(&b' ').into_iter().chain(raw) {
        if b == b' ' {
            esc[len..len + 3].copy_from_slice(SPACE);
            len += 3;
        } else {
            esc[len] = b;
            len += 1;
        }
    }
    let text = &esc[..len];

    let ctx = Ctx { idx, scores, max_len };
    let (sym_mem, heap_mem) = rest.split_at_mut(SYM_BYTES * chars);
    let mut syms = Symbols::new(sym_mem);
    let n = syms.init(text, utf8_len)?;
    let mut heap = Heap::new(heap_mem);
    for i in 1..n {
        ctx.try_pair(text, &syms, &mut heap, i - 1, i)?;
    }
    while let Some(c) = heap.pop() {
        let left = c.left();
        let l = syms.get(left);
        if l.n == 0 || l.next == NONE {
            continue;
        }
        let r = syms.get(l.next);
        if l.n + r.n != c.size {
            continue;
        }
        syms.merge(left, l.next);
        let l = syms.get(left);
        ctx.try_pair(text, &syms, &mut heap, l.prev, left)?;
        ctx.try_pair(text, &syms, &mut heap, left, l.next)?;
    }

    // Every merged symbol is a token (pairs are only queued when they are); an
    // unmerged character that is not one becomes byte tokens.
    let mut i = if n > 0 { 0 } else { NONE };
    while i != NONE {
        let s = syms.get(i);
        let t = &text[s.start as usize..(s.start + s.n) as usize];
        match idx.id(t) {
            Some(id) => sink.push(id),
            None => {
                for &b in t {
                    sink.push(byte_token(idx, b)?);
                }
            }
        }
        i = s.next;
    }
    Ok(())
}

//! Splitting special tokens out of raw text before tokenizing (llama.cpp's
//! `tokenizer_st_partition`).
//!
//! Owns: finding where special tokens occur. llama.cpp takes its special tokens
//! (CONTROL, USER_DEFINED and UNKNOWN ones; only USER_DEFINED ones when
//! `parse_special` is false) longest first and, for each, cuts every occurrence out
//! of the text that earlier tokens left, left to right. Here the same outcome comes
//! from one pass per distinct special-token length, longest first: each position
//! whose first one or two bytes can start a special token and whose span is still
//! unclaimed is looked up in the vocabulary. Claims are marked in a `u32` per text byte (0 raw,
//! `id + 1` at a token's first byte, `u32::MAX` inside it); a span is free iff both
//! its ends are, since every earlier claim is at least as long. Two different
//! special tokens of the same length that overlap resolve leftmost-first here, where
//! llama.cpp's order depends on its unstable sort. The LSTRIP/RSTRIP attributes
//! llama.cpp sets for a few model names (phi-3, jina, modern-bert) are not applied.

use super::error::LoopError;
use super::vocab::{get_u32, set_u32};
use super::{TokenAttr, Tokenizer};

/// A piece of the input: raw text to tokenize, or a special token found in it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Fragment<'t> {
    Text(&'t [u8]),
    Token(u32),
}

const INSIDE: u32 = u32::MAX;

fn has_bit(bits: &[u32; 8], b: u8) -> bool {
    bits[(b >> 5) as usize] & (1 << (b & 31)) != 0
}

impl Tokenizer<'_> {
    /// Marks special-token occurrences in `marks` (4 bytes per text byte). Returns
    /// false, leaving `marks` untouched, when no special token can occur.
    pub(crate) fn partition(&self, text: &[u8], parse_special: bool, marks: &mut [u8]) -> bool {
        let (first, pairs) = if parse_special { (&self.first_any, self.pair_any) } else { (&self.first_user, self.pair_user) };
        if !text.iter().any(|&b| has_bit(first, b)) {
            return false;
        }
        let marks = &mut marks[..4 * text.len()];
        marks.fill(0);
        let free = |m: &[u8], i: usize| get_u32(m, i) == 0;
        for len in (1..self.special_lens.len() * 8).rev() {
            if self.special_lens[len / 8] & (1 << (len % 8)) == 0 || len > text.len() {
                continue;
            }
            let mut p = 0;
            while p + len <= text.len() {
                let maybe = if len == 1 {
                    has_bit(first, text[p])
                } else {
                    let k = (text[p] as usize) << 8 | text[p + 1] as usize;
                    pairs[k / 8] & (1 << (k % 8)) != 0
                };
                if maybe && free(marks, p) && free(marks, p + len - 1) {
                    if let Some(id) = self.idx.id(&text[p..p + len]) {
                        let a = TokenAttr(self.attrs[id as usize]);
                        if a.is_special() && (parse_special || !a.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN)) {
                            set_u32(marks, p, id + 1);
                            for q in p + 1..p + len {
                                set_u32(marks, q, INSIDE);
                            }
                            p += len;
                            continue;
                        }
                    }
                }
                p += 1;
            }
        }
        true
    }
}

/// Calls `f` on each fragment of `text` in order (`marks` from `partition`, or
/// `None` for all raw text).
pub(crate) fn fragments<'t>(text: &'t [u8], marks: Option<&[u8]>, f: &mut dyn FnMut(Fragment<'t>) -> Result<(), LoopError>) -> Result<(), LoopError> {
    let Some(marks) = marks else {
        return if text.is_empty() { Ok(()) } else { f(Fragment::Text(text)) };
    };
    let mut p = 0;
    while p < text.len() {
        let m = get_u32(marks, p);
        let start = p;
        p += 1;
        if m == 0 {
            while p < text.len() && get_u32(marks, p) == 0 {
                p += 1;
            }
            f(Fragment::Text(&text[start..p]))?;
        } else {
            while p < text.len() && get_u32(marks, p) == INSIDE {
                p += 1;
            }
            f(Fragment::Token(m - 1))?;
        }
    }
    Ok(())
}

//! The vocabulary index: token text → id and merge pair → rank, in caller memory.
//!
//! Owns: the layout of the index region (`Layout`), building it from the GGUF
//! arrays once, and the lookups. Every table is a little-endian `u32` array stored
//! in `&[u8]` (no alignment needed, no `unsafe`): token `i`'s text offset into the
//! file, an open-addressing hash of token ids keyed by text, the merges' text
//! offsets and a hash of merge indices keyed by the merge string `"left right"`.
//! Texts stay in the file (zero-copy); a string's length is its GGUF `u64` prefix.
//! Does not know what tokens mean (attributes, specials: see `attrs`).

use super::error::TokenizerError;
use crate::gguf::Array;

/// Reads little-endian `u32` number `i` of `b`.
#[inline]
pub(crate) fn get_u32(b: &[u8], i: usize) -> u32 {
    let j = i * 4;
    u32::from_le_bytes([b[j], b[j + 1], b[j + 2], b[j + 3]])
}

/// Writes little-endian `u32` number `i` of `b`.
#[inline]
pub(crate) fn set_u32(b: &mut [u8], i: usize, v: u32) {
    b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
}

/// FNV-1a (64-bit), fed in pieces so a merge key hashes without being assembled.
#[derive(Clone, Copy)]
pub(crate) struct Fnv(u64);

impl Fnv {
    pub(crate) fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    #[inline]
    pub(crate) fn bytes(mut self, b: &[u8]) -> Self {
        for &c in b {
            self.0 = (self.0 ^ c as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self
    }

    #[inline]
    pub(crate) fn slot(self, mask: usize) -> usize {
        // Fold the high bits in: FNV's low bits alone are weak for short keys.
        ((self.0 ^ (self.0 >> 29)) as usize) & mask
    }
}

/// Sizes of the index regions, in the order they sit in memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub n_vocab: usize,
    pub vocab_slots: usize,
    pub n_merges: usize,
    pub merge_slots: usize,
    /// Bytes of the special-token length bitmap (bit `L` set: a special token is `L` bytes).
    pub len_bitmap: usize,
}

fn slots_for(n: usize) -> usize {
    if n == 0 { 0 } else { (2 * n).next_power_of_two() }
}

impl Layout {
    pub(crate) fn new(n_vocab: usize, n_merges: usize, max_token_len: usize) -> Layout {
        Layout { n_vocab, vocab_slots: slots_for(n_vocab), n_merges, merge_slots: slots_for(n_merges), len_bitmap: max_token_len / 8 + 1 }
    }

    /// Token offsets, vocab hash, attributes, merge offsets, merge hash, length bitmap.
    pub(crate) fn sizes(&self) -> [usize; 6] {
        [4 * self.n_vocab, 4 * self.vocab_slots, self.n_vocab, 4 * self.n_merges, 4 * self.merge_slots, self.len_bitmap]
    }

    pub(crate) fn total(&self) -> usize {
        self.sizes().iter().sum()
    }
}

/// The built lookup tables, borrowing the file and the index memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Index<'a> {
    file: &'a [u8],
    tok_off: &'a [u8],
    hash: &'a [u8],
    merge_off: &'a [u8],
    merge_hash: &'a [u8],
}

/// Offset of `s` (a slice of `file`) from the start of `file`, if it fits in `u32`.
fn offset_in(file: &[u8], s: &[u8]) -> Result<u32, TokenizerError> {
    let off = s.as_ptr() as usize - file.as_ptr() as usize;
    u32::try_from(off).map_err(|_| TokenizerError::TooLarge)
}

/// Text of the GGUF string whose bytes start at `off` (its `u64` length sits just before).
#[inline]
fn string_at(file: &[u8], off: usize) -> &[u8] {
    let p = &file[off - 8..off];
    let len = u64::from_le_bytes([p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]]) as usize;
    &file[off..off + len]
}

/// Fills `offs` with each string's offset and `hash` with the strings' indices.
/// `dup` decides what an identical second string does: `Err` to refuse, `Ok` to skip.
fn build_table(
    file: &[u8],
    arr: &Array<'_>,
    offs: &mut [u8],
    hash: &mut [u8],
    dup: fn(u32, u32) -> Result<(), TokenizerError>,
) -> Result<(), TokenizerError> {
    hash.fill(0);
    let mask = hash.len() / 4 - 1;
    let mut n = 0usize;
    for (i, s) in arr.strings().enumerate() {
        let off = offset_in(file, s)?;
        set_u32(offs, i, off);
        n += 1;
        if s.is_empty() {
            continue; // never looked up (llama.cpp renames empty tokens; nothing can match them)
        }
        let mut slot = Fnv::new().bytes(s).slot(mask);
        loop {
            match get_u32(hash, slot) {
                0 => {
                    set_u32(hash, slot, i as u32 + 1);
                    break;
                }
                v if string_at(file, get_u32(offs, v as usize - 1) as usize) == s => {
                    dup(v - 1, i as u32)?;
                    break;
                }
                _ => slot = (slot + 1) & mask,
            }
        }
    }
    if n != arr.len() {
        return Err(TokenizerError::BadVocab("string array ends early"));
    }
    Ok(())
}

/// The index memory cut into its regions (see [`Layout::sizes`]).
pub(crate) struct Regions<'a> {
    pub tok_off: &'a mut [u8],
    pub hash: &'a mut [u8],
    pub attrs: &'a mut [u8],
    pub merge_off: &'a mut [u8],
    pub merge_hash: &'a mut [u8],
    pub len_bitmap: &'a mut [u8],
}

impl Layout {
    /// Cuts `mem` (at least `total()` bytes) into the regions.
    pub(crate) fn split<'a>(&self, mem: &'a mut [u8]) -> Regions<'a> {
        let [a, b, c, d, e, f] = self.sizes();
        let (tok_off, rest) = mem.split_at_mut(a);
        let (hash, rest) = rest.split_at_mut(b);
        let (attrs, rest) = rest.split_at_mut(c);
        let (merge_off, rest) = rest.split_at_mut(d);
        let (merge_hash, rest) = rest.split_at_mut(e);
        let (len_bitmap, _) = rest.split_at_mut(f);
        Regions { tok_off, hash, attrs, merge_off, merge_hash, len_bitmap }
    }
}

impl<'a> Index<'a> {
    /// Builds the tables for `tokens` (and `merges`, if any) in the given regions.
    pub(crate) fn build(
        file: &'a [u8],
        tokens: &Array<'a>,
        merges: Option<&Array<'a>>,
        tok_off: &'a mut [u8],
        hash: &'a mut [u8],
        merge_off: &'a mut [u8],
        merge_hash: &'a mut [u8],
    ) -> Result<Index<'a>, TokenizerError> {
        build_table(file, tokens, tok_off, hash, |first, second| Err(TokenizerError::DuplicateToken { first, second }))?;
        if let Some(m) = merges {
            if !m.is_empty() {
                build_table(file, m, merge_off, merge_hash, |_, _| Ok(()))?;
            }
        }
        Ok(Index { file, tok_off, hash, merge_off, merge_hash })
    }

    /// Text of token `id` (`id` must be below the vocabulary size).
    #[inline]
    pub(crate) fn text(&self, id: u32) -> &'a [u8] {
        string_at(self.file, get_u32(self.tok_off, id as usize) as usize)
    }

    /// The token whose text is exactly `s`.
    pub(crate) fn id(&self, s: &[u8]) -> Option<u32> {
        if self.hash.is_empty() || s.is_empty() {
            return None;
        }
        let mask = self.hash.len() / 4 - 1;
        let mut slot = Fnv::new().bytes(s).slot(mask);
        loop {
            match get_u32(self.hash, slot) {
                0 => return None,
                v if self.text(v - 1) == s => return Some(v - 1),
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    /// Rank (index in `tokenizer.ggml.merges`) of merging `left` with `right`, split as
    /// llama.cpp splits a merge line: at the first space after its first byte.
    pub(crate) fn merge_rank(&self, left: &[u8], right: &[u8]) -> Option<u32> {
        if self.merge_hash.is_empty() || left.is_empty() || left[1..].contains(&b' ') {
            return None;
        }
        let mask = self.merge_hash.len() / 4 - 1;
        let mut slot = Fnv::new().bytes(left).bytes(b" ").bytes(right).slot(mask);
        let n = left.len() + 1 + right.len();
        loop {
            match get_u32(self.merge_hash, slot) {
                0 => return None,
                v => {
                    let m = string_at(self.file, get_u32(self.merge_off, v as usize - 1) as usize);
                    if m.len() == n && &m[..left.len()] == left && m[left.len()] == b' ' && &m[left.len() + 1..] == right {
                        return Some(v - 1);
                    }
                    slot = (slot + 1) & mask;
                }
            }
        }
    }
}

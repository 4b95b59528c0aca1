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
#[inline(always)]
pub(crate) fn get_u32(b: &[u8], i: usize) -> u32 {
    let j = i * 4;
    u32::from_le_bytes([b[j], b[j + 1], b[j + 2], b[j + 3]])
}

/// Writes little-endian `u32` number `i` of `b`.
#[inline(always)]
pub(crate) fn set_u32(b: &mut [u8], i: usize, v: u32) {
    b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
}

/// A string hash fed in pieces (so a merge key hashes without being assembled):
/// bytes gather into 64-bit words, each word is folded in with a multiply.
#[derive(Clone, Copy)]
pub(crate) struct Fnv {
    h: u64,
    acc: u64,
    k: u32,
}

impl Fnv {
    pub(crate) fn new() -> Self {
        Fnv { h: 0x243f_6a88_85a3_08d3, acc: 0, k: 0 }
    }

    #[inline(always)]
    fn word(h: u64, w: u64) -> u64 {
        (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29)
    }

    #[inline]
    pub(crate) fn bytes(mut self, b: &[u8]) -> Self {
        for &c in b {
            self.acc |= (c as u64) << (8 * self.k);
            self.k += 1;
            if self.k == 8 {
                self.h = Self::word(self.h, self.acc);
                self.acc = 0;
                self.k = 0;
            }
        }
        self
    }

    /// Final mix, including the length modulo 8 so "a\0" and "a" differ.
    #[inline]
    fn mixed(self) -> u64 {
        let h = Self::word(self.h, self.acc ^ ((self.k as u64) << 59));
        let h = h ^ (h >> 32);
        h.wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (h >> 29)
    }
}

/// Bytes of each special-token prefix filter: a bit per possible first two bytes.
pub(crate) const PAIR_FILTER_BYTES: usize = 65536 / 8;

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

    /// Token offsets, vocab hash, attributes, merge offsets, merge hash, special filters
    /// (length bitmap, then two first-two-bytes bitmaps: all specials, user-defined ones).
    pub(crate) fn sizes(&self) -> [usize; 6] {
        [4 * self.n_vocab, 4 * self.vocab_slots, self.n_vocab, 4 * self.n_merges, 4 * self.merge_slots, self.len_bitmap + 2 * PAIR_FILTER_BYTES]
    }

    pub(crate) fn total(&self) -> usize {
        self.sizes().iter().sum()
    }
}

/// The index memory cut into its regions (see [`Layout::sizes`]).
pub(crate) struct Regions<'a> {
    pub tok_off: &'a mut [u8],
    pub hash: &'a mut [u8],
    pub attrs: &'a mut [u8],
    pub merge_off: &'a mut [u8],
    pub merge_hash: &'a mut [u8],
    pub filters: &'a mut [u8],
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
        let (filters, _) = rest.split_at_mut(f);
        Regions { tok_off, hash, attrs, merge_off, merge_hash, filters }
    }
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

/// An open-addressing (linear probing) hash of GGUF strings. Slot = `tag << bits |
/// (index + 1)`, 0 = empty: `bits` holds any index + 1, the tag (hash bits) rules out
/// most mismatches without touching the string.
#[derive(Clone, Copy, Debug)]
struct Table<'a> {
    file: &'a [u8],
    offs: &'a [u8],
    slots: &'a [u8],
    bits: u32,
}

fn index_bits(n: usize) -> u32 {
    usize::BITS - n.leading_zeros()
}

impl<'a> Table<'a> {
    /// Probes for a string equal to the key hashed into `h` (`eq` compares).
    #[inline]
    fn find(&self, h: Fnv, eq: impl Fn(&[u8]) -> bool) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() / 4 - 1;
        let h = h.mixed();
        let tag = (h >> 40) as u32 & (u32::MAX >> self.bits);
        let mut slot = h as usize & mask;
        loop {
            let v = get_u32(self.slots, slot);
            if v == 0 {
                return None;
            }
            let index = v & ((1u32 << self.bits) - 1);
            if v >> self.bits == tag && eq(string_at(self.file, get_u32(self.offs, index as usize - 1) as usize)) {
                return Some(index - 1);
            }
            slot = (slot + 1) & mask;
        }
    }

    /// Fills `offs` with each string's offset and `slots` with the strings.
    /// `dup` decides what an identical second string does: `Err` to refuse, `Ok` to skip.
    fn build(
        file: &'a [u8],
        arr: &Array<'_>,
        offs: &'a mut [u8],
        slots: &'a mut [u8],
        dup: fn(u32, u32) -> Result<(), TokenizerError>,
    ) -> Result<Table<'a>, TokenizerError> {
        slots.fill(0);
        let bits = index_bits(arr.len());
        let mask = slots.len() / 4 - 1;
        let mut n = 0usize;
        for (i, s) in arr.strings().enumerate() {
            set_u32(offs, i, offset_in(file, s)?);
            n += 1;
            if s.is_empty() {
                continue; // never looked up (llama.cpp renames empty tokens; nothing can match them)
            }
            let h = Fnv::new().bytes(s).mixed();
            let tag = (h >> 40) as u32 & (u32::MAX >> bits);
            let mut slot = h as usize & mask;
            loop {
                let v = get_u32(slots, slot);
                if v == 0 {
                    set_u32(slots, slot, (tag << bits) | (i as u32 + 1));
                    break;
                }
                let index = v & ((1u32 << bits) - 1);
                if string_at(file, get_u32(offs, index as usize - 1) as usize) == s {
                    dup(index - 1, i as u32)?;
                    break;
                }
                slot = (slot + 1) & mask;
            }
        }
        if n != arr.len() {
            return Err(TokenizerError::BadVocab("string array ends early"));
        }
        Ok(Table { file, offs, slots, bits })
    }
}

/// The built lookup tables, borrowing the file and the index memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Index<'a> {
    tokens: Table<'a>,
    merges: Table<'a>,
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
        let tokens = Table::build(file, tokens, tok_off, hash, |first, second| Err(TokenizerError::DuplicateToken { first, second }))?;
        let merges = match merges {
            Some(m) if !m.is_empty() => Table::build(file, m, merge_off, merge_hash, |_, _| Ok(()))?,
            _ => Table { file, offs: merge_off, slots: &[], bits: 1 },
        };
        Ok(Index { tokens, merges })
    }

    /// Text of token `id` (`id` must be below the vocabulary size).
    #[inline]
    pub(crate) fn text(&self, id: u32) -> &'a [u8] {
        string_at(self.tokens.file, get_u32(self.tokens.offs, id as usize) as usize)
    }

    /// The token whose text is exactly `s`.
    #[inline]
    pub(crate) fn id(&self, s: &[u8]) -> Option<u32> {
        if s.is_empty() {
            return None;
        }
        self.tokens.find(Fnv::new().bytes(s), |t| t == s)
    }

    /// Rank (index in `tokenizer.ggml.merges`) of merging `left` with `right`, split as
    /// llama.cpp splits a merge line: at the first space after its first byte.
    pub(crate) fn merge_rank(&self, left: &[u8], right: &[u8]) -> Option<u32> {
        if left.is_empty() || left[1..].contains(&b' ') {
            return None;
        }
        let n = left.len() + 1 + right.len();
        let h = Fnv::new().bytes(left).bytes(b" ").bytes(right);
        self.merges.find(h, |m| m.len() == n && &m[..left.len()] == left && m[left.len()] == b' ' && &m[left.len() + 1..] == right)
    }
}

//! Scratch structures the merge loops build in the caller's work buffer.
//!
//! Owns: `Sink` (token output that keeps counting past a full buffer), `Symbols`
//! (a doubly linked list of byte spans, 16 bytes each) and `Heap` (a binary heap of
//! candidate merges, 12 bytes each). Both live in `&mut [u8]` as little-endian
//! words, so no allocation and no `unsafe`. Capacities follow from the text length:
//! a word of `m` symbols has at most `3m` heap pushes (`m - 1` initial pairs, two
//! per merge, at most `m - 1` merges).

use super::error::LoopError;
use super::vocab::{get_u32, set_u32};

/// Collects token ids; counts the ones that do not fit so the caller learns the total.
pub(crate) struct Sink<'o> {
    pub out: &'o mut [u32],
    pub n: usize,
}

impl Sink<'_> {
    #[inline]
    pub(crate) fn push(&mut self, id: u32) {
        if let Some(slot) = self.out.get_mut(self.n) {
            *slot = id;
        }
        self.n += 1;
    }
}

/// "No neighbour" in a symbol's links.
pub(crate) const NONE: u32 = u32::MAX;

/// A span `[start, start + n)` of the text being merged, linked to its neighbours.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sym {
    pub start: u32,
    pub n: u32,
    pub prev: u32,
    pub next: u32,
}

/// Bytes one symbol takes.
pub(crate) const SYM_BYTES: usize = 16;
/// Bytes one heap entry takes.
pub(crate) const HEAP_BYTES: usize = 12;

/// The symbol list, one record per initial character.
pub(crate) struct Symbols<'w> {
    b: &'w mut [u8],
}

impl<'w> Symbols<'w> {
    pub(crate) fn new(b: &'w mut [u8]) -> Self {
        Symbols { b }
    }

    #[inline(always)]
    pub(crate) fn get(&self, i: u32) -> Sym {
        let k = i as usize * 4;
        Sym { start: get_u32(self.b, k), n: get_u32(self.b, k + 1), prev: get_u32(self.b, k + 2), next: get_u32(self.b, k + 3) }
    }

    #[inline(always)]
    pub(crate) fn set(&mut self, i: u32, s: Sym) {
        let k = i as usize * 4;
        set_u32(self.b, k, s.start);
        set_u32(self.b, k + 1, s.n);
        set_u32(self.b, k + 2, s.prev);
        set_u32(self.b, k + 3, s.next);
    }

    /// Splits `text` into initial symbols of `char_len(first byte)` bytes each (capped
    /// at the end) and links them; returns the count.
    pub(crate) fn init(&mut self, text: &[u8], char_len: fn(u8) -> usize) -> Result<u32, LoopError> {
        let (mut off, mut i) = (0usize, 0u32);
        while off < text.len() {
            if (i as usize + 1) * SYM_BYTES > self.b.len() {
                return Err(LoopError::WorkTooSmall { needed: (i as usize + 1) * SYM_BYTES, got: self.b.len() });
            }
            let n = char_len(text[off]).min(text.len() - off);
            let next = if off + n == text.len() { NONE } else { i + 1 };
            self.set(i, Sym { start: off as u32, n: n as u32, prev: i.wrapping_sub(1), next });
            off += n;
            i += 1;
        }
        Ok(i)
    }

    /// Merges symbol `right` into `left` (its successor) and unlinks it.
    pub(crate) fn merge(&mut self, left: u32, right: u32) {
        let mut l = self.get(left);
        let mut r = self.get(right);
        l.n += r.n;
        l.next = r.next;
        r.n = 0;
        self.set(left, l);
        self.set(right, r);
        if l.next != NONE {
            let mut nx = self.get(l.next);
            nx.prev = left;
            self.set(l.next, nx);
        }
    }
}

/// A candidate merge of symbol `left` with its successor; valid while the two spans
/// still total `size` bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cand {
    /// Pops lowest first: `priority << 32 | left` (leftmost wins ties).
    pub key: u64,
    pub size: u32,
}

impl Cand {
    /// BPE: lowest merge rank first, then leftmost (llama.cpp's BPE queue).
    #[inline]
    pub(crate) fn by_rank(rank: u32, left: u32, size: u32) -> Cand {
        Cand { key: (rank as u64) << 32 | left as u64, size }
    }

    /// SentencePiece: highest score first, then leftmost (llama.cpp's SPM queue). The
    /// score's bits are mapped so that unsigned order is descending float order.
    #[inline]
    pub(crate) fn by_score(score: f32, left: u32, size: u32) -> Cand {
        let b = score.to_bits();
        let ascending = if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 };
        Cand { key: ((!ascending) as u64) << 32 | left as u64, size }
    }

    /// The left symbol.
    #[inline]
    pub(crate) fn left(&self) -> u32 {
        self.key as u32
    }
}

/// A binary min-heap of candidates.
pub(crate) struct Heap<'w> {
    b: &'w mut [u8],
    len: usize,
}

impl<'w> Heap<'w> {
    pub(crate) fn new(b: &'w mut [u8]) -> Self {
        Heap { b, len: 0 }
    }

    #[inline(always)]
    fn key(&self, i: usize) -> u64 {
        (get_u32(self.b, 3 * i) as u64) << 32 | get_u32(self.b, 3 * i + 1) as u64
    }

    #[inline(always)]
    fn get(&self, i: usize) -> Cand {
        Cand { key: self.key(i), size: get_u32(self.b, 3 * i + 2) }
    }

    #[inline(always)]
    fn put(&mut self, i: usize, c: Cand) {
        set_u32(self.b, 3 * i, (c.key >> 32) as u32);
        set_u32(self.b, 3 * i + 1, c.key as u32);
        set_u32(self.b, 3 * i + 2, c.size);
    }

    pub(crate) fn push(&mut self, c: Cand) -> Result<(), LoopError> {
        if (self.len + 1) * HEAP_BYTES > self.b.len() {
            return Err(LoopError::WorkTooSmall { needed: (self.len + 1) * HEAP_BYTES, got: self.b.len() });
        }
        let mut i = self.len;
        self.len += 1;
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.key(parent) <= c.key {
                break;
            }
            let p = self.get(parent);
            self.put(i, p);
            i = parent;
        }
        self.put(i, c);
        Ok(())
    }

    pub(crate) fn pop(&mut self) -> Option<Cand> {
        if self.len == 0 {
            return None;
        }
        let top = self.get(0);
        self.len -= 1;
        if self.len > 0 {
            let last = self.get(self.len);
            let mut i = 0;
            loop {
                let (l, r) = (2 * i + 1, 2 * i + 2);
                if l >= self.len {
                    break;
                }
                let child = if r < self.len && self.key(r) < self.key(l) { r } else { l };
                if self.key(child) >= last.key {
                    break;
                }
                let cc = self.get(child);
                self.put(i, cc);
                i = child;
            }
            self.put(i, last);
        }
        Some(top)
    }
}

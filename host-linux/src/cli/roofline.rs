//! The memory-bandwidth bound of token generation (`keel bench --roofline`).
//!
//! Decoding one token reads every matrix weight once (the layers' projections and the
//! output projection), one embedding row, the norm vectors, and the KV cache rows of
//! every position seen so far; with nothing else in cache, no CPU can generate tokens
//! faster than `read bandwidth ÷ bytes read per token`. keel measures the bandwidth
//! itself (threads summing disjoint slices of a buffer far larger than the caches, best
//! of several passes), so the bound and the tg figure come from the same machine, the
//! same thread count and the same moment.

use keel_core::model::{Mixer, Model};
use keel_core::placement::for_each_weight;
use std::time::Instant;

/// Buffer the bandwidth is measured over: far beyond any last-level cache of the
/// machines keel targets (and of this one).
const BUF_BYTES: usize = 512 << 20;

/// Passes over the buffer; the fastest counts (the others warm pages and clocks).
const PASSES: usize = 5;

/// Sustained read bandwidth in bytes/s with `threads` threads, each summing its own
/// contiguous slice of one buffer (so reads are sequential streams, as a matrix-vector
/// product's weight reads are).
pub fn read_bandwidth(threads: usize) -> f64 {
    let threads = threads.max(1);
    // Distinct non-zero contents so no page is a shared zero page.
    let buf: Vec<u64> = (0..BUF_BYTES / 8).map(|i| i as u64 ^ 0x9e37_79b9_7f4a_7c15).collect();
    let chunk = buf.len().div_ceil(threads);
    let mut best = 0.0f64;
    let mut check = 0u64;
    for _ in 0..PASSES {
        let t = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = buf.chunks(chunk).map(|part| s.spawn(move || sum_words(part))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        let secs = t.elapsed().as_secs_f64();
        check = check.wrapping_add(sums.iter().fold(0u64, |a, &b| a.wrapping_add(b)));
        best = best.max(BUF_BYTES as f64 / secs);
    }
    // The sums are used, so the reads cannot be optimised away.
    std::hint::black_box(check);
    best
}

/// Wrapping sum of `words` in 8 independent lanes (vectorizes to full-width loads).
fn sum_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut it = words.chunks_exact(8);
    for c in &mut it {
        for (a, &w) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(w);
        }
    }
    let tail = it.remainder().iter().fold(0u64, |a, &w| a.wrapping_add(w));
    acc.iter().fold(tail, |a, &w| a.wrapping_add(w))
}

/// Bytes one generated token reads, split by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TokenBytes {
    /// Matrix weights (every projection of every layer, and the output projection).
    pub weights: u64,
    /// One embedding row, the norm vectors.
    pub small: u64,
    /// KV cache rows read by attention, averaged over the positions of a run.
    pub kv: u64,
}

impl TokenBytes {
    /// All of it.
    pub fn total(&self) -> u64 {
        self.weights + self.small + self.kv
    }
}

/// Bytes read per generated token by `model`, averaged over generating tokens
/// `first_pos ..first_pos + n` (attention reads every cached position, or the window
/// on sliding-window layers; keel's cache holds K and V as f16).
pub fn bytes_per_token(model: &Model<'_>, first_pos: usize, n: usize) -> TokenBytes {
    let hp = &model.hp;
    let mut weights = 0u64;
    for_each_weight(model, |_, t| weights += t.data.len() as u64);
    let mut small = model.tok_embd.row_bytes() as u64 + model.output_norm.data.len() as u64;
    for layer in model.layers {
        let post = layer.attn_post_norm.map_or(0, |t| t.data.len()) + layer.ffn_post_norm.map_or(0, |t| t.data.len());
        small += (layer.attn_norm.data.len() + layer.ffn_norm.data.len() + post) as u64;
    }
    let kv_row = (hp.k_dim() + hp.v_dim()) as u64 * 2;
    let mut kv_total = 0u64;
    for pos in first_pos..first_pos + n.max(1) {
        for (l, layer) in model.layers.iter().enumerate() {
            if !matches!(layer.mixer, Mixer::Attention(_)) {
                continue;
            }
            let seen = pos as u64 + 1;
            let seen = if hp.is_swa(l) { seen.min(hp.n_swa as u64) } else { seen };
            kv_total += seen * kv_row;
        }
    }
    TokenBytes { weights, small, kv: kv_total / n.max(1) as u64 }
}

#[cfg(test)]
mod tests {
    use super::sum_words;

    #[test]
    fn sum_words_sums_every_word_including_the_tail() {
        let w: Vec<u64> = (1..=21).collect();
        assert_eq!(sum_words(&w), 21 * 22 / 2);
        assert_eq!(sum_words(&[]), 0);
        assert_eq!(sum_words(&[u64::MAX, 2]), 1);
    }
}

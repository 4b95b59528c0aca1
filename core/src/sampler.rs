//! Choosing the next token from logits: greedy, or llama.cpp's default chain (repetition
//! penalty, top-k, top-p, min-p, temperature, then a seeded random draw).
//!
//! Owns the candidate buffer (an arena region of `n_vocab` entries), the recent-token
//! history and the random number generator. Deterministic for a given seed.

/// Sampling settings (defaults are llama.cpp's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Temperature; `<= 0` means greedy.
    pub temp: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely (0 = none).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this (1 = off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at (at most [`MAX_HISTORY`]).
    pub repeat_last_n: usize,
    /// Random seed.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig { temp: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, repeat_penalty: 1.0, repeat_last_n: 64, seed: 0 }
    }
}

/// Most recent tokens the sampler remembers.
pub const MAX_HISTORY: usize = 256;

/// One candidate token.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Candidate {
    /// Token id.
    pub id: u32,
    /// Logit (after penalty and temperature).
    pub logit: f32,
    /// Probability (after softmax over the kept candidates).
    pub p: f32,
}

/// Bytes of the candidate buffer for a vocabulary of `n_vocab`.
pub fn candidates_bytes(n_vocab: usize) -> usize {
    n_vocab * core::mem::size_of::<Candidate>()
}

/// xoshiro256** seeded through splitmix64: small, fast, the same on every target.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The index of the largest value; the lowest index among equal maxima (as llama.cpp's
/// greedy sampler). NaN never wins.
///
/// Two passes instead of one scan's compare-and-select chain of values and indices: the
/// largest value by `>` (32 interleaved lanes, each `if v > m { v } else { m }`: vector
/// maxima side by side, NaN never taken), then the first index holding a value equal to
/// it (`==`, so either zero matches the other, as `>` leaves the first of them in one
/// scan). That is the one scan's index: the first position of the largest value. Where
/// nothing beats -inf (empty, all -inf or NaN) the scan keeps index 0, and so does this.
/// Over Gemma 3's 262,144 logits (`keel bench --roofline`'s sampling time, one thread, the
/// Xeon VM): ~74 µs a token for eight lanes each keeping its index, ~30 for 16 lanes of
/// this, ~26 for 32.
pub fn argmax(logits: &[f32]) -> u32 {
    const L: usize = 32;
    let mut m = [f32::NEG_INFINITY; L];
    let mut chunks = logits.chunks_exact(L);
    for chunk in &mut chunks {
        for j in 0..L {
            m[j] = if chunk[j] > m[j] { chunk[j] } else { m[j] };
        }
    }
    for (j, &v) in chunks.remainder().iter().enumerate() {
        m[j] = if v > m[j] { v } else { m[j] };
    }
    let best = m.iter().fold(f32::NEG_INFINITY, |b, &v| if v > b { v } else { b });
    if !(best > f32::NEG_INFINITY) {
        return 0;
    }
    // The first chunk holding the value (no early exit inside a chunk: one compare per
    // lane, or-ed), then its position there.
    let mut base = 0;
    for chunk in logits.chunks(4 * L) {
        if chunk.iter().fold(false, |hit, &v| hit | (v == best)) {
            let i = chunk.iter().position(|&v| v == best).unwrap_or(0);
            return (base + i) as u32;
        }
        base += chunk.len();
    }
    0
}

/// A sampler: settings, history and random state, plus the candidate buffer.
pub struct Sampler<'a> {
    cfg: SamplerConfig,
    rng: Rng,
    history: heapless::HistoryBuffer<u32, MAX_HISTORY>,
    cands: &'a mut [Candidate],
}

impl<'a> Sampler<'a> {
    /// A sampler using `cands` (at least `n_vocab` entries) as its work buffer.
    pub fn new(cfg: SamplerConfig, cands: &'a mut [Candidate]) -> Self {
        Sampler { cfg, rng: Rng::new(cfg.seed), history: heapless::HistoryBuffer::new(), cands }
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Replaces the settings for a new sequence: the history is forgotten and the random
    /// state reseeded from `cfg.seed` (a server's slot takes each request's settings).
    pub fn set_config(&mut self, cfg: SamplerConfig) {
        self.cfg = cfg;
        self.reset();
    }

    /// Records a token as part of the context (prompt or generated).
    pub fn accept(&mut self, token: u32) {
        self.history.write(token);
    }

    /// Forgets the history and reseeds.
    pub fn reset(&mut self) {
        self.history.clear();
        self.rng = Rng::new(self.cfg.seed);
    }

    /// Picks the next token from one row of logits (not modified).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let n = logits.len().min(self.cands.len());
        let penalty = self.cfg.repeat_penalty;
        let penalize = penalty != 1.0 && self.cfg.repeat_last_n > 0;
        if self.cfg.temp <= 0.0 && !penalize {
            return argmax(&logits[..n]);
        }
        let cands = &mut self.cands[..n];
        for (i, c) in cands.iter_mut().enumerate() {
            *c = Candidate { id: i as u32, logit: logits[i], p: 0.0 };
        }
        if penalize {
            let last_n = self.cfg.repeat_last_n.min(MAX_HISTORY).min(self.history.len());
            let recent = self.history.oldest_ordered().skip(self.history.len() - last_n);
            for (k, &t) in recent.clone().enumerate() {
                // Penalize each distinct token once.
                if recent.clone().take(k).any(|&u| u == t) || t as usize >= n {
                    continue;
                }
                let l = &mut cands[t as usize].logit;
                *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
            }
        }
        if self.cfg.temp <= 0.0 {
            let mut best = 0;
            for (i, c) in cands.iter().enumerate() {
                if c.logit > cands[best].logit {
                    best = i;
                }
            }
            return cands[best].id;
        }
        let keep = shape(&self.cfg, cands);
        let cands = &cands[..keep];
        let r = self.rng.next_f64() as f32;
        let mut cum = 0.0f32;
        for c in cands.iter() {
            cum += c.p;
            if r < cum {
                return c.id;
            }
        }
        cands[cands.len() - 1].id
    }
}

/// The sampling chain after the penalty: top-k, top-p, min-p and temperature (`temp > 0`)
/// applied to `cands` (each token's logit, any order). The kept candidates end up first,
/// sorted by descending logit, with their probabilities in `p`; returns how many.
pub fn shape(cfg: &SamplerConfig, cands: &mut [Candidate]) -> usize {
    let by_logit_desc = |a: &Candidate, b: &Candidate| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id));
    let mut len = cands.len();
    if cfg.top_k > 0 && cfg.top_k < len {
        cands.select_nth_unstable_by(cfg.top_k - 1, by_logit_desc);
        len = cfg.top_k;
    }
    let cands = &mut cands[..len];
    cands.sort_unstable_by(by_logit_desc);
    softmax(cands);
    let mut keep = cands.len();
    if cfg.top_p < 1.0 {
        let mut cum = 0.0f32;
        for (i, c) in cands.iter().enumerate() {
            cum += c.p;
            if cum >= cfg.top_p {
                keep = i + 1;
                break;
            }
        }
    }
    if cfg.min_p > 0.0 {
        let floor = cands[0].p * cfg.min_p;
        keep = keep.min(cands.iter().take_while(|c| c.p >= floor).count().max(1));
    }
    let keep = keep.max(1);
    let cands = &mut cands[..keep];
    for c in cands.iter_mut() {
        c.logit /= cfg.temp;
    }
    softmax(cands);
    keep
}

/// Softmax of the candidates' logits into `p` (sorted descending, so [0] is the max).
fn softmax(cands: &mut [Candidate]) {
    let max = cands.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for c in cands.iter_mut() {
        c.p = libm::expf(c.logit - max);
        sum += c.p;
    }
    for c in cands.iter_mut() {
        c.p /= sum;
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn greedy_takes_lowest_index_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
        // Nothing beats -inf: index 0, whatever comes after.
        let (nan, ninf) = (f32::NAN, f32::NEG_INFINITY);
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[nan, ninf]), 0);
        assert_eq!(argmax(&[nan; 70]), 0);
        let mut row = [nan; 70];
        row[67] = ninf;
        assert_eq!(argmax(&row), 0);
        // Against the one-pass loop: every length to 40 and long rows, ties, signed
        // zeros, infinities, NaN, all -inf or all NaN.
        let one_pass = |l: &[f32]| {
            let (mut best, mut best_v) = (0usize, f32::NEG_INFINITY);
            for (i, &v) in l.iter().enumerate() {
                if v > best_v {
                    (best, best_v) = (i, v);
                }
            }
            best as u32
        };
        let mut rng = Rng::new(7);
        for round in 0..4000 {
            // Every length to 140 (past the 16- and 64-element chunks' edges) and long rows.
            let len = if round % 50 == 0 { 1000 + (rng.next_u64() % 300) as usize } else { round % 141 };
            let pick = [0.0, -0.0, 1.0, 2.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
            let kinds = 1 + (round % 8) as u64;
            let l: std::vec::Vec<f32> = (0..len).map(|_| pick[(rng.next_u64() % kinds) as usize]).collect();
            assert_eq!(argmax(&l), one_pass(&l), "{l:?}");
        }
        // Vocabulary-sized rows of distinct-looking values, the maximum planted once or
        // more (anywhere, the last position included), with NaN among them.
        for round in 0..40 {
            let len = 262_144 - (round % 7) as usize * 13;
            let mut l: std::vec::Vec<f32> = (0..len).map(|_| (rng.next_f64() * 40.0 - 20.0) as f32).collect();
            for _ in 0..(round % 4) {
                l[(rng.next_u64() % len as u64) as usize] = f32::NAN;
            }
            for _ in 0..1 + round % 3 {
                let at = if round % 5 == 0 { len - 1 } else { (rng.next_u64() % len as u64) as usize };
                l[at] = 25.0;
            }
            assert_eq!(argmax(&l), one_pass(&l), "round {round}");
        }
    }

    #[test]
    fn seeded_sampling_is_deterministic_and_respects_top_k() {
        let logits = [0.0f32, 1.0, 2.0, 3.0, 2.5, -1.0];
        let cfg = SamplerConfig { temp: 1.0, top_k: 2, top_p: 1.0, min_p: 0.0, seed: 42, ..Default::default() };
        let mut b1 = [Candidate::default(); 6];
        let mut b2 = [Candidate::default(); 6];
        let mut s1 = Sampler::new(cfg, &mut b1);
        let mut s2 = Sampler::new(cfg, &mut b2);
        let mut seen = [0usize; 6];
        for _ in 0..200 {
            let a = s1.sample(&logits);
            assert_eq!(a, s2.sample(&logits));
            seen[a as usize] += 1;
        }
        assert_eq!(seen[0] + seen[1] + seen[2] + seen[5], 0, "only the top 2 may be drawn: {seen:?}");
        assert!(seen[3] > seen[4] && seen[4] > 0);
    }

    #[test]
    fn repetition_penalty_changes_greedy_choice() {
        let logits = [1.0f32, 2.0, 1.9];
        let cfg = SamplerConfig { temp: 0.0, repeat_penalty: 1.5, ..Default::default() };
        let mut b = [Candidate::default(); 3];
        let mut s = Sampler::new(cfg, &mut b);
        assert_eq!(s.sample(&logits), 1);
        s.accept(1);
        assert_eq!(s.sample(&logits), 2);
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        let logits = [10.0f32, 0.0, 0.0, 0.0];
        let cfg = SamplerConfig { temp: 1.0, top_k: 0, top_p: 0.5, min_p: 0.0, seed: 1, ..Default::default() };
        let mut b = [Candidate::default(); 4];
        let mut s = Sampler::new(cfg, &mut b);
        for _ in 0..50 {
            assert_eq!(s.sample(&logits), 0);
        }
    }
}

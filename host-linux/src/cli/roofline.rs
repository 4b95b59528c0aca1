//! The memory-bandwidth bound of token generation (`keel bench --roofline`).
//!
//! Decoding one token reads every matrix weight once (the layers' projections and the
//! output projection), one embedding row, the norm vectors, and the KV cache rows of
//! every position seen so far; with nothing else in cache, no CPU can generate tokens
//! faster than `read bandwidth ÷ bytes read per token`. (Where a model is only a few
//! times the last-level cache, part of it can still be cached when the next token reads
//! it, and decode can pass the figure: on the 2-vCPU Zen 4 VM, 32 MiB of L3 beside
//! SmolLM2's 91 MB a token, by up to ~14% at two threads; BENCHMARKS.md.) keel
//! measures the bandwidth itself (threads summing disjoint slices of a buffer far larger than the caches, best
//! of several passes taken before, between and after the tg repetitions), so the bound
//! and the tg figure come from the same machine, the same thread count and the same
//! minutes.

use keel_core::model::{Mixer, Model};
use keel_core::placement::for_each_weight;
use std::time::Instant;

/// Buffer the bandwidth is measured over: far beyond any last-level cache of the
/// machines keel targets (and of this one).
const BUF_BYTES: usize = 512 << 20;

/// The fewest passes of each read loop a bound is the fastest of (`keel bench` takes them
/// around the tg repetitions).
pub const PASSES: usize = 5;

/// The machine's sustained read bandwidth, as a [`ReadProbe::pass`] measured it.
#[derive(Clone, Copy, Debug)]
pub struct Bandwidth {
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// The read loop that reached it (`portable`, `avx2`, `avx2 3 streams`, `avx512`, `avx512+prefetch`).
    pub read_loop: &'static str,
}

/// A read loop: the wrapping sum of a slice of words.
type ReadLoop = fn(&[u64]) -> u64;

/// The read loops this CPU can run. A bound must not be lower than what the memory
/// system delivers: on the 2-core AVX-512 development VM the portable loop (128-bit
/// loads at the baseline target) streams 11.4 GB/s on one thread where 512-bit loads
/// stream 14.6 (BENCHMARKS.md, "the roofline's read loop understated the bound"), so every loop the CPU has
/// is measured and the fastest counts.
fn read_loops() -> Vec<(&'static str, ReadLoop)> {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut loops: Vec<(&'static str, ReadLoop)> = vec![("portable", sum_words)];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            loops.push(("avx2", x86::sum_words_avx2));
            loops.push(("avx2 3 streams", x86::sum_words_avx2_streams));
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            loops.push(("avx512", x86::sum_words_avx512));
            loops.push(("avx512+prefetch", x86::sum_words_avx512_prefetch));
        }
    }
    loops
}

/// The buffer the read loops stream, allocated and written once so that passes can be
/// taken between a benchmark's runs ([`ReadProbe::pass`]): on a shared VM the memory
/// bandwidth moves from minute to minute (one core read 22-41 GB/s within an hour on
/// the Zen 4 VM), so a bound measured only before or after the runs can sit in another
/// minute than the runs it bounds (BENCHMARKS.md: tg at 99-110% of such a bound).
pub struct ReadProbe {
    /// In huge pages where the kernel has them, as `keel` holds model weights by default
    /// (`ModelFile::load`): with 4 KiB pages the loops stream 8-10% slower on the Xeon
    /// VM (a TLB miss every 4 KiB), and the bound must not be lower than what the memory
    /// delivers. (A plain vector if the map is refused.)
    map: Option<crate::mmap::HugeMap>,
    vec: Vec<u64>,
    threads: usize,
    loops: Vec<(&'static str, ReadLoop)>,
}

impl ReadProbe {
    /// The buffer for `threads` threads, every page written (distinct non-zero contents,
    /// so no page is a shared zero page and no pass meets a first-touch fault).
    pub fn new(threads: usize) -> Self {
        let mut p = Self { map: crate::mmap::HugeMap::new(BUF_BYTES).ok(), vec: Vec::new(), threads: threads.max(1), loops: read_loops() };
        if p.map.is_none() {
            p.vec.resize(BUF_BYTES / 8, 0u64);
        }
        let words: &mut [u64] = match p.map.as_mut() {
            // SAFETY: any bytes are valid u64s; the map is 2 MiB-aligned, so the middle is all.
            Some(m) => unsafe { m.as_mut_slice().align_to_mut::<u64>().1 },
            None => &mut p.vec,
        };
        for (i, w) in words.iter_mut().enumerate() {
            *w = i as u64 ^ 0x9e37_79b9_7f4a_7c15;
        }
        p
    }

    fn words(&self) -> &[u64] {
        match &self.map {
            // SAFETY: as in `new`.
            Some(m) => unsafe { m.as_slice().align_to::<u64>().1 },
            None => &self.vec,
        }
    }

    /// One pass of every read loop the CPU has, the threads each summing their own
    /// contiguous slice (sequential streams, as a matrix-vector product's weight reads
    /// are): the fastest loop's bandwidth.
    pub fn pass(&self) -> Bandwidth {
        let buf = self.words();
        let chunk = buf.len().div_ceil(self.threads);
        let mut best = Bandwidth { bytes_per_s: 0.0, read_loop: self.loops[0].0 };
        let mut check = 0u64;
        for &(name, f) in &self.loops {
            let t = Instant::now();
            let sums: Vec<u64> = std::thread::scope(|s| {
                let handles: Vec<_> = buf.chunks(chunk).map(|part| s.spawn(move || f(part))).collect();
                handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
            });
            let rate = BUF_BYTES as f64 / t.elapsed().as_secs_f64();
            check = check.wrapping_add(sums.iter().fold(0u64, |a, &b| a.wrapping_add(b)));
            if rate > best.bytes_per_s {
                best = Bandwidth { bytes_per_s: rate, read_loop: name };
            }
        }
        // The sums are used, so the reads cannot be optimised away.
        std::hint::black_box(check);
        best
    }
}

/// The fastest of `passes` (`None` for none).
pub fn fastest(passes: &[Bandwidth]) -> Option<Bandwidth> {
    passes.iter().copied().max_by(|a, b| a.bytes_per_s.total_cmp(&b.bytes_per_s))
}


/// Wrapping sum of `words` in 8 independent lanes (vectorizes to the baseline target's
/// loads: 128-bit on x86_64 and aarch64).
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

/// [`sum_words`] with 256- and 512-bit loads (four accumulators each), for CPUs that
/// have them.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    /// [`super::sum_words`] with AVX2 loads; called only where `avx2` was detected.
    pub(super) fn sum_words_avx2(words: &[u64]) -> u64 {
        assert!(std::arch::is_x86_feature_detected!("avx2"));
        // SAFETY: AVX2 is present (checked above).
        unsafe { avx2(words) }
    }

    /// [`super::sum_words`] over three streams at once: the slice in three equal parts,
    /// [`STREAM_CHUNK`] bytes of each in turn, each line asked for [`STREAMS_AHEAD`] bytes
    /// ahead in its own stream (the rest after the parts, plainly). On the AMD EPYC Zen 3
    /// one core often reads more this way than with one stream (0.94-1.26x, by the minute) (BENCHMARKS.md, "Speed
    /// II on the AMD EPYC Zen 3, seventh session"), and a decoder can read
    /// its weights so: a bound must not be lower than that.
    pub(super) fn sum_words_avx2_streams(words: &[u64]) -> u64 {
        assert!(std::arch::is_x86_feature_detected!("avx2"));
        // SAFETY: AVX2 is present (checked above).
        unsafe { avx2_streams(words) }
    }

    /// Bytes [`sum_words_avx2_streams`] reads of one stream before the next.
    const STREAM_CHUNK: usize = 512;
    /// How far ahead in its stream [`sum_words_avx2_streams`] asks for each line.
    const STREAMS_AHEAD: usize = 1024;

    #[target_feature(enable = "avx2")]
    unsafe fn avx2_streams(words: &[u64]) -> u64 {
        const STREAMS: usize = 3;
        let chunk = STREAM_CHUNK / 8;
        let part = words.len() / STREAMS / chunk * chunk;
        let mut acc = [_mm256_setzero_si256(); 4];
        for o in (0..part).step_by(chunk) {
            for s in 0..STREAMS {
                let c = &words[s * part + o..s * part + o + chunk];
                for step in c.chunks_exact(16) {
                    // SAFETY: a prefetch hint never faults, so it may point past the slice.
                    _mm_prefetch::<_MM_HINT_T0>(step.as_ptr().wrapping_add(STREAMS_AHEAD / 8).cast());
                    _mm_prefetch::<_MM_HINT_T0>(step.as_ptr().wrapping_add(STREAMS_AHEAD / 8 + 8).cast());
                    for (j, a) in acc.iter_mut().enumerate() {
                        // SAFETY: step holds 16 words; words 4j..4j + 4 are in it (unaligned load).
                        *a = _mm256_add_epi64(*a, unsafe { _mm256_loadu_si256(step.as_ptr().add(4 * j).cast()) });
                    }
                }
            }
        }
        let s = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
        let mut lanes = [0u64; 4];
        // SAFETY: lanes has room for 4 words (unaligned store).
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), s) };
        lanes.iter().chain(&words[STREAMS * part..]).fold(0u64, |a, &w| a.wrapping_add(w))
    }

    /// [`super::sum_words`] with AVX-512 loads; called only where `avx512f` was detected.
    pub(super) fn sum_words_avx512(words: &[u64]) -> u64 {
        assert!(std::arch::is_x86_feature_detected!("avx512f"));
        // SAFETY: AVX-512F is present (checked above).
        unsafe { avx512::<false>(words) }
    }

    /// [`sum_words_avx512`] with a software prefetch of each line [`PREFETCH_AHEAD`]
    /// bytes ahead (into L1), as the rows16 kernels on Intel CPUs do: on the Xeon VM
    /// (whose hardware prefetchers do not carry a stream alone) it is the fastest loop in
    /// about half the passes (12.6-13.0 GB/s on one thread against 12.6-12.8 without),
    /// and a bound must not be lower than what a loop can stream.
    pub(super) fn sum_words_avx512_prefetch(words: &[u64]) -> u64 {
        assert!(std::arch::is_x86_feature_detected!("avx512f"));
        // SAFETY: AVX-512F is present (checked above).
        unsafe { avx512::<true>(words) }
    }

    /// How far ahead [`sum_words_avx512_prefetch`] asks for lines (8 and 16 KiB were
    /// fastest alike on the Xeon VM; 2 and 4 KiB less often).
    const PREFETCH_AHEAD: usize = 8192;

    #[target_feature(enable = "avx2")]
    unsafe fn avx2(words: &[u64]) -> u64 {
        let mut acc = [_mm256_setzero_si256(); 4];
        let mut it = words.chunks_exact(16);
        for c in &mut it {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: c holds 16 words; words 4j..4j + 4 are in it (unaligned load).
                *a = _mm256_add_epi64(*a, unsafe { _mm256_loadu_si256(c.as_ptr().add(4 * j).cast()) });
            }
        }
        let s = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
        let mut lanes = [0u64; 4];
        // SAFETY: lanes has room for 4 words (unaligned store).
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), s) };
        lanes.iter().chain(it.remainder()).fold(0u64, |a, &w| a.wrapping_add(w))
    }

    /// The AVX-512 loop; with `PF` a hint for each line [`PREFETCH_AHEAD`] bytes ahead.
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512<const PF: bool>(words: &[u64]) -> u64 {
        let mut acc = [_mm512_setzero_si512(); 4];
        let mut it = words.chunks_exact(32);
        for c in &mut it {
            for (j, a) in acc.iter_mut().enumerate() {
                if PF {
                    // SAFETY: a prefetch hint never faults, so it may point past the slice.
                    _mm_prefetch::<_MM_HINT_T0>(c.as_ptr().wrapping_add(8 * j + PREFETCH_AHEAD / 8).cast());
                }
                // SAFETY: c holds 32 words; words 8j..8j + 8 are in it (unaligned load).
                *a = _mm512_add_epi64(*a, unsafe { _mm512_loadu_si512(c.as_ptr().add(8 * j).cast()) });
            }
        }
        let s = _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3]));
        let mut lanes = [0u64; 8];
        // SAFETY: lanes has room for 8 words (unaligned store).
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), s) };
        lanes.iter().chain(it.remainder()).fold(0u64, |a, &w| a.wrapping_add(w))
    }
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
    for_each_weight(model, |_, t| weights += t.size_bytes() as u64);
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
    use super::{read_loops, sum_words};

    #[test]
    fn sum_words_sums_every_word_including_the_tail() {
        let w: Vec<u64> = (1..=21).collect();
        assert_eq!(sum_words(&w), 21 * 22 / 2);
        assert_eq!(sum_words(&[]), 0);
        assert_eq!(sum_words(&[u64::MAX, 2]), 1);
    }

    /// Every read loop this CPU has reads every word (each length up to past two of the
    /// widest loop's steps, so the vector body, the tail and both together are checked).
    #[test]
    fn every_read_loop_sums_every_word() {
        let loops = read_loops();
        assert_eq!(loops[0].0, "portable");
        #[cfg(target_arch = "x86_64")]
        for name in ["avx2", "avx2 3 streams"] {
            assert_eq!(loops.iter().any(|l| l.0 == name), std::arch::is_x86_feature_detected!("avx2"), "{name}");
        }
        #[cfg(target_arch = "x86_64")]
        for name in ["avx512", "avx512+prefetch"] {
            assert_eq!(loops.iter().any(|l| l.0 == name), std::arch::is_x86_feature_detected!("avx512f"), "{name}");
        }
        // (Up to past two of the three-stream loop's rounds of chunks: 3·64 words a round.)
        for n in (0..=70u64).chain([191, 192, 193, 383, 384, 385, 400, 577]) {
            let w: Vec<u64> = (1..=n).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
            let want = w.iter().fold(0u64, |a, &b| a.wrapping_add(b));
            for (name, f) in &loops {
                assert_eq!(f(&w), want, "{name}, {n} words");
            }
        }
    }

    /// Each read loop this CPU has, on the probe's buffer (huge pages where the kernel has
    /// them) at one thread and at two, in rounds side by side: each loop's median GB/s and
    /// its ratio to the plain `avx2` loop (the three-stream loop's margin, BENCHMARKS.md,
    /// "Speed II on the AMD EPYC Zen 3, seventh session"). A tool, not a test:
    /// `cargo test -p keel-host-linux --release --lib bench_read_loops -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn bench_read_loops() {
        let loops = super::read_loops();
        for threads in [1usize, 2] {
            let probe = super::ReadProbe::new(threads);
            let buf = probe.words();
            let chunk = buf.len().div_ceil(threads);
            let mut rates = vec![Vec::new(); loops.len()];
            for _ in 0..7 {
                for (r, (_, f)) in rates.iter_mut().zip(&loops) {
                    let t = std::time::Instant::now();
                    let sums: Vec<u64> = std::thread::scope(|s| {
                        let hs: Vec<_> = buf.chunks(chunk).map(|part| s.spawn(move || f(part))).collect();
                        hs.into_iter().map(|h| h.join().unwrap_or(0)).collect()
                    });
                    r.push(std::mem::size_of_val(buf) as f64 / t.elapsed().as_secs_f64() / 1e9);
                    std::hint::black_box(sums);
                }
            }
            let med: Vec<f64> = rates.iter_mut().map(|r| {
                r.sort_by(|a, b| a.total_cmp(b));
                r[r.len() / 2]
            }).collect();
            let base = loops.iter().position(|l| l.0 == "avx2").map_or(med[0], |i| med[i]);
            let line: Vec<String> = loops.iter().zip(&med).map(|(l, m)| format!("{} {m:.2} GB/s ({:.2}x)", l.0, m / base)).collect();
            println!("{threads} thread(s), medians of 7 rounds: {}", line.join("; "));
        }
    }

    /// Two threads reading a token's worth of weights (90 MiB, as SmolLM2's) in four
    /// patterns, round after round in the same seconds, each as a fraction of the first:
    /// `contig` (each thread its half in one run: `--roofline`'s read pass); `halves` (150
    /// jobs a token, each job's bytes in halves, one per thread, the threads meeting
    /// after each: how decode reads one product after another); `runs` (the same jobs
    /// and meetings, each thread's shares one after another: each thread one run);
    /// `halves, far` (as `halves`, the threads' bytes 256 MiB apart). A tool for the
    /// layout of decode's weights, not a test (BENCHMARKS.md, "One stream per thread"):
    /// `cargo test -p keel-host-linux --release --lib bench_read_jobs -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn bench_read_jobs() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let loop_ = *super::read_loops().last().unwrap();
        let probe = super::ReadProbe::new(2);
        let buf = probe.words();
        let (jobs, token, cycles, tokens) = (150usize, (90usize << 20) / 8, 60, 5);
        let job = token / jobs / 64 * 64;
        let token = job * jobs;
        // The word ranges thread `t` reads in job `j` of token `k`, by pattern.
        let at = |p: usize, k: usize, t: usize, j: usize| -> std::ops::Range<usize> {
            let base = (k % 5) * token;
            let s = match p {
                1 => base + j * job + t * job / 2,
                2 => base + t * token / 2 + j * job / 2,
                _ => t * (buf.len() / 2) + (k % 2) * token + j * job,
            };
            s..s + job / 2
        };
        let met = AtomicUsize::new(0);
        let wait = |n: &mut usize| {
            *n += 1;
            met.fetch_add(1, Ordering::AcqRel);
            while met.load(Ordering::Acquire) < 2 * *n {
                std::hint::spin_loop();
            }
        };
        let times = std::sync::Mutex::new(vec![[0f64; 4]; cycles]);
        std::thread::scope(|s| {
            for t in 0..2 {
                let (times, wait) = (&times, &wait);
                s.spawn(move || {
                    let (mut n, mut sum) = (0usize, 0u64);
                    for c in 0..cycles {
                        for p in 0..4 {
                            wait(&mut n);
                            let t0 = std::time::Instant::now();
                            for k in 0..tokens {
                                if p == 0 {
                                    sum = sum.wrapping_add(loop_.1(&buf[(k % 5) * token + t * token / 2..][..token / 2]));
                                    continue;
                                }
                                for j in 0..jobs {
                                    sum = sum.wrapping_add(loop_.1(&buf[at(p, k, t, j)]));
                                    wait(&mut n);
                                }
                            }
                            wait(&mut n);
                            if t == 0 {
                                times.lock().unwrap()[c][p] = t0.elapsed().as_secs_f64();
                            }
                        }
                    }
                    std::hint::black_box(sum);
                });
            }
        });
        let gb = (tokens * token * 8) as f64 / 1e9;
        let rates: Vec<[f64; 4]> = times.into_inner().unwrap().iter().map(|r| r.map(|t| gb / t)).collect();
        let names = ["contig", "halves", "runs", "halves, far"];
        println!("{} loop, 2 threads, {cycles} rounds of {tokens} tokens of {} MiB, {jobs} jobs a token", loop_.0, token * 8 >> 20);
        let contig: Vec<f64> = rates.iter().map(|r| r[0]).collect();
        let fast = { let mut c = contig.clone(); c.sort_by(f64::total_cmp); c[c.len() / 2] };
        for (what, keep) in [("every round", &(|_: f64| true) as &dyn Fn(f64) -> bool), ("rounds where contig read more than its median", &|c: f64| c > fast)] {
            let set: Vec<&[f64; 4]> = rates.iter().filter(|r| keep(r[0])).collect();
            let mut line = format!("{what} ({} rounds; contig median {:.1} GB/s):", set.len(), { let mut c: Vec<f64> = set.iter().map(|r| r[0]).collect(); c.sort_by(f64::total_cmp); c[c.len() / 2] });
            for p in 1..4 {
                let mut r: Vec<f64> = set.iter().map(|r| r[p] / r[0]).collect();
                r.sort_by(f64::total_cmp);
                line += &format!(" {} {:.3}", names[p], r[r.len() / 2]);
            }
            println!("{line}");
        }
    }
}

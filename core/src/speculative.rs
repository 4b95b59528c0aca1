//! Speculative decoding that never changes the answer.
//!
//! A drafter ([`Drafter`]: a smaller model with the same vocabulary, [`ModelDrafter`], or
//! prompt lookup, [`Lookup`]) proposes up to `n_max` tokens; the target evaluates its
//! pending token and all of them in one batch ([`Outputs::All`]) and keeps the longest
//! prefix it agrees with plus one token of its own. Because keel's logits do not depend
//! on batching, greedy output is token for token the output without speculation. At
//! temperature > 0 the standard rejection rule (accept a draft `d` with probability
//! `min(1, p(d)/q(d))`, else draw from `max(0, p - q)` renormalised) keeps the output
//! distributed as the target's sampling distribution `p` (after top-k, top-p, min-p and
//! temperature).
//!
//! Rejected tokens are rolled back in place: the KV cache by rewinding the session's
//! length, the recurrent (delta-net) state of a hybrid model by restoring the checkpoint
//! taken before the batch and evaluating the accepted tokens again
//! ([`crate::session::Session::rewind`]). An adaptive draft length stops drafting while
//! recent acceptance makes it a loss.
//!
//! Owns: the token history, the drafted tokens' distributions and one target
//! distribution, all arena regions planned by [`plan`]. Never allocates.

use crate::arena::{Carver, Plan};
use crate::error::Error;
use crate::model::Model;
use crate::parallel::Parallel;
use crate::placement::Exec;
use crate::sampler::{argmax, candidates_bytes, shape, Candidate, Rng, SamplerConfig};
use crate::session::{Outputs, Session};

/// A model the speculator drives: a session with its weights and where its products run.
pub trait Lm {
    /// Vocabulary size.
    fn n_vocab(&self) -> usize;
    /// Appends `tokens` to the context and computes logits for `outputs`.
    fn eval(&mut self, tokens: &[u32], outputs: Outputs) -> Result<(), Error>;
    /// The logits rows of the last `eval`, `n_vocab` each.
    fn logits(&self) -> &[f32];
    /// Tokens in the context.
    fn n_past(&self) -> usize;
    /// The session's limits.
    fn limits(&self) -> crate::session::SessionConfig;
    /// See [`Session::checkpoint`].
    fn checkpoint(&mut self) -> Result<(), Error>;
    /// See [`Session::rewind`].
    fn rewind(&mut self, n: usize) -> Result<usize, Error>;
}

/// A model and its session as an [`Lm`], with an optional device placement.
pub struct Runner<'r, 'm, 'a, 'p, 'd> {
    /// The weights.
    pub model: &'r Model<'m>,
    /// The sequence state.
    pub session: &'r mut Session<'a>,
    /// Where CPU tasks run.
    pub par: &'r dyn Parallel,
    /// Where products run (`None`: all on the CPU).
    pub exec: Option<Exec<'p, 'd>>,
}

impl Lm for Runner<'_, '_, '_, '_, '_> {
    fn n_vocab(&self) -> usize {
        self.model.hp.n_vocab
    }
    fn eval(&mut self, tokens: &[u32], outputs: Outputs) -> Result<(), Error> {
        self.session.eval_on(self.model, tokens, outputs, self.par, self.exec.as_mut())
    }
    fn logits(&self) -> &[f32] {
        self.session.logits(self.model.hp.n_vocab)
    }
    fn n_past(&self) -> usize {
        self.session.n_past()
    }
    fn limits(&self) -> crate::session::SessionConfig {
        self.session.config()
    }
    fn checkpoint(&mut self) -> Result<(), Error> {
        // Verification compares a batch's logits with what one token at a time would give.
        if !self.session.batch_invariant() {
            return Err(Error::BadConfig("speculative decoding needs batch-invariant logits: turn off llama.cpp batches and the chunked delta net"));
        }
        self.session.checkpoint()
    }
    fn rewind(&mut self, n: usize) -> Result<usize, Error> {
        self.session.rewind(n)
    }
}

/// Rewinds `lm` to the first `n` tokens of `hist` (which it has evaluated), evaluating
/// again what a recurrent model's checkpoint makes it repeat.
pub fn rewind_to(lm: &mut dyn Lm, hist: &[u32], n: usize) -> Result<(), Error> {
    let c = lm.rewind(n)?;
    if c < n {
        lm.eval(&hist[c..n], Outputs::Last)?;
    }
    Ok(())
}

/// Turning logits into the sampling distribution and drawing from it: the target's
/// sampling settings, a candidate buffer and the random state.
pub struct Chooser<'a> {
    cfg: SamplerConfig,
    cands: &'a mut [Candidate],
    rng: Rng,
}

impl Chooser<'_> {
    /// Greedy (temperature <= 0): every choice is the argmax.
    pub fn greedy(&self) -> bool {
        self.cfg.temp <= 0.0
    }

    /// The sampling distribution of one logits row, dense over the vocabulary, into `out`
    /// (the same chain as [`crate::sampler::Sampler::sample`]: top-k, top-p, min-p,
    /// temperature).
    pub fn dist(&mut self, logits: &[f32], out: &mut [f32]) {
        let n = logits.len().min(self.cands.len()).min(out.len());
        let cands = &mut self.cands[..n];
        for (i, c) in cands.iter_mut().enumerate() {
            *c = Candidate { id: i as u32, logit: logits[i], p: 0.0 };
        }
        let keep = shape(&self.cfg, cands);
        out.fill(0.0);
        for c in &cands[..keep] {
            out[c.id as usize] = c.p;
        }
    }

    /// A token drawn from `dist` (weights, need not sum to 1; all zero draws the argmax).
    pub fn draw(&mut self, dist: &[f32]) -> u32 {
        let total: f64 = dist.iter().map(|&p| p as f64).sum();
        if total <= 0.0 {
            return argmax(dist);
        }
        let r = self.rng.next_f64() * total;
        let (mut cum, mut last) = (0.0f64, 0usize);
        for (i, &p) in dist.iter().enumerate() {
            if p > 0.0 {
                cum += p as f64;
                last = i;
                if r < cum {
                    return i as u32;
                }
            }
        }
        last as u32
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// One choice from a logits row: the argmax when greedy, else a draw whose
    /// distribution is written to `dist`.
    pub fn choose(&mut self, logits: &[f32], dist: &mut [f32]) -> u32 {
        if self.greedy() {
            argmax(logits)
        } else {
            self.dist(logits, dist);
            self.draw(dist)
        }
    }
}

/// Proposes tokens for the target to verify.
pub trait Drafter {
    /// Proposes up to `out.len()` tokens to follow `hist` (the whole sequence so far) into
    /// `out`, returning how many. Unless `ch` is greedy, each proposal is drawn from a
    /// distribution written to `q` (`n_vocab` values per proposal, in order).
    fn draft(&mut self, hist: &[u32], out: &mut [u32], q: &mut [f32], ch: &mut Chooser<'_>) -> Result<usize, Error>;
    /// After verification: the sequence is now `hist`, whose `kept` tokens before the
    /// last one are the first `kept` proposals of the last `draft` (which saw
    /// `hist.len() - kept - 1` tokens).
    fn sync(&mut self, hist: &[u32], kept: usize) -> Result<(), Error>;
    /// A fresh sequence is starting with `prompt` (all but whose last token the target
    /// has evaluated).
    fn start(&mut self, prompt: &[u32]) -> Result<(), Error>;
}

/// A smaller model with the same vocabulary as the drafter.
pub struct ModelDrafter<L: Lm> {
    /// The draft model.
    pub lm: L,
    /// The history length its last draft saw.
    seen: usize,
}

impl<L: Lm> ModelDrafter<L> {
    /// Drafts with `lm` (its session must be fresh or will be started over).
    pub fn new(lm: L) -> Self {
        ModelDrafter { lm, seen: 0 }
    }
}

impl<L: Lm> Drafter for ModelDrafter<L> {
    fn draft(&mut self, hist: &[u32], out: &mut [u32], q: &mut [f32], ch: &mut Chooser<'_>) -> Result<usize, Error> {
        let n = hist.len();
        let lim = self.lm.limits();
        // The draft evaluates hist and all but its last proposal.
        if n > lim.n_ctx || self.lm.n_past() >= n {
            return Ok(0);
        }
        let k = out.len().min(lim.n_ctx + 1 - n);
        if k == 0 {
            return Ok(0);
        }
        let v = self.lm.n_vocab();
        self.lm.eval(&hist[self.lm.n_past()..], Outputs::Last)?;
        self.lm.checkpoint()?;
        self.seen = n;
        for j in 0..k {
            let row = self.lm.logits();
            let row = &row[row.len() - v..];
            out[j] = ch.choose(row, &mut q[j * v..(j + 1) * v]);
            if j + 1 < k {
                self.lm.eval(&out[j..j + 1], Outputs::Last)?;
            }
        }
        Ok(k)
    }

    fn sync(&mut self, hist: &[u32], kept: usize) -> Result<(), Error> {
        let keep = (self.seen + kept).min(self.lm.n_past());
        if keep < self.lm.n_past() {
            rewind_to(&mut self.lm, hist, keep)?;
        }
        Ok(())
    }

    fn start(&mut self, prompt: &[u32]) -> Result<(), Error> {
        self.lm.rewind(0).or_else(|_| Err(Error::BadConfig("the draft session cannot start over")))?;
        self.seen = 0;
        if prompt.len() > 1 && prompt.len() - 1 <= self.lm.limits().n_ctx {
            self.lm.eval(&prompt[..prompt.len() - 1], Outputs::Last)?;
        }
        Ok(())
    }
}

/// Prompt-lookup drafting: the tokens that followed the earlier occurrence of the
/// sequence's end that matches the most of it (at least `ngram_min` tokens, compared up
/// to `ngram_max`; of equally long matches the latest). No second model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// The most tokens of the sequence's end compared (longer matches count as this long).
    pub ngram_max: usize,
    /// The fewest matching tokens for a proposal.
    pub ngram_min: usize,
}

impl Default for Lookup {
    fn default() -> Self {
        // Matching the longest suffix (not just the last 2 or 3 tokens) picks, of the
        // several places a short n-gram occurs in code, the one being copied; 3 tokens at
        // least keeps prose's chance 2-grams ("of the") from drafting (BENCHMARKS.md).
        Lookup { ngram_max: 64, ngram_min: 3 }
    }
}

impl Lookup {
    /// The proposals for `hist`: where in `hist` the continuation starts and how long it
    /// is (at most `max`, at least 1).
    pub fn find(&self, hist: &[u32], max: usize) -> Option<(usize, usize)> {
        let n = hist.len();
        let min = self.ngram_min.max(1);
        let cap = self.ngram_max.max(min);
        if n <= min || max == 0 {
            return None;
        }
        let last = hist[n - 1];
        let (mut best, mut best_len) = (0usize, 0usize);
        // A continuation starting at `from` follows a match ending at `from - 1`; the latest
        // first, so a longer match must beat it strictly.
        for from in (min..n).rev() {
            if hist[from - 1] != last {
                continue;
            }
            let len = hist[..from].iter().rev().zip(hist.iter().rev()).take(cap).take_while(|(a, b)| a == b).count();
            if len >= min && len > best_len {
                (best, best_len) = (from, len);
                if len == cap {
                    break;
                }
            }
        }
        (best_len > 0).then(|| (best, (n - best).min(max)))
    }
}

impl Drafter for Lookup {
    fn draft(&mut self, hist: &[u32], out: &mut [u32], q: &mut [f32], ch: &mut Chooser<'_>) -> Result<usize, Error> {
        let Some((from, k)) = self.find(hist, out.len()) else { return Ok(0) };
        out[..k].copy_from_slice(&hist[from..from + k]);
        if !ch.greedy() {
            // A deterministic proposal: its distribution is all on the token.
            let v = q.len() / out.len().max(1);
            for (j, &t) in out[..k].iter().enumerate() {
                let row = &mut q[j * v..(j + 1) * v];
                row.fill(0.0);
                row[t as usize] = 1.0;
            }
        }
        Ok(k)
    }
    fn sync(&mut self, _hist: &[u32], _kept: usize) -> Result<(), Error> {
        Ok(())
    }
    fn start(&mut self, _prompt: &[u32]) -> Result<(), Error> {
        Ok(())
    }
}

/// Speculation settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecConfig {
    /// Most tokens drafted per step.
    pub n_max: usize,
    /// Choose the draft length from recent acceptance (never more than `n_max`; 0 while
    /// drafting would be a loss, with an occasional one-token probe).
    pub adaptive: bool,
    /// The cost of one draft token relative to one target forward pass (a draft model:
    /// about its size over the target's; lookup: about 0).
    pub draft_cost: f32,
    /// The extra cost of a verify batch (two or more tokens) over a one-token forward
    /// pass, relative to it, besides `verify_cost` per draft.
    pub verify_base: f32,
    /// The extra cost of one more token in the target's verify batch, relative to a
    /// one-token forward pass (well below 1 where decode is memory-bound).
    pub verify_cost: f32,
}

impl Default for SpecConfig {
    fn default() -> Self {
        // Measured for SmolLM2-135M Q8_0 on 2 threads of a Xeon (BENCHMARKS.md): a batch of
        // k + 1 tokens costs about 1.35 + 0.22 k one-token passes.
        SpecConfig { n_max: 8, adaptive: true, draft_cost: 0.0, verify_base: 0.35, verify_cost: 0.22 }
    }
}

/// What speculation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Verify batches (target forward passes after the prompt).
    pub steps: u64,
    /// Steps that verified at least one drafted token.
    pub draft_steps: u64,
    /// Tokens drafted and verified.
    pub drafted: u64,
    /// Drafted tokens the target accepted.
    pub accepted: u64,
    /// Tokens generated (accepted drafts plus the target's own).
    pub generated: u64,
}

impl Stats {
    /// Accepted over drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
    /// Mean drafted tokens accepted per step that drafted.
    pub fn mean_accepted(&self) -> f64 {
        if self.draft_steps == 0 {
            0.0
        } else {
            self.accepted as f64 / self.draft_steps as f64
        }
    }
}

const HIST: &str = "spec_history";
const Q: &str = "spec_q";
const P: &str = "spec_p";
const CANDS: &str = "spec_candidates";

/// Appends the speculator's regions to `plan`: the history (`n_ctx + 1` tokens), the
/// drafts' distributions (`n_max` rows of `n_vocab`), one target distribution and a
/// candidate buffer.
pub fn plan(plan: &mut Plan, n_vocab: usize, n_ctx: usize, n_max: usize) -> Result<(), Error> {
    if n_vocab == 0 || n_ctx == 0 || n_max == 0 {
        return Err(Error::BadConfig("speculation needs n_vocab, n_ctx and n_max > 0"));
    }
    let q = n_max.checked_mul(n_vocab).ok_or(Error::BadConfig("n_max * n_vocab overflows"))?;
    plan.add(HIST, n_ctx + 1, 4)?;
    plan.add(Q, q, 4)?;
    plan.add(P, n_vocab, 4)?;
    plan.add(CANDS, candidates_bytes(n_vocab), 1)?;
    Ok(())
}

/// Acceptance seen recently, decayed.
#[derive(Clone, Copy, Debug, Default)]
struct Recent {
    accepted: f32,
    seen: f32,
    idle: u32,
    probe_after: u32,
}

/// Steps without drafting before the first one-token probe.
const PROBE_EVERY: u32 = 8;
/// The most steps without drafting between probes.
const PROBE_MAX: u32 = 64;
/// The least expected speed-up (tokens per unit of cost over plain decoding's) for which
/// the adaptive length drafts. (1.1 waited too long to start drafting where a copy
/// begins: replaying the recorded greedy runs of BENCHMARKS.md's prompts through this
/// policy, 1.05 gained up to 15% on the code-editing prompts and lost nothing measurable
/// on the others.)
const MIN_GAIN: f32 = 1.05;
/// The least speed-up perfect acceptance must promise for drafting to be tried at all.
const MIN_GAIN_AT_BEST: f32 = 1.25;
/// How much of the recent acceptance carries over to the next step.
const DECAY: f32 = 0.8;

/// The repetition penalty depends on a token history that drafting would have to roll
/// back too: refused.
fn refuse_penalty(sampling: &SamplerConfig) -> Result<(), Error> {
    if sampling.repeat_penalty != 1.0 {
        return Err(Error::BadConfig("speculative decoding does not support the repetition penalty; use --repeat-penalty 1"));
    }
    Ok(())
}

/// Drives a target and a drafter; holds the sequence.
pub struct Speculator<'a> {
    cfg: SpecConfig,
    n_vocab: usize,
    hist: &'a mut [u32],
    n: usize,
    q: &'a mut [f32],
    p: &'a mut [f32],
    ch: Chooser<'a>,
    stats: Stats,
    recent: Recent,
}

impl<'a> Speculator<'a> {
    /// Takes the regions planned by [`plan`] (with the same `n_vocab` and `cfg.n_max`)
    /// from `carver`. The repetition penalty is refused: it depends on a token history
    /// that drafting would have to roll back too.
    pub fn new(carver: &mut Carver<'a>, plan: &Plan, cfg: SpecConfig, sampling: SamplerConfig, n_vocab: usize) -> Result<Self, Error> {
        refuse_penalty(&sampling)?;
        let r = |name| plan.region(name).ok_or(Error::BadConfig("arena plan is missing a speculation region"));
        let hist = carver.u32s(r(HIST)?);
        let q = carver.f32s(r(Q)?);
        let p = carver.f32s(r(P)?);
        if cfg.n_max == 0 || q.len() < cfg.n_max * n_vocab || p.len() < n_vocab {
            return Err(Error::BadConfig("the speculation regions were planned for another n_max or vocabulary"));
        }
        let cands = carver.uninit::<Candidate>(r(CANDS)?);
        for slot in cands.iter_mut() {
            slot.write(Candidate::default());
        }
        // SAFETY: every slot was initialised just above.
        let cands: &'a mut [Candidate] = unsafe { &mut *(cands as *mut [core::mem::MaybeUninit<Candidate>] as *mut [Candidate]) };
        Ok(Speculator { cfg, n_vocab, hist, n: 0, q, p, ch: Chooser { cfg: sampling, cands, rng: Rng::new(sampling.seed) }, stats: Stats::default(), recent: Recent::default() })
    }

    /// Samples the next sequences with `sampling` (a server's per-request temperature,
    /// top-p and seed), its random stream started from `sampling.seed`. The repetition
    /// penalty is refused as in [`Speculator::new`].
    pub fn set_sampling(&mut self, sampling: SamplerConfig) -> Result<(), Error> {
        refuse_penalty(&sampling)?;
        self.ch.cfg = sampling;
        self.ch.rng = Rng::new(sampling.seed);
        Ok(())
    }

    /// The sequence: prompt and generated tokens.
    pub fn history(&self) -> &[u32] {
        &self.hist[..self.n]
    }

    /// What speculation did since [`Speculator::start`].
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The settings in use.
    pub fn config(&self) -> SpecConfig {
        self.cfg
    }

    /// Replaces the draft cost the adaptive length plans with (one draft token relative
    /// to one target pass), e.g. from timing real steps; ignored unless finite and >= 0.
    pub fn set_draft_cost(&mut self, cost: f32) {
        if cost.is_finite() && cost >= 0.0 {
            self.cfg.draft_cost = cost;
        }
    }

    /// Starts a sequence: the target (whose context must be empty) evaluates all of
    /// `prompt` but its last token, which the first [`Speculator::step`] evaluates with
    /// the first drafts (so even the first generated token is speculated).
    pub fn start(&mut self, target: &mut dyn Lm, drafter: &mut dyn Drafter, prompt: &[u32]) -> Result<(), Error> {
        if prompt.is_empty() {
            return Err(Error::BadConfig("speculation needs a prompt of at least one token"));
        }
        if target.n_vocab() != self.n_vocab {
            return Err(Error::BadConfig("the speculator was planned for another vocabulary"));
        }
        if prompt.len() > self.hist.len() - 1 || prompt.len() > target.limits().n_ctx {
            return Err(Error::ContextFull { n_past: 0, n_tokens: prompt.len(), n_ctx: target.limits().n_ctx });
        }
        if target.n_past() != 0 {
            target.rewind(0)?;
        }
        self.hist[..prompt.len()].copy_from_slice(prompt);
        self.n = prompt.len();
        self.stats = Stats::default();
        self.recent = Recent::default();
        if prompt.len() > 1 {
            target.eval(&prompt[..prompt.len() - 1], Outputs::Last)?;
        }
        drafter.start(prompt)
    }

    /// True while another step fits in the target's context.
    pub fn can_step(&self, target: &dyn Lm) -> bool {
        self.n >= 1 && self.n <= target.limits().n_ctx
    }

    /// The draft length for the next step, from recent acceptance.
    fn draft_len(&mut self) -> usize {
        let n_max = self.cfg.n_max;
        if !self.cfg.adaptive {
            return n_max;
        }
        let a = ((self.recent.accepted + 1.0) / (self.recent.seen + 2.0)).min(0.999);
        // A length whose expected gain is within the cost model's error counts as none.
        let best_k = match self.best_len(a) {
            (k, rate) if rate >= MIN_GAIN => k,
            _ => 0,
        };
        // Drafting that would not pay well even if every draft were accepted (a draft
        // model nearly as slow as the target) is never tried.
        if self.best_len(1.0).1 < MIN_GAIN_AT_BEST {
            return 0;
        }
        if best_k == 0 {
            // A one-token probe after PROBE_EVERY idle steps, then after twice as many each
            // time a probe finds no gain (up to PROBE_MAX): what probing costs where
            // drafting never pays stays within a few percent.
            self.recent.idle += 1;
            if self.recent.idle >= self.recent.probe_after.max(PROBE_EVERY) {
                self.recent.idle = 0;
                self.recent.probe_after = (self.recent.probe_after.max(PROBE_EVERY) * 2).min(PROBE_MAX);
                return 1;
            }
        } else {
            self.recent.probe_after = PROBE_EVERY;
        }
        best_k
    }

    /// The draft length with the most expected tokens per unit of cost when each draft is
    /// accepted with probability `a`, and that rate (plain decoding: length 0, rate 1).
    fn best_len(&self, a: f32) -> (usize, f32) {
        let per_token = self.cfg.verify_cost + self.cfg.draft_cost;
        let (mut best_k, mut best) = (0usize, 1.0f32);
        let (mut pow, mut expected) = (1.0f32, 1.0f32);
        for k in 1..=self.cfg.n_max {
            pow *= a;
            expected += pow;
            // Expected tokens of a step with k drafts (1 + a + .. + a^k) over its cost.
            let rate = expected / (1.0 + self.cfg.verify_base + k as f32 * per_token);
            if rate > best * 1.02 {
                (best_k, best) = (k, rate);
            }
        }
        (best_k, best)
    }

    /// One step: draft, verify in one target batch, keep the agreeing prefix and the
    /// target's own next token, roll back the rest. Returns the tokens generated (at
    /// least one).
    pub fn step(&mut self, target: &mut dyn Lm, drafter: &mut dyn Drafter) -> Result<&[u32], Error> {
        let n = self.n;
        let lim = target.limits();
        if !self.can_step(target) {
            return Err(Error::ContextFull { n_past: target.n_past(), n_tokens: 1, n_ctx: lim.n_ctx });
        }
        let v = self.n_vocab;
        // The verify batch is the pending token and the drafts: within n_ctx, n_batch, n_outputs.
        let room = (lim.n_ctx - n).min(lim.n_batch - 1).min(lim.n_outputs - 1).min(self.cfg.n_max);
        let want = self.draft_len().min(room);
        let k = if want > 0 {
            let (seen, rest) = self.hist.split_at_mut(n);
            let k = drafter.draft(seen, &mut rest[..want], &mut self.q[..want * v], &mut self.ch)?;
            k.min(want)
        } else {
            0
        };
        if k > 0 {
            target.checkpoint()?;
        }
        target.eval(&self.hist[n - 1..n + k], if k > 0 { Outputs::All } else { Outputs::Last })?;
        let rows = target.logits();
        let mut m = 0;
        let mut next = None;
        while m < k {
            let row = &rows[m * v..(m + 1) * v];
            let d = self.hist[n + m] as usize;
            if self.ch.greedy() {
                let t = argmax(row);
                if t as usize != d {
                    next = Some(t);
                    break;
                }
            } else {
                self.ch.dist(row, self.p);
                let q = &self.q[m * v..(m + 1) * v];
                let (pd, qd) = (self.p[d] as f64, q[d] as f64);
                if !(qd > 0.0 && self.ch.uniform() * qd < pd) {
                    // Rejected: draw from the residual max(0, p - q).
                    for (pi, &qi) in self.p.iter_mut().zip(q) {
                        *pi = (*pi - qi).max(0.0);
                    }
                    next = Some(self.ch.draw(self.p));
                    break;
                }
            }
            m += 1;
        }
        let t = match next {
            Some(t) => t,
            None => {
                let row = &rows[k * v..(k + 1) * v];
                self.ch.choose(row, self.p)
            }
        };
        // The target evaluated hist[..n + k]; it keeps hist[..n + m].
        if m < k {
            rewind_to(target, &self.hist[..n + m], n + m)?;
        }
        self.hist[n + m] = t;
        self.n = n + m + 1;
        drafter.sync(&self.hist[..self.n], m)?;
        let s = &mut self.stats;
        s.steps += 1;
        s.generated += m as u64 + 1;
        if k > 0 {
            s.draft_steps += 1;
            s.drafted += k as u64;
            s.accepted += m as u64;
            let r = &mut self.recent;
            r.accepted = r.accepted * DECAY + m as f32;
            r.seen = r.seen * DECAY + (m + usize::from(m < k)) as f32;
            r.idle = 0;
        }
        Ok(&self.hist[n..self.n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::carve;

    #[test]
    fn lookup_takes_the_latest_longest_match() {
        let l = Lookup { ngram_max: 3, ngram_min: 2 };
        // "1 2 3 9 | 1 2 3 7 | 2 3" : the 3-gram "1 2 3" is not at the end; "2 3" (2-gram)
        // last occurred before 7.
        assert_eq!(l.find(&[1, 2, 3, 9, 1, 2, 3, 7, 2, 3], 4), Some((7, 3)));
        // The 3-gram "5 1 2" wins over the later 2-gram "1 2".
        assert_eq!(l.find(&[5, 1, 2, 8, 1, 2, 6, 5, 1, 2], 2), Some((3, 2)));
        assert_eq!(l.find(&[1, 2, 3, 4], 4), None);
        assert_eq!(l.find(&[7], 4), None);
        assert_eq!(l.find(&[1, 2, 1, 2], 0), None);
        // A run of one token: the latest match, one token before the end.
        assert_eq!(l.find(&[4, 4, 4, 4], 8), Some((3, 1)));
        // Beyond ngram_max, the latest of the (capped) longest matches wins.
        let l = Lookup { ngram_max: 3, ngram_min: 2 };
        assert_eq!(l.find(&[0, 1, 2, 3, 7, 9, 1, 2, 3, 8, 0, 1, 2, 3], 1), Some((9, 1)));
        // Longer matches: "0 1 2 3" before 7 beats the later "1 2 3" before 8.
        let l = Lookup { ngram_max: 64, ngram_min: 2 };
        assert_eq!(l.find(&[0, 1, 2, 3, 7, 9, 1, 2, 3, 8, 0, 1, 2, 3], 1), Some((4, 1)));
        // The default needs 3 matching tokens.
        assert_eq!(Lookup::default().find(&[1, 2, 5, 1, 2], 4), None);
        assert_eq!(Lookup::default().find(&[9, 1, 2, 5, 9, 1, 2], 4), Some((3, 4)));
    }

    fn with_speculator(cfg: SpecConfig, f: impl FnOnce(&mut Speculator<'_>)) {
        let mut mem = [0u8; 8192];
        let mut plan = Plan::empty();
        super::plan(&mut plan, 8, 16, cfg.n_max).unwrap();
        let mut c = carve(&mut mem, &plan).unwrap();
        let mut sp = Speculator::new(&mut c, &plan, cfg, SamplerConfig { temp: 0.0, ..SamplerConfig::default() }, 8).unwrap();
        f(&mut sp);
    }

    #[test]
    fn adaptive_length_follows_acceptance_and_cost() {
        // Free drafts: high acceptance drafts the most, low acceptance stops (then probes).
        with_speculator(SpecConfig { n_max: 6, ..SpecConfig::default() }, |sp| {
            sp.recent = Recent { accepted: 50.0, seen: 50.0, ..Recent::default() };
            assert_eq!(sp.draft_len(), 6);
            sp.recent = Recent { accepted: 0.0, seen: 50.0, ..Recent::default() };
            let lens: [usize; PROBE_EVERY as usize] = core::array::from_fn(|_| sp.draft_len());
            assert_eq!(lens.iter().filter(|&&k| k == 0).count(), PROBE_EVERY as usize - 1);
            assert_eq!(lens[PROBE_EVERY as usize - 1], 1, "a probe after {PROBE_EVERY} idle steps");
            // Probes that find nothing come half as often each time, down to one in PROBE_MAX.
            let mut gaps = [0usize; 4];
            for g in gaps.iter_mut() {
                *g = 1 + (0..1000).take_while(|_| sp.draft_len() == 0).count();
            }
            assert_eq!(gaps, [16, 32, 64, 64]);
        });
        // A draft nearly as slow as the target is never tried, even at full acceptance.
        with_speculator(SpecConfig { n_max: 6, draft_cost: 0.8, ..SpecConfig::default() }, |sp| {
            sp.recent = Recent { accepted: 50.0, seen: 50.0, ..Recent::default() };
            assert!((0..40).all(|_| sp.draft_len() == 0));
        });
        // Fixed length: always n_max.
        with_speculator(SpecConfig { n_max: 3, adaptive: false, draft_cost: 0.8, ..SpecConfig::default() }, |sp| assert_eq!(sp.draft_len(), 3));
    }

    #[test]
    fn the_repetition_penalty_is_refused() {
        let mut mem = [0u8; 8192];
        let mut plan = Plan::empty();
        super::plan(&mut plan, 8, 16, 2).unwrap();
        let mut c = carve(&mut mem, &plan).unwrap();
        let r = Speculator::new(&mut c, &plan, SpecConfig { n_max: 2, ..SpecConfig::default() }, SamplerConfig { repeat_penalty: 1.1, ..SamplerConfig::default() }, 8);
        assert!(r.is_err());
    }
}

//! Everything a host needs to run a model, built from one GGUF file and one arena.
//!
//! [`plan`] sizes the arena for a file and run limits; [`Engine::new`] cuts the arena into
//! the layer table, the tokenizer index, the session (KV cache, activations, logits) and
//! the sampler's candidate buffer. The parts are public fields so a host can borrow them
//! independently (evaluate with `session`, choose with `sampler`, print with `tokenizer`).

use crate::arena::{carve, Plan};
use crate::error::Error;
use crate::gguf::Gguf;
use crate::model::{self, HParams, Model, LAYER_TABLE};
use crate::quant::Kernels;
use crate::sampler::{candidates_bytes, Candidate, Sampler, SamplerConfig};
use crate::session::{max_act_row_bytes, plan_session_with, Outputs, Session, SessionConfig};
use crate::tokenizer::Tokenizer;
use crate::parallel::Parallel;

const TOKENIZER: &str = "tokenizer";
const CANDIDATES: &str = "candidates";

/// The arena plan for running `g` with `cfg`.
pub fn plan(g: &Gguf<'_>, cfg: &SessionConfig) -> Result<Plan, Error> {
    plan_with(g, cfg, false)
}

/// [`plan`], with `checkpoint`: room for the session to rewind a recurrent model
/// ([`crate::session::plan_session_with`]; speculative decoding needs it).
pub fn plan_with(g: &Gguf<'_>, cfg: &SessionConfig, checkpoint: bool) -> Result<Plan, Error> {
    let hp = HParams::from_gguf(g)?;
    let mut p = Plan::empty();
    model::plan_table(&mut p, &hp)?;
    p.add(TOKENIZER, Tokenizer::memory_bytes(g)?, 1)?;
    plan_session_with(&mut p, &hp, max_act_row_bytes(g), cfg, checkpoint)?;
    p.add(CANDIDATES, candidates_bytes(hp.n_vocab), 1)?;
    Ok(p)
}

/// A ready-to-run model: weights, tokenizer, one session and a sampler.
pub struct Engine<'a> {
    /// The weights.
    pub model: Model<'a>,
    /// The tokenizer.
    pub tokenizer: Tokenizer<'a>,
    /// The sequence state.
    pub session: Session<'a>,
    /// The sampler.
    pub sampler: Sampler<'a>,
    /// The plan the arena was cut by.
    pub plan: Plan,
}

impl<'a> Engine<'a> {
    /// Loads `g` into `mem` (at least `plan(g, &cfg)?.total_bytes()` bytes).
    pub fn new(g: &Gguf<'a>, mem: &'a mut [u8], cfg: SessionConfig, kernels: Kernels, sampling: SamplerConfig) -> Result<Engine<'a>, Error> {
        Self::new_with(g, mem, cfg, kernels, sampling, false)
    }

    /// [`Engine::new`] for an arena of [`plan_with`]`(g, &cfg, checkpoint)`.
    pub fn new_with(g: &Gguf<'a>, mem: &'a mut [u8], cfg: SessionConfig, kernels: Kernels, sampling: SamplerConfig, checkpoint: bool) -> Result<Engine<'a>, Error> {
        let plan = plan_with(g, &cfg, checkpoint)?;
        let hp = HParams::from_gguf(g)?;
        let mut c = carve(mem, &plan)?;
        let region = |name: &str| plan.region(name).ok_or(Error::BadConfig("arena plan is missing a region"));
        let table = c.uninit(region(LAYER_TABLE)?);
        let model = Model::load(g, hp, table)?;
        let tokenizer = Tokenizer::new(g, c.bytes(region(TOKENIZER)?))?;
        // (The set's hints tuned to the weights a token reads: `Kernels::for_weights`.)
        let mut weights = 0usize;
        crate::placement::for_each_weight(&model, |_, t| weights += t.size_bytes());
        let session = Session::new(&mut c, &plan, cfg, kernels.for_weights(weights));
        let cands = c.uninit::<Candidate>(region(CANDIDATES)?);
        for slot in cands.iter_mut() {
            slot.write(Candidate::default());
        }
        // SAFETY: every slot was initialised just above.
        let cands: &'a mut [Candidate] = unsafe { &mut *(cands as *mut [core::mem::MaybeUninit<Candidate>] as *mut [Candidate]) };
        let sampler = Sampler::new(sampling, cands);
        Ok(Engine { model, tokenizer, session, sampler, plan })
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.model.hp.n_vocab
    }

    /// Evaluates `tokens` (appending to the context), recording them in the sampler's
    /// history, and returns the logits rows asked for.
    pub fn eval(&mut self, tokens: &[u32], outputs: Outputs, par: &dyn Parallel) -> Result<&[f32], Error> {
        self.session.eval(&self.model, tokens, outputs, par)?;
        for &t in tokens {
            self.sampler.accept(t);
        }
        Ok(self.session.logits(self.model.hp.n_vocab))
    }

    /// [`Engine::eval`] with matrix products placed by `exec` (see [`Session::eval_on`]).
    pub fn eval_on(&mut self, tokens: &[u32], outputs: Outputs, par: &dyn Parallel, exec: Option<&mut crate::placement::Exec<'_, '_>>) -> Result<&[f32], Error> {
        self.session.eval_on(&self.model, tokens, outputs, par, exec)?;
        for &t in tokens {
            self.sampler.accept(t);
        }
        Ok(self.session.logits(self.model.hp.n_vocab))
    }

    /// Samples the next token from the last logits row.
    pub fn sample(&mut self) -> u32 {
        let v = self.model.hp.n_vocab;
        self.sampler.sample(self.session.last_logits(v))
    }

    /// Starts a new sequence (the context and the sampler history are cleared).
    pub fn reset(&mut self) {
        let _ = self.session.truncate(0);
        self.sampler.reset();
    }
}

//! keel as a library: `keel-example-library MODEL.gguf "PROMPT" [N]` prints N (default 32)
//! greedy tokens as text on stdout, then their ids on stderr (as `keel run --temp 0`).
use keel_core::engine::{plan, Engine};
use keel_core::gguf::Gguf;
use keel_core::quant::Kernels;
use keel_core::sampler::SamplerConfig;
use keel_core::session::{Outputs, SessionConfig};
use keel_core::tokenizer::{Tokenizer, Utf8Stream};
use keel_host_linux::{isa, mmap::{Arena, ModelFile}, pool::ThreadPool};
use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (path, prompt) = (args.next().ok_or("usage: MODEL PROMPT [N]")?, args.next().unwrap_or_default());
    let n_predict: usize = args.next().map_or(Ok(32), |n| n.parse())?;

    // The model file, mapped; the GGUF header parsed in place (no copy of the weights).
    let file = ModelFile::open(&path)?;
    let gguf = Gguf::parse(file.bytes())?;

    // Plan the arena for a context, allocate it once, and cut the engine out of it.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cfg = SessionConfig { n_ctx: 2048, n_batch: 512, n_outputs: 1, n_threads: threads };
    let mut arena = Arena::new(plan(&gguf, &cfg)?.total_bytes())?;
    let greedy = SamplerConfig { temp: 0.0, ..SamplerConfig::default() };
    let mut engine = Engine::new(&gguf, arena.as_mut_slice(), cfg, Kernels::new(isa::detect()), greedy)?;
    let pool = ThreadPool::new(threads)?;

    // Tokenize the prompt (with BOS, special tokens parsed), into caller-owned buffers.
    let mut ids = vec![0u32; cfg.n_ctx];
    let mut work = vec![0u8; Tokenizer::work_bytes(prompt.len())];
    let n = engine.tokenizer.tokenize(&prompt, true, true, &mut ids, &mut work)?;
    engine.eval(&ids[..n], Outputs::Last, &pool)?;

    // Sample, print, feed back; pieces may split a UTF-8 character, so stream them.
    let (mut out, mut stream) = (std::io::stdout().lock(), Utf8Stream::new());
    let mut piece = vec![0u8; engine.tokenizer.max_piece_len()];
    let mut generated = Vec::new();
    while generated.len() < n_predict {
        let tok = engine.sample();
        if engine.tokenizer.is_eog(tok) {
            break;
        }
        generated.push(tok);
        let len = engine.tokenizer.piece(tok, true, &mut piece)?;
        stream.push(&piece[..len], |s: &str| drop(out.write_all(s.as_bytes()).and_then(|_| out.flush())));
        if engine.session.n_past() >= cfg.n_ctx {
            break;
        }
        engine.eval(&[tok], Outputs::Last, &pool)?;
    }
    stream.finish(|s: &str| drop(out.write_all(s.as_bytes())));
    writeln!(out)?;
    eprintln!("{generated:?}");
    engine.reset(); // ready for the next prompt in the same arena
    Ok(())
}

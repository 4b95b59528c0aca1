//! Fuzzes everything keel does with untrusted model bytes before running them: the GGUF
//! parser, every metadata and tensor accessor, hyper-parameters, the tokenizer index,
//! the arena plan and the model loader. None of it may panic, whatever the input.
#![no_main]

use core::mem::MaybeUninit;
use keel_core::gguf::{Gguf, Value};
use keel_core::model::{HParams, Layer, Model};
use keel_core::session::SessionConfig;
use keel_core::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::parse(data) else { return };
    for i in 0..g.n_keys() {
        if let Some((_, Value::Array(a))) = g.key_at(i) {
            for s in a.strings().take(64) {
                let _ = s.len();
            }
            let _ = a.int(0);
            let _ = a.float(a.len().saturating_sub(1));
        }
    }
    for t in g.tensors() {
        let _ = (t.n_elements(), t.data.len());
    }
    if let Ok(n) = Tokenizer::memory_bytes(&g) {
        if n <= 1 << 24 {
            let mut mem = vec![0u8; n];
            if let Ok(tok) = Tokenizer::new(&g, &mut mem) {
                let mut out = [0u32; 64];
                let mut work = vec![0u8; Tokenizer::work_bytes(16)];
                let _ = tok.tokenize("Hello <|im_start|> wörld 123", true, true, &mut out, &mut work);
            }
        }
    }
    let Ok(hp) = HParams::from_gguf(&g) else { return };
    let cfg = SessionConfig { n_ctx: 16, n_batch: 4, n_outputs: 1, n_threads: 1 };
    let _ = keel_core::engine::plan(&g, &cfg);
    if hp.n_layer <= 256 {
        let mut table: Vec<MaybeUninit<Layer<'_>>> = (0..hp.n_layer).map(|_| MaybeUninit::uninit()).collect();
        let _ = Model::load(&g, hp, &mut table);
    }
});

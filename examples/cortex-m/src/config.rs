// What the example runs, shared by build.rs (which plans the arena for it) and main.rs.

/// The model when KEEL_CORTEX_M_MODEL is unset, relative to this crate's folder: the tiny
/// llama `keel-tiny-llama` writes (tests/cortex_m.sh); embedded with `include_bytes!`.
#[allow(dead_code)] // build.rs reads it; main.rs embeds the path build.rs resolves
pub const MODEL: &str = "../../target/keel-tiny-llama-q8_0.gguf";
/// The prompt (tokenized with the model's tokenizer, BOS as the model asks).
pub const PROMPT: &str = "The capital of France is";
/// Tokens generated greedily.
pub const N_PREDICT: usize = 32;
/// The session the arena is planned for: context positions, batch, logits rows, threads.
pub const N_CTX: usize = 64;
pub const N_BATCH: usize = 16;
pub const N_OUTPUTS: usize = 1;
pub const N_THREADS: usize = 1;

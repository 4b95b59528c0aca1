//! Writes a tiny llama GGUF for targets with a few hundred KiB of memory (the Cortex-M
//! example): n_embd 64, 2 layers, n_ff 128, 4 heads (2 KV heads), Q8_0 matrices, and a
//! GPT-2 BPE tokenizer cut from the synthetic llama's (tests/golden/synth): its first
//! `N_VOCAB` tokens and the merges among them. Weights are seeded random numbers
//! (test-support's `Rng`), so the same file comes out every time.
//!
//! usage: keel-tiny-llama OUT.gguf

use keel_core::ggml_type::GgmlType;
use keel_core::gguf::{Gguf, Value, ValueType};
use keel_core::quant::quantize_row_ref;
use keel_host_linux::gguf_write::{encode_kv, GgufWriter, TensorDecl};
use keel_test_support::{golden_path, Rng};

const N_VOCAB: usize = 512;
const N_EMBD: u64 = 64;
const N_LAYER: u32 = 2;
const N_FF: u64 = 128;
const N_HEAD: u32 = 4;
const N_HEAD_KV: u32 = 2;
const HEAD_DIM: u64 = N_EMBD / N_HEAD as u64;
const SEED: u64 = 0x6b65_656c_2d6d_3431; // "keel-m41"

/// Appends a metadata entry whose value is an array of strings.
fn kv_strings(out: &mut Vec<u8>, key: &str, items: &[&[u8]]) {
    put_key(out, key, 9, 8, items.len());
    for s in items {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s);
    }
}

/// Appends a metadata entry whose value is an array of i32.
fn kv_i32s(out: &mut Vec<u8>, key: &str, items: &[i32]) {
    put_key(out, key, 9, 5, items.len());
    for v in items {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Key, type `array` (9), element type id, element count.
fn put_key(out: &mut Vec<u8>, key: &str, ty: u32, elem: u32, n: usize) {
    out.extend_from_slice(&(key.len() as u64).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&ty.to_le_bytes());
    out.extend_from_slice(&elem.to_le_bytes());
    out.extend_from_slice(&(n as u64).to_le_bytes());
}

fn main() {
    let out = std::env::args_os().nth(1).expect("usage: keel-tiny-llama OUT.gguf");
    let src = golden_path("synth/synth-llama-q8_0.gguf");
    let bytes = std::fs::read(&src).unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
    let g = Gguf::parse(&bytes).expect("the synthetic llama parses");

    // The tokenizer: the first N_VOCAB tokens (special tokens, the bytes, the first merges'
    // results) and every merge whose two parts and result are among them.
    let all_tokens: Vec<&[u8]> = g.array_opt("tokenizer.ggml.tokens").unwrap().expect("tokens").strings().collect();
    let tokens = &all_tokens[..N_VOCAB];
    let types_arr = g.array_opt("tokenizer.ggml.token_type").unwrap().expect("token types");
    let types: Vec<i32> = (0..N_VOCAB).map(|i| types_arr.int(i).expect("a token type") as i32).collect();
    let kept: std::collections::HashSet<&[u8]> = tokens.iter().copied().collect();
    let merges: Vec<&[u8]> = g
        .array_opt("tokenizer.ggml.merges")
        .unwrap()
        .expect("merges")
        .strings()
        .filter(|m| {
            let sp = m.iter().position(|&b| b == b' ').expect("a merge is two tokens");
            let (a, b) = (&m[..sp], &m[sp + 1..]);
            kept.contains(a) && kept.contains(b) && kept.contains([a, b].concat().as_slice())
        })
        .collect();

    let mut kv = Vec::new();
    let mut n_kv = 0u64;
    let mut put = |kv: &mut Vec<u8>, k: &str, v: Value<'_>| {
        encode_kv(kv, k.as_bytes(), &v);
        n_kv += 1;
    };
    put(&mut kv, "general.architecture", Value::Str(b"llama"));
    put(&mut kv, "general.name", Value::Str(b"keel-tiny-llama-q8_0"));
    put(&mut kv, "general.file_type", Value::U32(7));
    put(&mut kv, "general.quantization_version", Value::U32(2));
    put(&mut kv, "llama.context_length", Value::U32(256));
    put(&mut kv, "llama.embedding_length", Value::U32(N_EMBD as u32));
    put(&mut kv, "llama.block_count", Value::U32(N_LAYER));
    put(&mut kv, "llama.feed_forward_length", Value::U32(N_FF as u32));
    put(&mut kv, "llama.attention.head_count", Value::U32(N_HEAD));
    put(&mut kv, "llama.attention.head_count_kv", Value::U32(N_HEAD_KV));
    put(&mut kv, "llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    put(&mut kv, "llama.rope.freq_base", Value::F32(10000.0));
    put(&mut kv, "llama.rope.dimension_count", Value::U32(HEAD_DIM as u32));
    put(&mut kv, "tokenizer.ggml.add_space_prefix", Value::Bool(false));
    put(&mut kv, "tokenizer.ggml.add_bos_token", Value::Bool(false));
    put(&mut kv, "tokenizer.ggml.model", Value::Str(b"gpt2"));
    put(&mut kv, "tokenizer.ggml.pre", Value::Str(b"smollm"));
    for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"] {
        let id = g.u32(key).expect("a special token id");
        assert!((id as usize) < N_VOCAB, "{key} {id} is outside the kept vocabulary");
        put(&mut kv, key, Value::U32(id));
    }
    kv_strings(&mut kv, "tokenizer.ggml.tokens", tokens);
    kv_i32s(&mut kv, "tokenizer.ggml.token_type", &types);
    kv_strings(&mut kv, "tokenizer.ggml.merges", &merges);
    n_kv += 3;
    debug_assert_eq!(ValueType::from_id(9), Some(ValueType::Array));

    // Tensors: (name, ne, type). Norms F32 (ones plus noise), matrices Q8_0.
    let v = N_VOCAB as u64;
    let kvd = HEAD_DIM * N_HEAD_KV as u64;
    let mut decls: Vec<(String, [u64; 2], GgmlType)> = vec![("token_embd.weight".into(), [N_EMBD, v], GgmlType::Q8_0)];
    for l in 0..N_LAYER {
        let b = |s: &str| format!("blk.{l}.{s}.weight");
        decls.push((b("attn_norm"), [N_EMBD, 1], GgmlType::F32));
        decls.push((b("attn_q"), [N_EMBD, N_EMBD], GgmlType::Q8_0));
        decls.push((b("attn_k"), [N_EMBD, kvd], GgmlType::Q8_0));
        decls.push((b("attn_v"), [N_EMBD, kvd], GgmlType::Q8_0));
        decls.push((b("attn_output"), [N_EMBD, N_EMBD], GgmlType::Q8_0));
        decls.push((b("ffn_norm"), [N_EMBD, 1], GgmlType::F32));
        decls.push((b("ffn_gate"), [N_EMBD, N_FF], GgmlType::Q8_0));
        decls.push((b("ffn_up"), [N_EMBD, N_FF], GgmlType::Q8_0));
        decls.push((b("ffn_down"), [N_FF, N_EMBD], GgmlType::Q8_0));
    }
    decls.push(("output_norm.weight".into(), [N_EMBD, 1], GgmlType::F32));
    decls.push(("output.weight".into(), [N_EMBD, v], GgmlType::Q8_0));
    let td: Vec<TensorDecl> = decls
        .iter()
        .map(|(n, ne, ty)| TensorDecl { name: n.as_bytes().to_vec(), ne: [ne[0], ne[1], 1, 1], n_dims: if ne[1] == 1 { 1 } else { 2 }, ty: *ty })
        .collect();

    let out = std::path::PathBuf::from(out);
    let mut w = GgufWriter::create(&out, &kv, n_kv, &td, 32).expect("the model file is created");
    let mut rng = Rng(SEED);
    for (name, ne, ty) in &decls {
        let (cols, rows) = (ne[0] as usize, ne[1] as usize);
        let data: Vec<u8> = if *ty == GgmlType::F32 {
            (0..cols).flat_map(|_| (1.0 + 0.1 * rng.f32()).to_le_bytes()).collect()
        } else {
            // Scaled so activations keep their size through the layers; the embeddings
            // and the output larger, for distinct logits.
            let scale = if name.starts_with("token_embd") || name.starts_with("output") { 1.0 } else { 1.5 / (cols as f32).sqrt() };
            let row_bytes = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
            let mut d = vec![0u8; row_bytes * rows];
            for r in 0..rows {
                quantize_row_ref(*ty, &rng.vec(cols, scale), &mut d[r * row_bytes..(r + 1) * row_bytes]).expect("Q8_0 quantizes");
            }
            d
        };
        w.write_data(&data).expect("tensor data written");
        w.end_tensor().expect("tensor ended");
    }
    w.finish().expect("the model is written");
    eprintln!("{}: {N_VOCAB} tokens, {} merges, {} tensors", out.display(), merges.len(), decls.len());
}

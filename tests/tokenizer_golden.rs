//! Tokenizer against llama.cpp: the `tokenize.jsonl` goldens of SmolLM2 (BPE,
//! pre-tokenizer `smollm`), Gemma 3 (SentencePiece) and the synthetic model that
//! carries SmolLM2's exact tokenizer (always present, so SmolLM2's tokenizer is
//! proven without a download); round-trip detokenization, the greedy goldens' text
//! as the concatenated pieces, UTF-8 streaming, and the errors for a full output
//! buffer and an unknown pre-tokenizer.

use keel::core::gguf::Gguf;
use keel::core::tokenizer::{Tokenizer, TokenizerError, Utf8Stream};
use std::path::PathBuf;
use std::time::Instant;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn models_dir() -> PathBuf {
    match std::env::var_os("KEEL_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/keel/models"),
    }
}

/// A cached model's bytes, or `None` after a loud SKIPPED line (a failure when
/// `KEEL_REQUIRE_MODELS=1`).
fn model(file: &str, pull: &str) -> Option<Vec<u8>> {
    let p = models_dir().join(file);
    match std::fs::read(&p) {
        Ok(b) => Some(b),
        Err(_) if std::env::var("KEEL_REQUIRE_MODELS").as_deref() == Ok("1") => panic!("model {} not found; run `keel pull {pull}`", p.display()),
        Err(_) => {
            eprintln!("SKIPPED: model {} not found; run `keel pull {pull}`", p.display());
            None
        }
    }
}

struct Case {
    text: String,
    add_special: bool,
    parse_special: bool,
    tokens: Vec<u32>,
}

fn cases(path: &str) -> Vec<Case> {
    let s = std::fs::read_to_string(root().join("tests/golden").join(path)).unwrap();
    s.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            Case {
                text: v["text"].as_str().unwrap().to_string(),
                add_special: v["add_special"].as_bool().unwrap(),
                parse_special: v["parse_special"].as_bool().unwrap(),
                tokens: v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect(),
            }
        })
        .collect()
}

fn with_tokenizer<R>(bytes: &[u8], f: impl FnOnce(&Tokenizer<'_>) -> R) -> R {
    let g = Gguf::parse(bytes).unwrap();
    let mut mem = vec![0u8; Tokenizer::memory_bytes(&g).unwrap()];
    let tok = Tokenizer::new(&g, &mut mem).unwrap();
    f(&tok)
}

fn tokenize(tok: &Tokenizer<'_>, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
    let mut work = vec![0u8; Tokenizer::work_bytes(text.len())];
    let mut out = vec![0u32; text.len() + 4];
    let n = tok.tokenize(text, add_special, parse_special, &mut out, &mut work).unwrap();
    out.truncate(n);
    out
}

/// Concatenated pieces; `special` renders control tokens.
fn detokenize(tok: &Tokenizer<'_>, ids: &[u32], special: bool) -> Vec<u8> {
    let mut buf = vec![0u8; tok.max_piece_len()];
    let mut out = Vec::new();
    for &id in ids {
        let n = tok.piece(id, special, &mut buf).unwrap();
        out.extend_from_slice(&buf[..n]);
    }
    out
}

/// Streams the pieces through a `Utf8Stream`; every chunk must be whole characters
/// and the result the original text.
fn stream(tok: &Tokenizer<'_>, ids: &[u32], special: bool) -> String {
    let mut buf = vec![0u8; tok.max_piece_len()];
    let mut s = Utf8Stream::new();
    let mut text = String::new();
    for &id in ids {
        let n = tok.piece(id, special, &mut buf).unwrap();
        s.push(&buf[..n], |chunk| text.push_str(chunk));
    }
    s.finish(|chunk| text.push_str(chunk));
    text
}

/// Checks every golden case (ids, round trip, streaming); returns how many matched.
fn check(tok: &Tokenizer<'_>, cases: &[Case]) -> usize {
    let mut ok = 0;
    for c in cases {
        let got = tokenize(tok, &c.text, c.add_special, c.parse_special);
        if got == c.tokens {
            ok += 1;
        } else {
            eprintln!("MISMATCH {:?} (add_special={}, parse_special={})\n  want {:?}\n  got  {:?}", c.text, c.add_special, c.parse_special, c.tokens, got);
        }
        // Round trip: drop the BOS the vocabulary adds, render specials the text spelled.
        let body = if c.add_special && tok.add_bos() && got.first() == tok.bos().as_ref() { &got[1..] } else { &got[..] };
        assert_eq!(String::from_utf8_lossy(&detokenize(tok, body, c.parse_special)), c.text, "round trip");
        assert_eq!(stream(tok, body, c.parse_special), c.text, "streamed round trip");
    }
    ok
}

#[test]
fn synth_llama_has_smollm2_tokenizer() {
    let bytes = std::fs::read(root().join("tests/golden/synth/synth-llama-q8_0.gguf")).unwrap();
    let cases = cases("synth/synth-llama-q8_0.tokenize.jsonl");
    with_tokenizer(&bytes, |tok| {
        assert_eq!(check(tok, &cases), cases.len());
        assert_eq!(tok.n_vocab(), 49152);
        assert!(!tok.add_bos());
        assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
        // <|endoftext|>, <|im_end|>, and <reponame> (llama.cpp's FIM-repo guess).
        for id in [0, 2, 4] {
            assert!(tok.is_eog(id), "{id} is end of generation");
        }
        assert!(!tok.is_eog(1));
    });
}

#[test]
fn smollm2_golden_60() {
    let Some(bytes) = model("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m") else { return };
    let cases = cases("smollm2-135m-q4_1/tokenize.jsonl");
    assert_eq!(cases.len(), 60);
    with_tokenizer(&bytes, |tok| assert_eq!(check(tok, &cases), 60));
}

#[test]
fn gemma3_golden_60() {
    let Some(bytes) = model("gemma-3-270m-q4_k_m.gguf", "gemma3-270m") else { return };
    let cases = cases("gemma3-270m-q4_k_m/tokenize.jsonl");
    assert_eq!(cases.len(), 60);
    with_tokenizer(&bytes, |tok| {
        assert_eq!(check(tok, &cases), 60);
        assert!(tok.add_bos());
        assert_eq!((tok.bos(), tok.eos()), (Some(2), Some(1)));
        let eot = tok.token_id(b"<end_of_turn>").unwrap();
        assert!(tok.is_eog(eot) && tok.is_eog(1));
    });
}

/// llama.cpp's greedy `text` is the concatenation of the generated tokens' pieces.
fn greedy_pieces(tok: &Tokenizer<'_>, path: &str) {
    let s = std::fs::read_to_string(root().join("tests/golden").join(path)).unwrap();
    for l in s.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let ids: Vec<u32> = v["generated"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let text = v["text"].as_str().unwrap();
        assert_eq!(String::from_utf8_lossy(&detokenize(tok, &ids, false)), text);
        assert_eq!(stream(tok, &ids, false), text);
    }
}

#[test]
fn greedy_text_is_the_pieces() {
    if let Some(bytes) = model("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m") {
        with_tokenizer(&bytes, |tok| greedy_pieces(tok, "smollm2-135m-q4_1/greedy.jsonl"));
    }
    if let Some(bytes) = model("gemma-3-270m-q4_k_m.gguf", "gemma3-270m") {
        with_tokenizer(&bytes, |tok| greedy_pieces(tok, "gemma3-270m-q4_k_m/greedy.jsonl"));
    }
}

/// The GPL-3 text (35 KB): round trip, and the time it takes.
fn gpl3(tok: &Tokenizer<'_>, name: &str) {
    let Ok(text) = std::fs::read_to_string("/usr/share/common-licenses/GPL-3") else {
        eprintln!("SKIPPED: /usr/share/common-licenses/GPL-3 not found");
        return;
    };
    let t = Instant::now();
    let ids = tokenize(tok, &text, false, false);
    let dt = t.elapsed();
    eprintln!("{name}: GPL-3 ({} bytes) -> {} tokens in {:.2} ms", text.len(), ids.len(), dt.as_secs_f64() * 1e3);
    assert_eq!(stream(tok, &ids, false), text);
    assert!(dt.as_secs_f64() < 2.0, "tokenizing 35 KB took {dt:?}");
}

#[test]
fn gpl3_round_trip_and_speed() {
    let bytes = std::fs::read(root().join("tests/golden/synth/synth-llama-q8_0.gguf")).unwrap();
    with_tokenizer(&bytes, |tok| gpl3(tok, "smollm2 tokenizer"));
    if let Some(bytes) = model("gemma-3-270m-q4_k_m.gguf", "gemma3-270m") {
        with_tokenizer(&bytes, |tok| gpl3(tok, "gemma3 tokenizer"));
    }
}

#[test]
fn out_of_space_says_how_many() {
    let bytes = std::fs::read(root().join("tests/golden/synth/synth-llama-q8_0.gguf")).unwrap();
    with_tokenizer(&bytes, |tok| {
        let text = "The quick brown fox jumps over the lazy dog.";
        let full = tokenize(tok, text, true, true);
        let mut out = [0u32; 3];
        let mut work = vec![0u8; Tokenizer::work_bytes(text.len())];
        let err = tok.tokenize(text, true, true, &mut out, &mut work).unwrap_err();
        assert_eq!(err, TokenizerError::OutOfSpace { needed: full.len(), capacity: 3 });
        assert_eq!(&out[..], &full[..3]);
        let msg = err.to_string();
        assert!(msg.contains(&full.len().to_string()) && msg.contains('3'), "{msg}");
        // Too little scratch is an error too, not a panic.
        let mut small = [0u8; 16];
        assert!(matches!(tok.tokenize(text, true, true, &mut out, &mut small), Err(TokenizerError::WorkTooSmall { .. })));
    });
}

/// A metadata-only GGUF v3 file holding the given string keys and string arrays.
fn tiny_gguf(strs: &[(&str, &str)], arrays: &[(&str, &[&str])]) -> Vec<u8> {
    let mut b = Vec::new();
    let s = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u64).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&((strs.len() + arrays.len()) as u64).to_le_bytes());
    for (k, v) in strs {
        s(&mut b, k);
        b.extend_from_slice(&8u32.to_le_bytes());
        s(&mut b, v);
    }
    for (k, items) in arrays {
        s(&mut b, k);
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for it in *items {
            s(&mut b, it);
        }
    }
    b
}

#[test]
fn unknown_pre_tokenizer_is_named() {
    let toks: &[&str] = &["a", "b", "ab"];
    let merges: &[&str] = &["a b"];
    let file = tiny_gguf(&[("tokenizer.ggml.model", "gpt2"), ("tokenizer.ggml.pre", "mystery-pre")], &[("tokenizer.ggml.tokens", toks), ("tokenizer.ggml.merges", merges)]);
    let g = Gguf::parse(&file).unwrap();
    let err = Tokenizer::memory_bytes(&g).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, TokenizerError::UnknownPreTokenizer(_)));
    assert!(msg.contains("mystery-pre") && msg.contains("smollm") && msg.contains("llama3") && msg.contains("qwen2"), "{msg}");

    // The same vocabulary with a known pre-tokenizer works, and merges "a b".
    let file = tiny_gguf(&[("tokenizer.ggml.model", "gpt2"), ("tokenizer.ggml.pre", "gpt2")], &[("tokenizer.ggml.tokens", toks), ("tokenizer.ggml.merges", merges)]);
    let g = Gguf::parse(&file).unwrap();
    let mut mem = vec![0u8; Tokenizer::memory_bytes(&g).unwrap()];
    let tok = Tokenizer::new(&g, &mut mem).unwrap();
    assert_eq!(tokenize(&tok, "abba", false, false), vec![2, 1, 0]);
    let err = Tokenizer::new(&g, &mut [0u8; 8]).unwrap_err();
    assert!(matches!(err, TokenizerError::MemoryTooSmall { .. }));

    let file = tiny_gguf(&[("tokenizer.ggml.model", "wordpiece-ish")], &[("tokenizer.ggml.tokens", toks)]);
    let g = Gguf::parse(&file).unwrap();
    assert!(Tokenizer::memory_bytes(&g).unwrap_err().to_string().contains("wordpiece-ish"));
}

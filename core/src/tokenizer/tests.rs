//! Unit tests: character classes, pre-tokenizer splits (cross-checked against the
//! Python `regex` module on the original patterns), the merge queues, UTF-8
//! streaming, and small BPE and SentencePiece vocabularies built as GGUF files in
//! fixed arrays (no allocation, like the crate).

use super::scratch::{Cand, Heap};
use super::unicode::{cp_to_byte, decode, flags, Class, BYTE_TO_CP};
use super::*;
use crate::gguf::Gguf;

#[test]
fn classes_follow_unicode_15_1() {
    assert_eq!(UNICODE_VERSION, "15.1.0");
    let f = |c: u32| flags(c);
    assert!(f('a' as u32).letter() && f('é' as u32).letter() && f('日' as u32).letter());
    assert!(f('7' as u32).number() && f('٣' as u32).number() && f('²' as u32).number() && f('Ⅻ' as u32).number());
    assert!(f(' ' as u32).space && f(' ' as u32).class == Class::Separator);
    assert!(f('\n' as u32).space && f('\n' as u32).class == Class::Control);
    assert!(f(0xA0).space && f(0x3000).space && f(0x85).space && !f(0x200B).space && !f(0x1C).space);
    assert_eq!(f(0x0378).class, Class::Undefined);
    assert_eq!(f(0x31EF).class, Class::Symbol); // assigned in Unicode 15.1
    assert_eq!(f(0x0301).class, Class::Mark);
    assert_eq!(f('!' as u32).class, Class::Punct);
    assert_eq!(f('$' as u32).class, Class::Symbol);
    assert_eq!(f(0xE000).class, Class::Control);
    assert_eq!(f(0x11_0000).class, Class::Undefined);
}

#[test]
fn gpt2_byte_alphabet_round_trips() {
    assert_eq!(BYTE_TO_CP[b' ' as usize], 0x120); // 'Ġ'
    assert_eq!(BYTE_TO_CP[b'\n' as usize], 0x10A); // 'Ċ'
    assert_eq!(BYTE_TO_CP[b'a' as usize], 'a' as u32 as u16);
    for b in 0..=255u8 {
        assert_eq!(cp_to_byte(BYTE_TO_CP[b as usize] as u32), Some(b));
    }
    assert_eq!(cp_to_byte(0x144), None);
    assert_eq!(cp_to_byte(0x20), None);
}

#[test]
fn lenient_decoding_replaces_one_byte() {
    assert_eq!(decode("é".as_bytes(), 0), (0xE9, 2));
    assert_eq!(decode(&[0xC3], 0), (0xFFFD, 1));
    assert_eq!(decode(&[0x80, 0x41], 0), (0xFFFD, 1));
    assert_eq!(decode(&[0xE2, 0x96, 0x41], 0), (0xFFFD, 1));
}

fn words(pre: PreTokenizer, text: &str) -> heapless::Vec<&str, 64> {
    let mut v = heapless::Vec::new();
    let mut at = 0;
    pre.for_each_word(text, |w| {
        // Words are consecutive slices of the text.
        let _ = v.push(&text[at..at + w.len()]);
        at += w.len();
    });
    assert_eq!(at, text.len());
    v
}

#[test]
fn pre_tokenizers_split_like_the_regexes() {
    use PreTokenizer::*;
    let t = "Hello, world! I'm   here\n\n  x 123456 é٣";
    assert_eq!(words(Gpt2, t)[..], ["Hello", ",", " world", "!", " I", "'m", "  ", " here", "\n\n ", " x", " 123456", " é", "٣"]);
    assert_eq!(words(Smollm, t)[..], ["Hello", ",", " world", "!", " I", "'m", "  ", " here", "\n\n ", " x", " ", "1", "2", "3", "4", "5", "6", " é", "٣"]);
    assert_eq!(words(Llama3, t)[..], ["Hello", ",", " world", "!", " I", "'m", "  ", " here", "\n\n", " ", " x", " ", "123", "456", " é", "٣"]);
    assert_eq!(words(Qwen2, t)[..], ["Hello", ",", " world", "!", " I", "'m", "  ", " here", "\n\n", " ", " x", " ", "1", "2", "3", "4", "5", "6", " é", "٣"]);
    assert_eq!(words(Default, "a+b=12345;c")[..], ["a", "+", "b", "=", "123", "45", ";", "c"]);
    // Case-insensitive contractions in LLaMA 3, not in GPT-2; a trailing space run.
    assert_eq!(words(Llama3, "WE'RE\t(ok)  ")[..], ["WE", "'RE", "\t", "(ok", ")", "  "]);
    assert_eq!(words(Gpt2, "WE'RE\t(ok)  ")[..], ["WE", "'", "RE", "\t", "(", "ok", ")", "  "]);
}

#[test]
fn merge_queues_pop_in_llama_cpp_order() {
    let mut mem = [0u8; 12 * 8];
    let mut h = Heap::new(&mut mem);
    for (rank, left) in [(5, 0), (2, 7), (2, 3), (9, 1)] {
        h.push(Cand::by_rank(rank, left, 2)).unwrap();
    }
    let order: [u32; 4] = core::array::from_fn(|_| h.pop().unwrap().left());
    assert_eq!(order, [3, 7, 0, 1]);
    assert!(h.pop().is_none());

    let mut h = Heap::new(&mut mem);
    for (score, left) in [(-3.5f32, 0), (-1.0, 4), (-1.0, 2), (0.5, 9), (-0.0, 6)] {
        h.push(Cand::by_score(score, left, 2)).unwrap();
    }
    let order: [u32; 5] = core::array::from_fn(|_| h.pop().unwrap().left());
    assert_eq!(order, [9, 6, 2, 4, 0]);
}

#[test]
fn utf8_stream_never_splits_a_character() {
    let mut s = Utf8Stream::new();
    let mut got = heapless::String::<64>::new();
    let mut chunks = 0;
    let bytes = "aé🦀b".as_bytes();
    for b in bytes {
        s.push(core::slice::from_ref(b), |c| {
            chunks += 1;
            got.push_str(c).unwrap();
        });
    }
    s.finish(|c| got.push_str(c).unwrap());
    assert_eq!(got.as_str(), "aé🦀b");
    assert_eq!(chunks, 4);
    assert_eq!(s.pending(), b"");

    // Certainly-invalid bytes become U+FFFD; an incomplete tail waits, then is replaced at the end.
    let mut got = heapless::String::<64>::new();
    s.push(&[b'x', 0xFF, 0xE2, 0x96], |c| got.push_str(c).unwrap());
    assert_eq!(got.as_str(), "x\u{FFFD}");
    assert_eq!(s.pending(), &[0xE2, 0x96]);
    s.push(b"y", |c| got.push_str(c).unwrap());
    assert_eq!(got.as_str(), "x\u{FFFD}\u{FFFD}y");
    s.push(&[0xF0, 0x9F], |c| got.push_str(c).unwrap());
    s.finish(|c| got.push_str(c).unwrap());
    assert_eq!(got.as_str(), "x\u{FFFD}\u{FFFD}y\u{FFFD}");
}

/// Writes a metadata-only GGUF v3 file into a fixed buffer.
struct W<'b> {
    b: &'b mut [u8],
    n: usize,
}

impl W<'_> {
    fn put(&mut self, x: &[u8]) {
        self.b[self.n..self.n + x.len()].copy_from_slice(x);
        self.n += x.len();
    }
    fn s(&mut self, x: &[u8]) {
        self.put(&(x.len() as u64).to_le_bytes());
        self.put(x);
    }
    fn header(&mut self, n_kv: u64) {
        self.put(b"GGUF");
        self.put(&3u32.to_le_bytes());
        self.put(&0u64.to_le_bytes());
        self.put(&n_kv.to_le_bytes());
    }
    fn kv_str(&mut self, k: &str, v: &str) {
        self.s(k.as_bytes());
        self.put(&8u32.to_le_bytes());
        self.s(v.as_bytes());
    }
    fn kv_u32(&mut self, k: &str, v: u32) {
        self.s(k.as_bytes());
        self.put(&4u32.to_le_bytes());
        self.put(&v.to_le_bytes());
    }
    fn kv_bool(&mut self, k: &str, v: bool) {
        self.s(k.as_bytes());
        self.put(&7u32.to_le_bytes());
        self.put(&[v as u8]);
    }
    fn kv_strs(&mut self, k: &str, v: &[&str]) {
        self.s(k.as_bytes());
        self.put(&9u32.to_le_bytes());
        self.put(&8u32.to_le_bytes());
        self.put(&(v.len() as u64).to_le_bytes());
        for x in v {
            self.s(x.as_bytes());
        }
    }
    fn kv_i32s(&mut self, k: &str, v: &[i32]) {
        self.s(k.as_bytes());
        self.put(&9u32.to_le_bytes());
        self.put(&5u32.to_le_bytes());
        self.put(&(v.len() as u64).to_le_bytes());
        for x in v {
            self.put(&x.to_le_bytes());
        }
    }
    fn kv_f32s(&mut self, k: &str, v: &[f32]) {
        self.s(k.as_bytes());
        self.put(&9u32.to_le_bytes());
        self.put(&6u32.to_le_bytes());
        self.put(&(v.len() as u64).to_le_bytes());
        for x in v {
            self.put(&x.to_le_bytes());
        }
    }
}

// A byte-level BPE vocabulary: "Ġ" is the GPT-2 letter for a space.
const BPE_TOKENS: &[&str] = &["<|endoftext|>", "<|im_end|>", "<u>", "a", "b", "Ġ", "ab", "Ġab", "c", "1", "Ġb"];
const BPE_TYPES: &[i32] = &[3, 3, 4, 1, 1, 1, 1, 1, 1, 1, 1];
const BPE_MERGES: &[&str] = &["a b", "Ġ ab", "Ġ b"];

fn bpe_file(buf: &mut [u8], pre: &str) -> usize {
    let mut w = W { b: buf, n: 0 };
    w.header(6);
    w.kv_str("tokenizer.ggml.model", "gpt2");
    w.kv_str("tokenizer.ggml.pre", pre);
    w.kv_strs("tokenizer.ggml.tokens", BPE_TOKENS);
    w.kv_i32s("tokenizer.ggml.token_type", BPE_TYPES);
    w.kv_strs("tokenizer.ggml.merges", BPE_MERGES);
    w.kv_u32("tokenizer.ggml.eos_token_id", 0);
    w.n
}

fn run<'t>(tok: &Tokenizer<'_>, text: &str, add: bool, parse: bool, out: &'t mut [u32]) -> &'t [u32] {
    let mut work = [0u8; 4096];
    let n = tok.tokenize(text, add, parse, out, &mut work).unwrap();
    &out[..n]
}

#[test]
fn small_bpe_vocabulary() {
    let mut buf = [0u8; 2048];
    let n = bpe_file(&mut buf, "smollm");
    let g = Gguf::parse(&buf[..n]).unwrap();
    let mut mem = [0u8; 40_000];
    assert!(Tokenizer::memory_bytes(&g).unwrap() <= mem.len());
    let tok = Tokenizer::new(&g, &mut mem).unwrap();
    assert_eq!(tok.model(), Model::Bpe(PreTokenizer::Smollm));
    let mut out = [0u32; 32];
    assert_eq!(run(&tok, "ab ab b", false, false, &mut out), [6, 7, 10]);
    // Digits split one by one; a user-defined token is split out even without parse_special.
    assert_eq!(run(&tok, "c11<u>a", false, false, &mut out), [8, 9, 9, 2, 3]);
    // A control token is text unless parse_special (its bytes have no tokens: dropped).
    assert_eq!(run(&tok, "a<|im_end|>", false, true, &mut out), [3, 1]);
    // EOS is added only when add_eos says so (it does not here); EOG by text.
    assert_eq!(run(&tok, "a", true, false, &mut out), [3]);
    assert!(tok.is_eog(0) && tok.is_eog(1) && !tok.is_eog(2));
    assert_eq!(tok.eot(), Some(1));
    assert!(tok.token_attr(1).unwrap().is_control());

    let mut piece = [0u8; 16];
    let k = tok.piece(7, false, &mut piece).unwrap();
    assert_eq!(&piece[..k], b" ab");
    assert_eq!(tok.piece(1, false, &mut piece).unwrap(), 0);
    let k = tok.piece(1, true, &mut piece).unwrap();
    assert_eq!(&piece[..k], b"<|im_end|>");
    assert!(matches!(tok.piece(99, true, &mut piece), Err(TokenizerError::BadTokenId { id: 99, .. })));
    assert!(matches!(tok.piece(1, true, &mut piece[..3]), Err(TokenizerError::BufferTooSmall { needed: 10, got: 3 })));

    let mut small = [0u32; 1];
    let mut work = [0u8; 4096];
    assert_eq!(tok.tokenize("ab ab b", false, false, &mut small, &mut work), Err(TokenizerError::OutOfSpace { needed: 3, capacity: 1 }));
}

#[test]
fn unknown_pre_tokenizer_is_an_error() {
    let mut buf = [0u8; 2048];
    let n = bpe_file(&mut buf, "tiktoken-of-the-future");
    let g = Gguf::parse(&buf[..n]).unwrap();
    match Tokenizer::memory_bytes(&g) {
        Err(TokenizerError::UnknownPreTokenizer(name)) => assert_eq!(name.as_str(), "tiktoken-of-the-future"),
        other => panic!("{other:?}"),
    }
}

// A SentencePiece vocabulary with byte fallback.
const SPM_TOKENS: &[&str] = &["<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "<0xA9>", "▁", "a", "b", "ab", "▁ab", "▁a", "  "];
const SPM_TYPES: &[i32] = &[2, 3, 3, 6, 6, 6, 1, 1, 1, 1, 1, 1, 4];
const SPM_SCORES: &[f32] = &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -5.0, -4.0, -4.0, -2.0, -1.0, -3.0, 0.0];

#[test]
fn small_spm_vocabulary() {
    let mut buf = [0u8; 2048];
    let mut w = W { b: &mut buf, n: 0 };
    w.header(5);
    w.kv_str("tokenizer.ggml.model", "llama");
    w.kv_strs("tokenizer.ggml.tokens", SPM_TOKENS);
    w.kv_i32s("tokenizer.ggml.token_type", SPM_TYPES);
    w.kv_f32s("tokenizer.ggml.scores", SPM_SCORES);
    w.kv_bool("tokenizer.ggml.add_space_prefix", true);
    let n = w.n;
    let g = Gguf::parse(&buf[..n]).unwrap();
    let mut mem = [0u8; 40_000];
    let tok = Tokenizer::new(&g, &mut mem).unwrap();
    assert_eq!(tok.model(), Model::Spm);
    assert!(tok.add_bos() && !tok.add_eos());
    let mut out = [0u32; 32];
    // BOS, then "▁ab" (score -1 beats "▁a" + "b"), byte fallback for é and \n.
    assert_eq!(run(&tok, "ab é\n", true, false, &mut out), [1, 10, 6, 4, 5, 3]);
    // The user-defined "  " is split out; the prefix space follows it.
    assert_eq!(run(&tok, "a  a", false, false, &mut out), [11, 12, 11]);
    assert!(tok.is_eog(2));

    let mut piece = [0u8; 8];
    let k = tok.piece(10, false, &mut piece).unwrap();
    assert_eq!(&piece[..k], b" ab");
    let k = tok.piece(4, false, &mut piece).unwrap();
    assert_eq!(&piece[..k], &[0xC3]);
    assert_eq!(tok.piece(1, false, &mut piece).unwrap(), 0);
}

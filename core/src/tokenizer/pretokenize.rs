//! Pre-tokenizers for byte-level BPE: hand-written matchers for llama.cpp's regexes.
//!
//! Owns: the names accepted in `tokenizer.ggml.pre`, and splitting a text fragment
//! into the words BPE merges within. llama.cpp applies a list of regexes in turn,
//! each to every piece the previous one produced, keeping both the matches and the
//! text between them as pieces. Two of its regexes have hand-written matchers there
//! too (GPT-2's and LLaMA 3's); the others run through `std::regex` over a
//! "collapsed" text where every non-ASCII code point becomes one byte standing for
//! its class (`\s` → 0x0B, `\p{N}` → 0xD1, `\p{L}` → 0xD2, `\p{P}` → 0xD3, ...) and
//! ASCII stays itself. The matchers here reproduce both behaviours, including where
//! they differ (the collapsed regexes see only A-Z/a-z as ASCII letters, 0-9 as
//! ASCII digits, and C-locale `\s`). Pieces are byte ranges of the fragment.

use super::error::LoopError;
use super::unicode::{ascii_lower, decode, flags, Class, Flags};

/// Which pre-tokenizer a BPE vocabulary uses (from `tokenizer.ggml.pre`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// llama.cpp's default: punctuation runs, GPT-2, number runs, ASCII digit triples.
    Default,
    /// The GPT-2 pattern.
    Gpt2,
    /// Every digit alone, then the GPT-2 pattern (SmolLM, StarCoder, ...).
    Smollm,
    /// The LLaMA 3 pattern (digits in groups of up to three).
    Llama3,
    /// The Qwen2 pattern (LLaMA 3's with single digits).
    Qwen2,
}

/// Pre-tokenizer names keel accepts, for error messages.
pub(crate) const KNOWN_NAMES: &str = "default; gpt2, gpt-2, phi-2, mpt, olmo, jais; smollm, starcoder, refact, command-r, codeshell, exaone, minerva-7b, mellum2; \
llama3, llama-v3, llama-bpe, falcon3, falcon-h1, pixtral, midm-2.0, lfm2, jina-v5-nano, dbrx, smaug-bpe; qwen2, deepseek-r1-qwen, kormo, f2llmv2, stablelm2, hunyuan, solar-open, megrez";

/// What a `tokenizer.ggml.pre` name selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PreConfig {
    pub pre: PreTokenizer,
    /// A whole word that is a token is emitted as is (llama.cpp `ignore_merges`).
    pub ignore_merges: bool,
    /// BOS is added unless `tokenizer.ggml.add_bos_token` says otherwise.
    pub add_bos: bool,
}

impl PreConfig {
    /// The configuration llama.cpp uses for `name` (`None` if keel does not know it).
    pub(crate) fn from_name(name: &[u8]) -> Option<PreConfig> {
        let c = |pre, ignore_merges, add_bos| Some(PreConfig { pre, ignore_merges, add_bos });
        match name {
            b"default" => c(PreTokenizer::Default, false, false),
            b"gpt2" | b"gpt-2" | b"phi-2" | b"mpt" | b"olmo" | b"jais" => c(PreTokenizer::Gpt2, false, false),
            b"smollm" | b"starcoder" | b"refact" | b"command-r" | b"codeshell" | b"exaone" | b"minerva-7b" | b"mellum2" => c(PreTokenizer::Smollm, false, false),
            b"llama3" | b"llama-v3" | b"llama-bpe" | b"falcon3" | b"falcon-h1" | b"pixtral" | b"midm-2.0" | b"lfm2" | b"jina-v5-nano" => c(PreTokenizer::Llama3, true, true),
            b"dbrx" | b"smaug-bpe" => c(PreTokenizer::Llama3, false, false),
            b"qwen2" | b"deepseek-r1-qwen" | b"kormo" | b"f2llmv2" | b"stablelm2" | b"hunyuan" | b"solar-open" | b"megrez" => c(PreTokenizer::Qwen2, false, false),
            _ => None,
        }
    }
}

/// One regex of a pre-tokenizer's list.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// `\p{N}` (collapsed): each number alone.
    Digit,
    /// `[\p{P}\$\+<=>\^~\|]+` (collapsed).
    PunctRun,
    /// `\p{N}+` (collapsed).
    NumberRun,
    /// `[0-9][0-9][0-9]`.
    AsciiDigits3,
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// LLaMA 3 (hand-written in llama.cpp).
    Llama3,
    /// Qwen2 (through collapsed `std::regex` in llama.cpp).
    Qwen2,
}

impl PreTokenizer {
    fn stages(self) -> &'static [Stage] {
        match self {
            PreTokenizer::Default => &[Stage::PunctRun, Stage::Gpt2, Stage::NumberRun, Stage::AsciiDigits3],
            PreTokenizer::Gpt2 => &[Stage::Gpt2],
            PreTokenizer::Smollm => &[Stage::Digit, Stage::Gpt2],
            PreTokenizer::Llama3 => &[Stage::Llama3],
            PreTokenizer::Qwen2 => &[Stage::Qwen2],
        }
    }

    /// Calls `f` on each word BPE would merge within, in order (the pre-tokenizer's
    /// split of `text`, with no special tokens cut out).
    pub fn for_each_word(self, text: &str, mut f: impl FnMut(&str)) {
        // Pieces of valid UTF-8 split at code-point boundaries are valid UTF-8.
        let _ = self.split(text.as_bytes(), &mut |w| {
            f(core::str::from_utf8(w).unwrap_or_default());
            Ok(())
        });
    }

    /// Splits `text` into words, calling `word` on each in order.
    pub(crate) fn split(self, text: &[u8], word: &mut dyn FnMut(&[u8]) -> Result<(), LoopError>) -> Result<(), LoopError> {
        run(self.stages(), text, word)
    }
}

fn run(stages: &[Stage], s: &[u8], word: &mut dyn FnMut(&[u8]) -> Result<(), LoopError>) -> Result<(), LoopError> {
    match stages.split_first() {
        None => word(s),
        Some((stage, rest)) => {
            let mut each = |a: usize, b: usize| run(rest, &s[a..b], word);
            match stage {
                Stage::Digit => split_class(s, is_n_collapsed, false, &mut each),
                Stage::PunctRun => split_class(s, is_punct_default, true, &mut each),
                Stage::NumberRun => split_class(s, is_n_collapsed, true, &mut each),
                Stage::AsciiDigits3 => split_digits3(s, &mut each),
                Stage::Gpt2 => Cursor::new(s).gpt2(&mut each),
                Stage::Llama3 => Cursor::new(s).llama3(&mut each),
                Stage::Qwen2 => Cursor::new(s).qwen2(&mut each),
            }
        }
    }
}

type Emit<'e> = dyn FnMut(usize, usize) -> Result<(), LoopError> + 'e;

// ---- classes as the collapsed std::regex sees them ----

fn is_s_collapsed(cp: u32) -> bool {
    if cp < 0x80 { cp == 0x20 || (0x09..=0x0D).contains(&cp) } else { flags(cp).space }
}
fn collapsed_class(cp: u32, class: Class) -> bool {
    let f = flags(cp);
    !f.space && f.class == class
}
fn is_l_collapsed(cp: u32) -> bool {
    if cp < 0x80 { (cp as u8).is_ascii_alphabetic() } else { collapsed_class(cp, Class::Letter) }
}
fn is_n_collapsed(cp: u32) -> bool {
    if cp < 0x80 { (cp as u8).is_ascii_digit() } else { collapsed_class(cp, Class::Number) }
}
fn is_punct_default(cp: u32) -> bool {
    if cp < 0x80 { b"!\"#%&'()*,-./:;?@[\\]_{}$+<=>^~|".contains(&(cp as u8)) } else { collapsed_class(cp, Class::Punct) }
}

/// Matches of a one-character class (a run of them if `run`), with the text between.
fn split_class(s: &[u8], is: fn(u32) -> bool, run: bool, emit: &mut Emit<'_>) -> Result<(), LoopError> {
    let (mut pos, mut gap) = (0, 0);
    while pos < s.len() {
        let (cp, l) = decode(s, pos);
        if !is(cp) {
            pos += l;
            continue;
        }
        if gap < pos {
            emit(gap, pos)?;
        }
        let start = pos;
        pos += l;
        while run && pos < s.len() {
            let (cp, l) = decode(s, pos);
            if !is(cp) {
                break;
            }
            pos += l;
        }
        emit(start, pos)?;
        gap = pos;
    }
    if gap < s.len() {
        emit(gap, s.len())?;
    }
    Ok(())
}

/// `[0-9][0-9][0-9]`, leftmost-first, with the text between.
fn split_digits3(s: &[u8], emit: &mut Emit<'_>) -> Result<(), LoopError> {
    let (mut pos, mut gap) = (0, 0);
    while pos + 3 <= s.len() {
        if s[pos..pos + 3].iter().all(u8::is_ascii_digit) {
            if gap < pos {
                emit(gap, pos)?;
            }
            emit(pos, pos + 3)?;
            pos += 3;
            gap = pos;
        } else {
            pos += 1;
        }
    }
    if gap < s.len() {
        emit(gap, s.len())?;
    }
    Ok(())
}

/// Walks a piece by code point; positions are byte offsets, `None` past the end
/// (llama.cpp's "out of range" code point, whose flags are all zero).
struct Cursor<'s> {
    s: &'s [u8],
    prev_end: usize,
}

impl<'s> Cursor<'s> {
    fn new(s: &'s [u8]) -> Self {
        Cursor { s, prev_end: 0 }
    }

    fn cp(&self, i: usize) -> Option<(u32, usize)> {
        (i < self.s.len()).then(|| decode(self.s, i))
    }

    fn fl(&self, i: usize) -> Option<Flags> {
        self.cp(i).map(|(c, _)| flags(c))
    }

    /// Code point at `i` and the position after it.
    fn next(&self, i: usize) -> (u32, usize) {
        let (c, l) = decode(self.s, i);
        (c, i + l)
    }

    /// Advances from `i` while `pred` holds for the code point there.
    fn skip(&self, mut i: usize, pred: impl Fn(u32) -> bool) -> usize {
        while let Some((c, l)) = self.cp(i) {
            if !pred(c) {
                break;
            }
            i += l;
        }
        i
    }

    /// Emits the piece ending at `end`; returns `end`.
    fn add(&mut self, end: usize, emit: &mut Emit<'_>) -> Result<usize, LoopError> {
        if end > self.prev_end {
            emit(self.prev_end, end)?;
        }
        self.prev_end = end;
        Ok(end)
    }

    /// Contraction after an apostrophe at `pos` (whose successor starts at `p1`):
    /// the end of `'s 't 'm 'd 're 've 'll`, letters lowered by `lower`.
    fn contraction(&self, p1: usize, lower: fn(u32) -> u32) -> Option<usize> {
        let (c1, p2) = self.cp(p1).map(|(c, l)| (lower(c), p1 + l))?;
        if matches!(char::from_u32(c1), Some('s' | 't' | 'm' | 'd')) {
            return Some(p2);
        }
        let (c2, p3) = self.cp(p2).map(|(c, l)| (lower(c), p2 + l))?;
        let pair = (char::from_u32(c1)?, char::from_u32(c2)?);
        matches!(pair, ('r', 'e') | ('v', 'e') | ('l', 'l')).then_some(p3)
    }

    /// A whitespace run from `pos`: (end, start of its last code point, count,
    /// position after its last `\r`/`\n`).
    fn space_run(&self, pos: usize, is_space: fn(u32) -> bool) -> (usize, usize, usize, Option<usize>) {
        let (mut i, mut last, mut n, mut rn) = (pos, pos, 0, None);
        while let Some((c, l)) = self.cp(i) {
            if !is_space(c) {
                break;
            }
            if c == '\r' as u32 || c == '\n' as u32 {
                rn = Some(i + l);
            }
            last = i;
            n += 1;
            i += l;
        }
        (i, last, n, rn)
    }

    /// llama.cpp's hand-written GPT-2 matcher.
    fn gpt2(mut self, emit: &mut Emit<'_>) -> Result<(), LoopError> {
        let len = self.s.len();
        let mut pos = 0;
        while pos < len {
            let (cpt, next) = self.next(pos);
            if cpt == '\'' as u32 {
                if let Some(end) = self.contraction(next, |c| c) {
                    pos = self.add(end, emit)?;
                    continue;
                }
            }
            let f2 = if cpt == ' ' as u32 { self.fl(next) } else { Some(flags(cpt)) };
            let start = if cpt == ' ' as u32 { next } else { pos };
            if let Some(f2) = f2 {
                if f2.letter() {
                    pos = self.add(self.skip(start, |c| flags(c).letter()), emit)?;
                    continue;
                }
                if f2.number() {
                    pos = self.add(self.skip(start, |c| flags(c).number()), emit)?;
                    continue;
                }
                if !(f2.space || f2.letter() || f2.number()) {
                    let other = |c| {
                        let f = flags(c);
                        !(f.space || f.letter() || f.number())
                    };
                    pos = self.add(self.skip(start, other), emit)?;
                    continue;
                }
            }
            let (end, last, n, _) = self.space_run(pos, super::unicode::is_space);
            pos = if n > 1 && end < len {
                self.add(last, emit)?
            } else if n > 0 {
                self.add(end, emit)?
            } else {
                self.add(next, emit)?
            };
        }
        Ok(())
    }

    /// llama.cpp's hand-written LLaMA 3 matcher:
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    fn llama3(mut self, emit: &mut Emit<'_>) -> Result<(), LoopError> {
        let len = self.s.len();
        let mut pos = 0;
        while pos < len {
            let (cpt, next) = self.next(pos);
            let f = flags(cpt);
            if cpt == '\'' as u32 {
                if let Some(end) = self.contraction(next, ascii_lower) {
                    pos = self.add(end, emit)?;
                    continue;
                }
            }
            if !(cpt == '\r' as u32 || cpt == '\n' as u32 || f.number()) && (f.letter() || self.fl(next).is_some_and(|f| f.letter())) {
                pos = self.add(self.skip(next, |c| flags(c).letter()), emit)?;
                continue;
            }
            if f.number() {
                let mut count = 0;
                while let Some((c, l)) = self.cp(pos) {
                    if !flags(c).number() {
                        break;
                    }
                    pos += l;
                    count += 1;
                    if count == 3 {
                        self.add(pos, emit)?;
                        count = 0;
                    }
                }
                self.add(pos, emit)?;
                continue;
            }
            let f2 = if cpt == ' ' as u32 { self.fl(next) } else { Some(f) };
            if f2.is_none_or(|f2| !(f2.space || f2.letter() || f2.number())) {
                let start = if cpt == ' ' as u32 { next } else { pos };
                let end = self.skip(start, |c| {
                    let f = flags(c);
                    !(f.space || f.letter() || f.number())
                });
                let end = self.skip(end, |c| c == '\r' as u32 || c == '\n' as u32);
                pos = self.add(end, emit)?;
                continue;
            }
            let (end, last, n, rn) = self.space_run(pos, super::unicode::is_space);
            pos = if let Some(rn) = rn {
                self.add(rn, emit)?
            } else if n > 1 && end < len {
                self.add(last, emit)?
            } else if n > 0 {
                self.add(end, emit)?
            } else {
                self.add(next, emit)?
            };
        }
        Ok(())
    }

    /// The Qwen2 regex as `std::regex` (ECMAScript, leftmost alternative) runs it on
    /// collapsed text:
    /// `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    /// Every code point is a letter, a number, a space or "other", so some
    /// alternative always matches and no text falls between matches.
    fn qwen2(mut self, emit: &mut Emit<'_>) -> Result<(), LoopError> {
        let other = |c: u32| !(is_s_collapsed(c) || is_l_collapsed(c) || is_n_collapsed(c));
        let len = self.s.len();
        let mut pos = 0;
        while pos < len {
            let (c0, next) = self.next(pos);
            if c0 == '\'' as u32 {
                if let Some(end) = self.contraction(next, ascii_lower) {
                    pos = self.add(end, emit)?;
                    continue;
                }
            }
            if is_l_collapsed(c0) {
                pos = self.add(self.skip(next, is_l_collapsed), emit)?;
                continue;
            }
            let c1 = self.cp(next).map(|(c, _)| c);
            if c0 != '\r' as u32 && c0 != '\n' as u32 && !is_n_collapsed(c0) && c1.is_some_and(is_l_collapsed) {
                pos = self.add(self.skip(next, is_l_collapsed), emit)?;
                continue;
            }
            if is_n_collapsed(c0) {
                pos = self.add(next, emit)?;
                continue;
            }
            let start = if c0 == ' ' as u32 && c1.is_some_and(other) {
                Some(next)
            } else if other(c0) {
                Some(pos)
            } else {
                None
            };
            if let Some(start) = start {
                let end = self.skip(start, other);
                pos = self.add(self.skip(end, |c| c == '\r' as u32 || c == '\n' as u32), emit)?;
                continue;
            }
            // c0 is whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+
            let (end, last, n, rn) = self.space_run(pos, is_s_collapsed);
            pos = if let Some(rn) = rn {
                self.add(rn, emit)?
            } else if end == len || n < 2 {
                self.add(end, emit)?
            } else {
                self.add(last, emit)?
            };
        }
        Ok(())
    }
}

//! Token ids back to bytes, and streaming those bytes out as whole UTF-8 characters.
//!
//! Owns: `Tokenizer::piece` (llama.cpp's `token_to_piece`: GPT-2 alphabet → bytes
//! for BPE, `▁` → space for SentencePiece, `<0xAB>` byte tokens → the byte, control
//! and unknown tokens only when `special` is asked for) and `Utf8Stream`, which holds
//! back an incomplete multi-byte character until its last byte arrives. Does not
//! apply llama.cpp's whole-text clean-ups (`clean_up_tokenization_spaces`, dropping
//! the SentencePiece prefix space); callers that want them do them on the text.

use super::spm::SPACE;
use super::unicode::{cp_to_byte, decode, encode};
use super::{Model, TokenAttr, Tokenizer, TokenizerError};

/// Counts bytes, writing those that fit.
struct Out<'o> {
    buf: &'o mut [u8],
    n: usize,
}

impl Out<'_> {
    fn put(&mut self, b: &[u8]) {
        if let Some(dst) = self.buf.get_mut(self.n..self.n + b.len()) {
            dst.copy_from_slice(b);
        }
        self.n += b.len();
    }
}

/// llama.cpp's `token_to_byte`: the two hex digits after `<0x`.
fn byte_of(text: &[u8]) -> u8 {
    let mut v = 0u8;
    for &c in text.iter().skip(3).take(2) {
        match (c as char).to_digit(16) {
            Some(d) => v = (v << 4) | d as u8,
            None => break,
        }
    }
    v
}

impl Tokenizer<'_> {
    fn render(&self, id: u32, special: bool, out: &mut Out<'_>) {
        let a = TokenAttr(self.attrs[id as usize]);
        if !special && a.has(TokenAttr::UNKNOWN | TokenAttr::CONTROL) {
            return;
        }
        let text = self.idx.text(id);
        if a.has(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED) {
            out.put(text);
        } else if a.has(TokenAttr::NORMAL) {
            match self.model {
                Model::Spm => {
                    let mut rest = text;
                    while let Some(i) = rest.windows(3).position(|w| w == SPACE) {
                        out.put(&rest[..i]);
                        out.put(b" ");
                        rest = &rest[i + 3..];
                    }
                    out.put(rest);
                }
                Model::Bpe(_) => {
                    let mut i = 0;
                    while i < text.len() {
                        let (cp, l) = decode(text, i);
                        i += l;
                        if let Some(b) = cp_to_byte(cp) {
                            out.put(&[b]);
                        } else {
                            // llama.cpp's marker for a character outside the byte alphabet.
                            let mut utf8 = [0u8; 4];
                            let n = encode(cp, &mut utf8);
                            out.put(b"[UNK_BYTE_0x");
                            for &b in &utf8[..n] {
                                const HEX: &[u8; 16] = b"0123456789abcdef";
                                out.put(&[HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
                            }
                            out.put(text);
                            out.put(b"]");
                        }
                    }
                }
            }
        } else if a.is_byte() {
            out.put(&[byte_of(text)]);
        }
    }

    /// Bytes of the piece of `id`.
    pub(crate) fn piece_len(&self, id: u32, special: bool) -> usize {
        let mut out = Out { buf: &mut [], n: 0 };
        self.render(id, special, &mut out);
        out.n
    }

    /// Writes the bytes token `id` stands for into `out`, returning their count.
    /// `special` renders control and unknown tokens as their text (otherwise they
    /// are empty). A piece can be part of a UTF-8 character: stream pieces through a
    /// [`Utf8Stream`]. `out` of [`Tokenizer::max_piece_len`] bytes always suffices.
    pub fn piece(&self, id: u32, special: bool, out: &mut [u8]) -> Result<usize, TokenizerError> {
        if id >= self.n_vocab() {
            return Err(TokenizerError::BadTokenId { id, n_vocab: self.n_vocab() });
        }
        let got = out.len();
        let mut o = Out { buf: out, n: 0 };
        self.render(id, special, &mut o);
        if o.n > got {
            return Err(TokenizerError::BufferTooSmall { needed: o.n, got });
        }
        Ok(o.n)
    }

    /// The longest piece any token renders to (with `special`), in bytes.
    pub fn max_piece_len(&self) -> usize {
        self.max_piece
    }
}

/// Turns a stream of byte pieces into text without ever splitting a character:
/// an incomplete UTF-8 sequence at the end of a piece waits for the next piece.
/// Bytes become U+FFFD only once they are certainly invalid (one U+FFFD per
/// maximal invalid sequence, like `String::from_utf8_lossy`).
#[derive(Clone, Debug, Default)]
pub struct Utf8Stream {
    pending: [u8; 4],
    len: usize,
}

impl Utf8Stream {
    /// An empty stream.
    pub const fn new() -> Self {
        Utf8Stream { pending: [0; 4], len: 0 }
    }

    /// Bytes held back (the start of a character not yet complete).
    pub fn pending(&self) -> &[u8] {
        &self.pending[..self.len]
    }

    /// Feeds `bytes`; `emit` receives every complete stretch of text, in order.
    pub fn push(&mut self, mut bytes: &[u8], mut emit: impl FnMut(&str)) {
        // Finish the held-back character first; it is always a valid prefix.
        while self.len > 0 && !bytes.is_empty() {
            let mut cand = self.pending;
            cand[self.len] = bytes[0];
            match core::str::from_utf8(&cand[..self.len + 1]) {
                Ok(s) => {
                    emit(s);
                    self.len = 0;
                    bytes = &bytes[1..];
                }
                Err(e) if e.error_len().is_none() => {
                    self.pending = cand;
                    self.len += 1;
                    bytes = &bytes[1..];
                }
                Err(_) => {
                    // The held prefix cannot be completed; the new byte starts afresh.
                    emit("\u{FFFD}");
                    self.len = 0;
                }
            }
        }
        while !bytes.is_empty() {
            match core::str::from_utf8(bytes) {
                Ok(s) => {
                    emit(s);
                    return;
                }
                Err(e) => {
                    let (good, rest) = bytes.split_at(e.valid_up_to());
                    if !good.is_empty() {
                        emit(core::str::from_utf8(good).unwrap_or_default());
                    }
                    match e.error_len() {
                        None => {
                            self.pending[..rest.len()].copy_from_slice(rest);
                            self.len = rest.len();
                            return;
                        }
                        Some(k) => {
                            emit("\u{FFFD}");
                            bytes = &rest[k..];
                        }
                    }
                }
            }
        }
    }

    /// Ends the stream: a held-back incomplete character becomes U+FFFD.
    pub fn finish(&mut self, mut emit: impl FnMut(&str)) {
        if self.len > 0 {
            emit("\u{FFFD}");
            self.len = 0;
        }
    }
}

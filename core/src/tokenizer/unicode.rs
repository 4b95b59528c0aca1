//! Code-point classes, lenient UTF-8 decoding and the GPT-2 byte↔unicode mapping.
//!
//! Owns: the character facts the pre-tokenizers and BPE need, as llama.cpp defines
//! them (its `unicode.cpp`): one general-category class per code point (`\p{N}`,
//! `\p{L}`, `\p{P}`, ...; unassigned code points are "undefined"), whitespace as the
//! Unicode White_Space property, UTF-8 decoding that turns each bad byte into
//! U+FFFD, and the byte-level BPE alphabet. The class table is generated
//! (`gen_unicode_tables.py`, Unicode 15.1 like llama.cpp's). Knows nothing of tokens.

use super::unicode_tables::RANGES;

/// General-category class of a code point (llama.cpp's `unicode_cpt_flags` categories).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Class {
    /// Unassigned (Cn), or a value past U+10FFFF.
    Undefined = 0,
    /// `\p{N}`.
    Number = 1,
    /// `\p{L}`.
    Letter = 2,
    /// `\p{Z}`.
    Separator = 3,
    /// `\p{M}`.
    Mark = 4,
    /// `\p{P}`.
    Punct = 5,
    /// `\p{S}`.
    Symbol = 6,
    /// `\p{C}` other than Cn (Cc, Cf, Cs, Co).
    Control = 7,
}

/// Class and whitespace bit of one code point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flags {
    /// The general-category class.
    pub class: Class,
    /// Unicode White_Space (what llama.cpp's `\s` means).
    pub space: bool,
}

impl Flags {
    /// `\p{L}`.
    pub fn letter(self) -> bool {
        self.class == Class::Letter
    }

    /// `\p{N}`.
    pub fn number(self) -> bool {
        self.class == Class::Number
    }
}

const CLASSES: [Class; 8] = [Class::Undefined, Class::Number, Class::Letter, Class::Separator, Class::Mark, Class::Punct, Class::Symbol, Class::Control];

fn decode_entry(e: u32) -> Flags {
    Flags { class: CLASSES[(e & 7) as usize], space: e & 8 != 0 }
}

const fn build_ascii() -> [u8; 128] {
    let mut t = [0u8; 128];
    let mut c = 0;
    while c < 128 {
        let mut i = 0;
        while i + 1 < RANGES.len() && RANGES[i + 1] >> 8 <= c {
            i += 1;
        }
        t[c as usize] = (RANGES[i] & 0xFF) as u8;
        c += 1;
    }
    t
}

/// The table's entries for ASCII, looked up directly.
static ASCII: [u8; 128] = build_ascii();

/// Class and whitespace bit of `cp`.
#[inline]
pub fn flags(cp: u32) -> Flags {
    if cp < 0x80 {
        return decode_entry(ASCII[cp as usize] as u32);
    }
    if cp >= 0x11_0000 {
        return Flags { class: Class::Undefined, space: false };
    }
    // Last entry whose start is <= cp (entry 0 starts at 0).
    let key = (cp << 8) | 0xFF;
    let i = RANGES.partition_point(|&e| e <= key);
    decode_entry(RANGES[i - 1])
}

/// True if `cp` is White_Space.
pub fn is_space(cp: u32) -> bool {
    flags(cp).space
}

/// Length of the UTF-8 sequence a lead byte announces, as llama.cpp's
/// `unicode_len_utf8` counts it (continuation bytes count as 1).
pub fn utf8_len(lead: u8) -> usize {
    const LEN: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LEN[(lead >> 4) as usize] as usize
}

/// Decodes the code point at `s[i..]` the way llama.cpp's `unicode_cpts_from_utf8`
/// does: a malformed or truncated sequence yields U+FFFD and consumes one byte.
/// Returns `(code point, bytes consumed)`; `i` must be `< s.len()`.
pub fn decode(s: &[u8], i: usize) -> (u32, usize) {
    let b0 = s[i] as u32;
    let cont = |k: usize| s.get(i + k).is_some_and(|&b| b & 0xC0 == 0x80);
    let c = |k: usize| (s[i + k] & 0x3F) as u32;
    if b0 & 0x80 == 0 {
        (b0, 1)
    } else if b0 & 0x40 == 0 {
        (0xFFFD, 1)
    } else if b0 & 0x20 == 0 {
        if cont(1) { (((b0 & 0x1F) << 6) | c(1), 2) } else { (0xFFFD, 1) }
    } else if b0 & 0x10 == 0 {
        if cont(1) && cont(2) { (((b0 & 0x0F) << 12) | (c(1) << 6) | c(2), 3) } else { (0xFFFD, 1) }
    } else if b0 & 0x08 == 0 {
        if cont(1) && cont(2) && cont(3) { (((b0 & 0x07) << 18) | (c(1) << 12) | (c(2) << 6) | c(3), 4) } else { (0xFFFD, 1) }
    } else {
        (0xFFFD, 1)
    }
}

/// Writes the UTF-8 encoding of `cp` (any value below 0x20_0000, as llama.cpp's
/// encoder accepts) into `out`, returning the length.
pub fn encode(cp: u32, out: &mut [u8; 4]) -> usize {
    if cp < 0x80 {
        out[0] = cp as u8;
        1
    } else if cp < 0x800 {
        out[0] = 0xC0 | (cp >> 6) as u8;
        out[1] = 0x80 | (cp & 0x3F) as u8;
        2
    } else if cp < 0x1_0000 {
        out[0] = 0xE0 | (cp >> 12) as u8;
        out[1] = 0x80 | ((cp >> 6) & 0x3F) as u8;
        out[2] = 0x80 | (cp & 0x3F) as u8;
        3
    } else {
        out[0] = 0xF0 | ((cp >> 18) & 0x07) as u8;
        out[1] = 0x80 | ((cp >> 12) & 0x3F) as u8;
        out[2] = 0x80 | ((cp >> 6) & 0x3F) as u8;
        out[3] = 0x80 | (cp & 0x3F) as u8;
        4
    }
}

/// True for the bytes GPT-2's byte-level alphabet maps to themselves
/// (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`).
const fn byte_is_printable(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn build_byte_to_cp() -> [u16; 256] {
    let mut t = [0u16; 256];
    let mut n = 0u16;
    let mut b = 0usize;
    while b < 256 {
        t[b] = if byte_is_printable(b as u8) {
            b as u16
        } else {
            n += 1;
            255 + n
        };
        b += 1;
    }
    t
}

const fn build_shifted() -> [u8; 68] {
    let mut t = [0u8; 68];
    let mut n = 0usize;
    let mut b = 0usize;
    while b < 256 {
        if !byte_is_printable(b as u8) {
            t[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    t
}

/// GPT-2 byte-level BPE: the code point standing for each byte.
pub static BYTE_TO_CP: [u16; 256] = build_byte_to_cp();
/// The bytes standing as U+0100.. U+0143, in order.
static SHIFTED: [u8; 68] = build_shifted();

/// The byte a GPT-2 alphabet code point stands for (`None` outside the alphabet).
pub fn cp_to_byte(cp: u32) -> Option<u8> {
    match cp {
        0..=0xFF if byte_is_printable(cp as u8) => Some(cp as u8),
        0x100..=0x143 => Some(SHIFTED[(cp - 0x100) as usize]),
        _ => None,
    }
}

/// ASCII lowercase (the only lowering llama3's contraction rule can observe; the
/// table generator asserts no other code point lowers to the letters it tests).
pub fn ascii_lower(cp: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&cp) { cp + 32 } else { cp }
}

//! IEEE binary16 ⇄ binary32 conversions, exact and round-to-nearest-even, for
//! no_std code on both sides (the DSP has no scalar half-precision unit).

/// Widens a binary16 bit pattern to `f32` (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from(h >> 10) & 0x1f;
    let man = u32::from(h) & 0x3ff;
    let bits = match exp {
        0 => {
            // Zero or subnormal: man · 2^-24, exact in f32.
            let v = man as f32 * (1.0 / 16_777_216.0);
            return f32::from_bits(v.to_bits() | sign);
        }
        31 => sign | 0x7f80_0000 | man << 13,
        _ => sign | (exp + 112) << 23 | man << 13,
    };
    f32::from_bits(bits)
}

/// Narrows `f32` to a binary16 bit pattern, rounding to nearest, ties to even.
/// Overflow gives ±infinity; NaN stays NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        let nan = if man != 0 { 0x200 | (man >> 13) as u16 } else { 0 };
        return sign | 0x7c00 | nan;
    }
    let e = exp - 112; // rebias 127 → 15
    if e >= 31 {
        return sign | 0x7c00;
    }
    let (mut out, rem, half) = if e <= 0 {
        if e < -10 {
            return sign; // below half the smallest subnormal
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32; // 14..=24
        (m >> shift, m & ((1 << shift) - 1), 1u32 << (shift - 1))
    } else {
        ((e as u32) << 10 | man >> 13, man & 0x1fff, 0x1000)
    };
    if rem > half || (rem == half && out & 1 == 1) {
        out += 1; // may carry into the exponent: still the right encoding
    }
    sign | out as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_f16() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f32_to_f16(f) & 0x7c00 == 0x7c00 && f32_to_f16(f) & 0x3ff != 0);
            } else {
                assert_eq!(f32_to_f16(f), h, "h={h:#06x}");
            }
        }
    }

    #[test]
    fn ties_and_limits() {
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // tie rounds to even = overflow
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00); // tie to even (down)
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02); // tie to even (up)
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0x0000); // tie to even zero
        assert_eq!(f32_to_f16(2f32.powi(-25) * 1.5), 0x0001);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
    }
}

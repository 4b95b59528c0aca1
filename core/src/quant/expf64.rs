//! `ops::expf`'s bits (the f64 exponential rounded to f32) without a division: for `x` in
//! (−87, 88), `e^x = 2^(k/128) · e^r` with `k = round(x·128/ln 2)` and `|r| <= ln 2/256`,
//! `2^(j/128)` from a table (correctly rounded f64, below) times `2^(k >> 7)` (added to
//! its exponent), and `e^r` by its Taylor polynomial of degree 4 in f64 (the truncation
//! below 2^-49 of the result, each rounding 2^-53). libm's `exp` is within one f64 ulp of
//! `e^x`, so both round to the same f32 unless `e^x` lies within ~2^-48 of a point halfway
//! between two f32s: a result whose 29 dropped bits are within 2^12 (2^-40 relative) of
//! that point is not returned (`None`), nor is any `x` outside the range (or NaN); the
//! caller then takes `ops::expf` itself (a margin the bound asks for: over every f32 in the
//! range, returning those too would change no result). For the DSP, whose libm `exp` (f64, with a
//! software division) is ~85 packets: this one is about half.
//!
//! The table: `2^(j/128)`, j = 0..127, each rounded to nearest f64 from 80 digits.

/// `2^(j/128)` as f64 bits.
const TABLE: [u64; 128] = [
    0x3FF0000000000000, 0x3FF0163DA9FB3335, 0x3FF02C9A3E778061, 0x3FF04315E86E7F85,
    0x3FF059B0D3158574, 0x3FF0706B29DDF6DE, 0x3FF0874518759BC8, 0x3FF09E3ECAC6F383,
    0x3FF0B5586CF9890F, 0x3FF0CC922B7247F7, 0x3FF0E3EC32D3D1A2, 0x3FF0FB66AFFED31B,
    0x3FF11301D0125B51, 0x3FF12ABDC06C31CC, 0x3FF1429AAEA92DE0, 0x3FF15A98C8A58E51,
    0x3FF172B83C7D517B, 0x3FF18AF9388C8DEA, 0x3FF1A35BEB6FCB75, 0x3FF1BBE084045CD4,
    0x3FF1D4873168B9AA, 0x3FF1ED5022FCD91D, 0x3FF2063B88628CD6, 0x3FF21F49917DDC96,
    0x3FF2387A6E756238, 0x3FF251CE4FB2A63F, 0x3FF26B4565E27CDD, 0x3FF284DFE1F56381,
    0x3FF29E9DF51FDEE1, 0x3FF2B87FD0DAD990, 0x3FF2D285A6E4030B, 0x3FF2ECAFA93E2F56,
    0x3FF306FE0A31B715, 0x3FF32170FC4CD831, 0x3FF33C08B26416FF, 0x3FF356C55F929FF1,
    0x3FF371A7373AA9CB, 0x3FF38CAE6D05D866, 0x3FF3A7DB34E59FF7, 0x3FF3C32DC313A8E5,
    0x3FF3DEA64C123422, 0x3FF3FA4504AC801C, 0x3FF4160A21F72E2A, 0x3FF431F5D950A897,
    0x3FF44E086061892D, 0x3FF46A41ED1D0057, 0x3FF486A2B5C13CD0, 0x3FF4A32AF0D7D3DE,
    0x3FF4BFDAD5362A27, 0x3FF4DCB299FDDD0D, 0x3FF4F9B2769D2CA7, 0x3FF516DAA2CF6642,
    0x3FF5342B569D4F82, 0x3FF551A4CA5D920F, 0x3FF56F4736B527DA, 0x3FF58D12D497C7FD,
    0x3FF5AB07DD485429, 0x3FF5C9268A5946B7, 0x3FF5E76F15AD2148, 0x3FF605E1B976DC09,
    0x3FF6247EB03A5585, 0x3FF6434634CCC320, 0x3FF6623882552225, 0x3FF68155D44CA973,
    0x3FF6A09E667F3BCD, 0x3FF6C012750BDABF, 0x3FF6DFB23C651A2F, 0x3FF6FF7DF9519484,
    0x3FF71F75E8EC5F74, 0x3FF73F9A48A58174, 0x3FF75FEB564267C9, 0x3FF780694FDE5D3F,
    0x3FF7A11473EB0187, 0x3FF7C1ED0130C132, 0x3FF7E2F336CF4E62, 0x3FF80427543E1A12,
    0x3FF82589994CCE13, 0x3FF8471A4623C7AD, 0x3FF868D99B4492ED, 0x3FF88AC7D98A6699,
    0x3FF8ACE5422AA0DB, 0x3FF8CF3216B5448C, 0x3FF8F1AE99157736, 0x3FF9145B0B91FFC6,
    0x3FF93737B0CDC5E5, 0x3FF95A44CBC8520F, 0x3FF97D829FDE4E50, 0x3FF9A0F170CA07BA,
    0x3FF9C49182A3F090, 0x3FF9E86319E32323, 0x3FFA0C667B5DE565, 0x3FFA309BEC4A2D33,
    0x3FFA5503B23E255D, 0x3FFA799E1330B358, 0x3FFA9E6B5579FDBF, 0x3FFAC36BBFD3F37A,
    0x3FFAE89F995AD3AD, 0x3FFB0E07298DB666, 0x3FFB33A2B84F15FB, 0x3FFB59728DE5593A,
    0x3FFB7F76F2FB5E47, 0x3FFBA5B030A1064A, 0x3FFBCC1E904BC1D2, 0x3FFBF2C25BD71E09,
    0x3FFC199BDD85529C, 0x3FFC40AB5FFFD07A, 0x3FFC67F12E57D14B, 0x3FFC8F6D9406E7B5,
    0x3FFCB720DCEF9069, 0x3FFCDF0B555DC3FA, 0x3FFD072D4A07897C, 0x3FFD2F87080D89F2,
    0x3FFD5818DCFBA487, 0x3FFD80E316C98398, 0x3FFDA9E603DB3285, 0x3FFDD321F301B460,
    0x3FFDFC97337B9B5F, 0x3FFE264614F5A129, 0x3FFE502EE78B3FF6, 0x3FFE7A51FBC74C83,
    0x3FFEA4AFA2A490DA, 0x3FFECF482D8E67F1, 0x3FFEFA1BEE615A27, 0x3FFF252B376BBA97,
    0x3FFF50765B6E4540, 0x3FFF7BFDAD9CBE14, 0x3FFFA7C1819E90D8, 0x3FFFD3C22B8F71F1,
];

/// `128 / ln 2`.
const INV: f64 = f64::from_bits(0x40671547652b82fe);
/// `ln 2 / 128` in two parts: the first with 39 significant bits (`k·C_HI` is exact for
/// every `|k| < 2^14`), the second the rest, rounded.
const C_HI: f64 = f64::from_bits(0x3f762e42fefa4000);
const C_LO: f64 = f64::from_bits(0xbcd8432a1b0e2634);
/// 1.5·2^52: adding it rounds to an integer, held in the low bits.
const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);

/// `ops::expf(x)` when it can be had without it (see the module doc), else `None`.
#[inline]
pub(crate) fn expf(x: f32) -> Option<f32> {
    if !(x > -87.0 && x < 88.0) {
        return None;
    }
    let xd = f64::from(x);
    let s = xd * INV + SHIFT;
    let k = s.to_bits() as u32 as i32;
    let kf = s - SHIFT;
    let r = (xd - kf * C_HI) - kf * C_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0))));
    let t = f64::from_bits(TABLE[(k & 127) as usize].wrapping_add(((k >> 7) as i64 as u64) << 52));
    let y = t * p;
    let low = (y.to_bits() & ((1 << 29) - 1)) as i64;
    if (low - (1 << 28)).abs() <= 1 << 12 {
        return None;
    }
    Some(y as f32)
}

/// [`expf`] on each element, `ops::expf` where it gives `None` (`Kernels::expf_batch`).
pub(crate) fn expf_batch(x: &mut [f32]) {
    for v in x {
        *v = expf(*v).unwrap_or_else(|| crate::ops::expf(*v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample of every f32 (every 997th bit pattern), every 61st f32 below 2^-10 in
    /// magnitude, and the 8192 f32 around ±1, ±0.5 and the range's ends: `ops::expf`'s
    /// bits or `None`, and `None` rarely inside the range and always outside it. (Run
    /// over every f32 in (−87, 88) by hand once: 2,237,530,112 values, 8,267 `None`, no
    /// other result differs.)
    #[test]
    fn expf_gives_the_reference_bits_or_none() {
        let (mut n, mut none) = (0u64, 0u64);
        let mut check = |b: u32| {
            let x = f32::from_bits(b);
            match expf(x) {
                Some(y) => assert_eq!(y.to_bits(), crate::ops::expf(x).to_bits(), "expf({x:e} = {b:#010x})"),
                None => none += u64::from(x > -87.0 && x < 88.0),
            }
            n += 1;
        };
        for b in (0..=u32::MAX).step_by(997) {
            check(b);
        }
        for base in [0u32, 0x8000_0000] {
            for b in (base..base + 0x3a80_0000).step_by(61) {
                check(b);
            }
        }
        for x in [1.0f32, -1.0, 0.5, -0.5, 87.99999, -86.99999] {
            for d in 0..4096u32 {
                check(x.to_bits().wrapping_add(d));
                check(x.to_bits().wrapping_sub(d));
            }
        }
        assert!(none * 1000 < n, "{none} of {n} left to ops::expf");
        for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 88.0, -87.0, 100.0, -100.0] {
            assert_eq!(expf(x), None, "{x}");
        }
    }

    /// `expf_batch` (the DSP's `Kernels::expf_batch`) gives `ops::expf`'s bits for every
    /// element, those `expf` leaves to it (out of range, NaN) included.
    #[test]
    fn expf_batch_gives_the_reference_bits() {
        extern crate std;
        let mut x: std::vec::Vec<f32> = (0..=u32::MAX).step_by(65_521).map(f32::from_bits).collect();
        x.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 88.0, -87.0, 0.0, -0.0]);
        let want: std::vec::Vec<u32> = x.iter().map(|&v| crate::ops::expf(v).to_bits()).collect();
        expf_batch(&mut x);
        for (i, (y, w)) in x.iter().zip(&want).enumerate() {
            assert_eq!(y.to_bits(), *w, "element {i}");
        }
    }
}

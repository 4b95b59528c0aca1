//! Buffer contents for a 1×1 convolution on the RK3588 NPU: packed weights, biases with
//! the zero-point correction folded in, packed input, and the output read back.
//!
//! Layouts (as Mesa 26.2.6 fills them, checked byte for byte against its captures):
//! - weights `[ceil(N'/32)][ceil(K'/32)][32 n][32 k]`, N' = N rounded up to 2, K' = max(K, 16);
//!   each byte is the model's byte minus 0x80 (the NPU's signed view); kernels past N are
//!   zero, channels past K hold the zero point (a last group of at most 16 channels is 16
//!   wide); the buffer is allocated twice the packed size.
//! - biases: int32 per output channel, `bias − Σ_k (w_u8 − w_zp)·(in_zp − 0x80)` (wrapping),
//!   divided by 2^truncate.
//! - input `[ceil(K/16)][H][W][16]`, byte minus 0x80, padding channels the zero point; the
//!   buffer is allocated twice the packed size.
//! - output `[ceil(N/16)][W][H][16]` int8, plus 0x80 back to the model's view.

/// Input channels as the weight packer counts them: at least 16, a multiple of 16.
fn k16(k: u32) -> u32 {
    k.max(16).div_ceil(16) * 16
}

/// Whether packed input channel `ic` (of a 32-channel group) is stored: real channels, and
/// padding up to the group's first 16 unless more than 16 of the last group are real.
fn stored(ic: u32, k: u32) -> bool {
    ic < k || ic % 32 < 16 || k % 32 > 16
}

/// Bytes the weights of `k × n` take packed.
pub fn weights_packed_len(k: u32, n: u32) -> usize {
    let per_row = (0..k16(k).div_ceil(32) * 32).filter(|&ic| ic % 32 < k16(k).min(32) && stored(ic, k)).count();
    per_row * n.div_ceil(2) as usize * 2
}

/// Byte offset of weight `(oc, ic)` in the packed weights of `k × n` (where [`weights`]
/// puts it): a row of 32 kernels holds every stored channel of each 32-channel group in turn.
pub fn weight_at(k: u32, n: u32, oc: u32, ic: u32) -> usize {
    let k16 = k16(k);
    let blocks = k16.div_ceil(32);
    let last = if k16 % 32 == 16 { 16 } else { 32 };
    let row = (blocks - 1) * 32 + last;
    let n2 = n.div_ceil(2) * 2;
    let (oc1, oc2, ic1, ic2) = (oc / 32, oc % 32, ic / 32, ic % 32);
    let kernels = 32.min(n2 - 32 * oc1);
    let width = if ic1 + 1 == blocks { last } else { 32 };
    (32 * oc1 * row + ic1 * kernels * 32 + oc2 * width + ic2) as usize
}

/// Bytes of the weight buffer (Mesa's allocation: twice the kernels × channels rounded up to 32).
pub fn weights_len(k: u32, n: u32) -> usize {
    2 * (n.div_ceil(2) * 2 * k16(k).div_ceil(32) * 32) as usize
}

/// Packs OHWI weights `w[n][k]` (raw model bytes) into a buffer of [`weights_len`] bytes.
pub fn weights(w: &[u8], k: u32, n: u32, w_zp: i32) -> Result<Vec<u8>, String> {
    let (ku, nu) = (k as usize, n as usize);
    if w.len() != ku * nu {
        return Err(format!("weights: {} bytes, a {n}x{k} (OHWI 1x1) tensor has {}", w.len(), ku * nu));
    }
    let n2 = n.div_ceil(2) * 2;
    let k16 = k16(k);
    let zp = (w_zp as u8).wrapping_sub(0x80);
    let mut out = Vec::with_capacity(2 * n2 as usize * k16.div_ceil(32) as usize * 32);
    for oc1 in 0..n2.div_ceil(32) {
        for ic1 in 0..k16.div_ceil(32) {
            for oc2 in 0..n2.min(32) {
                let oc = oc1 * 32 + oc2;
                if n > 2 && oc >= n2 {
                    continue;
                }
                for ic2 in 0..k16.min(32) {
                    let ic = ic1 * 32 + ic2;
                    if oc >= n {
                        out.push(0);
                    } else if ic >= k {
                        if stored(ic, k) {
                            out.push(zp);
                        }
                    } else {
                        out.push(w[oc as usize * ku + ic as usize].wrapping_sub(0x80));
                    }
                }
            }
        }
    }
    out.resize(weights_len(k, n), 0);
    Ok(out)
}

/// Biases as the NPU adds them (int32 little-endian, one per output channel).
pub fn biases(bias: &[i32], w: &[u8], k: u32, n: u32, in_zp: i32, w_zp: i32, truncate: u32) -> Result<Vec<u8>, String> {
    let (ku, nu) = (k as usize, n as usize);
    if bias.len() != nu || w.len() != ku * nu {
        return Err(format!("biases: {} values and {} weight bytes for n={n}, k={k}", bias.len(), w.len()));
    }
    let factor = (in_zp as u32).wrapping_sub(0x80);
    let mut out = Vec::with_capacity(nu * 4);
    for (oc, &b) in bias.iter().enumerate() {
        let corr = w[oc * ku..(oc + 1) * ku]
            .iter()
            .fold(0u32, |acc, &x| acc.wrapping_add(u32::from(x).wrapping_sub(w_zp as u32).wrapping_mul(factor)));
        let v = b.wrapping_sub(corr as i32) / (1i32 << truncate);
        out.extend_from_slice(&v.to_le_bytes());
    }
    Ok(out)
}

/// Packs an NHWC input `x[h][w][k]` (raw model bytes) into a buffer of `2 × packed` bytes.
pub fn input(x: &[u8], h: u32, w: u32, k: u32, in_zp: i32) -> Result<Vec<u8>, String> {
    let (hu, wu, ku) = (h as usize, w as usize, k as usize);
    if x.len() != hu * wu * ku {
        return Err(format!("input: {} bytes, a 1x{h}x{w}x{k} tensor has {}", x.len(), hu * wu * ku));
    }
    let groups = ku.div_ceil(16);
    let pad = (in_zp as u8).wrapping_sub(0x80);
    let mut out = vec![0u8; input_len(h, w, k)];
    let mut i = 0;
    for g in 0..groups {
        for y in 0..hu {
            for z in 0..wu {
                for c in 0..16 {
                    let ch = g * 16 + c;
                    out[i] = if ch < ku { x[(y * wu + z) * ku + ch].wrapping_sub(0x80) } else { pad };
                    i += 1;
                }
            }
        }
    }
    Ok(out)
}

/// Bytes of the input buffer (twice the packed `[ceil(K/16)][H][W][16]`).
pub fn input_len(h: u32, w: u32, k: u32) -> usize {
    2 * (k.div_ceil(16) * 16 * h * w) as usize
}

/// Bytes of the output buffer (Mesa's allocation: twice the 16-channel groups).
pub fn output_len(h: u32, w: u32, n: u32) -> usize {
    (h * w * n.div_ceil(16) * 2 * 16) as usize
}

/// Reads an int8 output buffer back into the model's `[w][h][n]` bytes (the NPU's row
/// order, which is NHWC when h or w is 1, as for every GEMM keel runs).
pub fn output(raw: &[u8], h: u32, w: u32, n: u32) -> Result<Vec<u8>, String> {
    let (hu, wu, nu) = (h as usize, w as usize, n as usize);
    let need = nu.div_ceil(16) * wu * hu * 16;
    if raw.len() < need {
        return Err(format!("output buffer: {} bytes, {need} needed for h={h} w={w} n={n}", raw.len()));
    }
    let mut out = vec![0u8; hu * wu * nu];
    for oc in 0..nu {
        for y in 0..wu {
            for x in 0..hu {
                out[(y * hu + x) * nu + oc] = raw[((oc / 16 * wu + y) * hu + x) * 16 + oc % 16].wrapping_add(0x80);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_lengths_match_the_packer() {
        for (k, n) in [(64, 64), (40, 33), (48, 7), (17, 3), (100, 70), (16, 2), (8, 1)] {
            let w = vec![1u8; (k * n) as usize];
            let packed = weights(&w, k, n, 0).unwrap();
            assert_eq!(packed.len(), weights_len(k, n), "k={k} n={n}");
            assert!(packed[weights_packed_len(k, n)..].iter().all(|&b| b == 0) && (n % 2 == 1 || packed[weights_packed_len(k, n) - 1] != 0), "k={k} n={n}");
        }
    }

    #[test]
    fn weight_at_is_where_the_packer_puts_each_weight() {
        for (k, n) in [(64, 64), (40, 33), (48, 7), (17, 3), (100, 70), (16, 2), (8, 1), (576, 96)] {
            let w: Vec<u8> = (0..k * n).map(|i| (i % 251) as u8).collect();
            let packed = weights(&w, k, n, 0x80).unwrap();
            for oc in 0..n {
                for ic in 0..k {
                    assert_eq!(packed[weight_at(k, n, oc, ic)], w[(oc * k + ic) as usize].wrapping_sub(0x80), "k={k} n={n} oc={oc} ic={ic}");
                }
            }
        }
    }

    #[test]
    fn output_round_trip() {
        let (h, w, n) = (1, 5, 20);
        let mut raw = vec![0u8; output_len(h, w, n)];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = i as u8;
        }
        let o = output(&raw, h, w, n).unwrap();
        assert_eq!(o[0], 0x80);
        assert_eq!(o[n as usize + 1], (16 + 1 + 0x80) as u8);
        assert_eq!(o[17], ((w as usize * 16) + 1 + 0x80) as u8);
    }
}

//! The known-input test every device runs at open, before it is trusted (a DSP
//! block can be fused off and still retire instructions, writing zeros). Host
//! and firmware share this module: the firmware builds the inputs from the seed
//! and runs its integer matrix-vector kernel; the host computes the expected
//! digest with this plain reference and refuses the device on a mismatch.

use crate::error::ErrorKind;

/// Output rows of the self-test matrix.
pub const ROWS: usize = 64;
/// Blocks of 32 inputs per row.
pub const BLOCKS: usize = 4;

fn mix(mut x: u32) -> u32 {
    // splitmix32-style finaliser: a fixed, well-spread hash.
    x = x.wrapping_add(0x9e37_79b9);
    x = (x ^ (x >> 16)).wrapping_mul(0x21f0_aaad);
    x = (x ^ (x >> 15)).wrapping_mul(0x735a_2d97);
    x ^ (x >> 15)
}

fn byte(seed: u32, stream: u32, index: u32) -> i8 {
    let h = mix(seed ^ mix(stream ^ mix(index)));
    // Full int8 range including -128, so the bias trick's corner cases are hit.
    (h >> 8) as u8 as i8
}

/// Int8 weights of row `row`, block `blk` (ggml Q8_0 quants; the scale is 1.0).
pub fn weight_block(seed: u32, row: usize, blk: usize) -> [i8; 32] {
    core::array::from_fn(|j| byte(seed, 1, ((row * BLOCKS + blk) * 32 + j) as u32))
}

/// Int8 activations of block `blk` (Q8_0 quants; the scale is 1.0).
pub fn act_block(seed: u32, blk: usize) -> [i8; 32] {
    core::array::from_fn(|j| byte(seed, 2, (blk * 32 + j) as u32))
}

/// Folds block sums, ordered `[block][row]`, into one word.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Digest(u32);

impl Default for Digest {
    fn default() -> Self {
        Digest(0x811c_9dc5)
    }
}

impl Digest {
    /// Adds the next block sum.
    pub fn push(&mut self, sum: i32) {
        self.0 = mix(self.0 ^ sum as u32);
    }
    /// The digest so far.
    pub fn value(&self) -> u32 {
        self.0
    }
}

/// The digest a correct device returns for `seed`: per block, per row, the
/// exact int32 dot product of the weight and activation quants.
pub fn expected_digest(seed: u32) -> u32 {
    let mut d = Digest::default();
    for blk in 0..BLOCKS {
        let a = act_block(seed, blk);
        for row in 0..ROWS {
            let w = weight_block(seed, row, blk);
            d.push(w.iter().zip(a.iter()).map(|(&w, &a)| i32::from(w) * i32::from(a)).sum());
        }
    }
    d.value()
}

/// Checks a device's reply; a wrong digest is `BadResponse` (the unit does not compute).
pub fn check(seed: u32, digest: u32) -> Result<(), ErrorKind> {
    if digest == expected_digest(seed) {
        Ok(())
    } else {
        Err(ErrorKind::BadResponse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_refused() {
        for seed in [0, 1, 0xdead_beef] {
            let mut zeros = Digest::default();
            (0..ROWS * BLOCKS).for_each(|_| zeros.push(0));
            assert_eq!(check(seed, zeros.value()), Err(ErrorKind::BadResponse));
            assert_eq!(check(seed, expected_digest(seed)), Ok(()));
        }
        assert_ne!(expected_digest(1), expected_digest(2));
    }

    #[test]
    fn inputs_cover_extremes() {
        let all: [i8; 32 * ROWS] = core::array::from_fn(|i| weight_block(7, i / 32, 0)[i % 32]);
        assert!(all.contains(&-128) && all.contains(&127));
    }
}

//! The open-time known-input test (inputs and digest rule:
//! `keel_npu_hal::selftest`): builds the seed's Q8_0 weights, repacks them
//! into tiles, runs the same HVX matvec path inference uses (keel-core's
//! `tiles32::matvec` with the HVX kernel set), and digests the exact int32 block
//! sums. A unit writing zeros gives a digest the host refuses.

use keel_core::exec::{kernels, Scratch};
use keel_core::quant::tiles32::{self, ActBlock, TiledWeights};
use keel_npu_hal::op::DType;
use keel_npu_hal::selftest::{act_block, weight_block, Digest, BLOCKS, ROWS};
use keel_npu_hal::{tile, ErrorKind};

/// f16 1.0.
const ONE_F16: [u8; 2] = 0x3c00u16.to_le_bytes();

/// Runs the self-test for `seed`; returns the digest of the block sums.
pub fn run(seed: u32, scratch: &mut Scratch<'_>) -> Result<u32, ErrorKind> {
    let (rows, k) = (ROWS, BLOCKS * 32);
    let src = scratch.take(ROWS * BLOCKS * 34)?;
    for (i, blk) in src.chunks_exact_mut(34).enumerate() {
        blk[..2].copy_from_slice(&ONE_F16);
        for (dst, q) in blk[2..].iter_mut().zip(weight_block(seed, i / BLOCKS, i % BLOCKS)) {
            *dst = q as u8;
        }
    }
    let packed = scratch.take(tile::packed_size(DType::Q8_0, rows as u32, k as u32).ok_or(ErrorKind::Other)?)?;
    tile::repack(DType::Q8_0, rows as u32, k as u32, src, packed)?;
    let act: [ActBlock; BLOCKS] = core::array::from_fn(|b| {
        let q = act_block(seed, b);
        let words = core::array::from_fn(|w| u32::from_le_bytes([0, 1, 2, 3].map(|j| q[4 * w + j] as u8)));
        ActBlock { words, sum: q.iter().map(|&v| i32::from(v)).sum(), d: 1.0, d16: 0x3c00 }
    });
    let mut sums = [0i32; ROWS * BLOCKS];
    let mut out = [0f32; ROWS];
    let w = TiledWeights { dtype: DType::Q8_0, rows, k, packed };
    let free = scratch.take(scratch.remaining())?;
    tiles32::matvec(&kernels(), &w, &act, free, &mut out, Some(&mut sums))?;
    let mut d = Digest::default();
    sums.iter().for_each(|&s| d.push(s));
    Ok(d.value())
}

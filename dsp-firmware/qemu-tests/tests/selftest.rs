//! The open-time self-test, run as Hexagon code: a good build returns the digest
//! the host expects for a random seed; a build whose HVX products are zeros
//! (`broken-hvx-zeros`) is refused by the same host-side check.

use keel_dsp_qemu_tests::{broken_elf, elf, put, run_elf, words, Rng, CMD_SELFTEST, MAGIC};
use keel_npu_hal::{selftest, ErrorKind};

fn digest(elf: &str, seed: u32) -> u32 {
    let mut req = MAGIC.to_vec();
    put(&mut req, &[CMD_SELFTEST, seed, 1 << 20]);
    let w: Vec<u32> = words(&run_elf(elf, &req)).collect();
    assert_eq!(w.len(), 2, "status and digest: {w:?}");
    assert_eq!(w[0], 0, "status");
    w[1]
}

#[test]
fn good_firmware_passes_the_self_test() {
    let mut rng = Rng(0xa11ce);
    for seed in [0, 1, rng.u32(), rng.u32()] {
        assert_eq!(selftest::check(seed, digest(&elf(), seed)), Ok(()), "seed {seed}");
    }
}

#[test]
fn zero_writing_hvx_is_refused_at_open() {
    let seed = Rng(0xb0b).u32();
    assert_eq!(selftest::check(seed, digest(&broken_elf(), seed)), Err(ErrorKind::BadResponse));
}

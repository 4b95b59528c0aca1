//! The DSP's f16 ↔ f32 conversions (`Kernels::f16_to_f32` / `f32_to_f16` of its HVX
//! kernel set, under attention's f16 operations and the K/V cache writes) against
//! `half` on the host, bit for bit: all 65,536 f16 patterns, and f32 values at every
//! rounding boundary (each f16, its midpoints to its neighbours and the f32s beside
//! them), every f32 exponent, overflow near 65,520, NaN payloads and random patterns.
//! The harness converts in runs of 1..129 values from successive offsets, so every
//! alignment and partial tail of the vector code is taken.

use half::f16;
use keel_dsp_qemu_tests::{elf, put, run_elf, words, Rng, CMD_F16, MAGIC};

fn boundary_f32s() -> Vec<f32> {
    let mut v = Vec::new();
    for h in 0..=u16::MAX {
        let f = f16::from_bits(h).to_f32();
        if !f.is_finite() {
            v.push(f);
            continue;
        }
        let next = f16::from_bits(h.wrapping_add(1)).to_f32();
        let mid = if next.is_finite() { ((f as f64 + next as f64) / 2.0) as f32 } else { f };
        for c in [f, mid] {
            for d in 0..=2u32 {
                v.push(f32::from_bits(c.to_bits().wrapping_add(d)));
                v.push(f32::from_bits(c.to_bits().wrapping_sub(d)));
            }
        }
    }
    for e in 0..=255u32 {
        for m in [0, 1, 0x1000, 0x0fff, 0x2000, 0x3f_ffff, 0x40_0000, 0x7f_ffff] {
            v.push(f32::from_bits(e << 23 | m));
            v.push(f32::from_bits(0x8000_0000 | e << 23 | m));
        }
    }
    v.extend([65504.0f32, 65519.99, 65520.0, 65535.9, 65536.0, 1e9, f32::MAX, 2.9802322e-8, 2.9802326e-8, 1e-30]);
    let mut rng = Rng(0xf16c);
    v.extend((0..1 << 16).map(|_| f32::from_bits(rng.u32())));
    v
}

#[test]
fn f16_conversions_on_the_dsp_equal_half_for_every_input() {
    let halves: Vec<u16> = (0..=u16::MAX).collect();
    let floats = boundary_f32s();
    let mut req = MAGIC.to_vec();
    put(&mut req, &[CMD_F16, halves.len() as u32, floats.len() as u32]);
    halves.iter().for_each(|h| req.extend_from_slice(&h.to_le_bytes()));
    req.resize(req.len().next_multiple_of(4), 0);
    floats.iter().for_each(|f| req.extend_from_slice(&f.to_le_bytes()));
    let resp = run_elf(&elf(), &req);
    assert_eq!(words(&resp[..4]).next(), Some(0), "status");
    let body = &resp[4..];
    assert_eq!(body.len(), 4 * halves.len() + (2 * floats.len()).next_multiple_of(4), "response length");
    let mut bad = 0;
    for (i, w) in words(&body[..4 * halves.len()]).enumerate() {
        let want = f16::from_bits(halves[i]).to_f32().to_bits();
        if w != want {
            if bad < 8 {
                eprintln!("f16 {:#06x} -> f32 {w:#010x}, half {want:#010x}", halves[i]);
            }
            bad += 1;
        }
    }
    let hs = &body[4 * halves.len()..];
    for (i, &f) in floats.iter().enumerate() {
        let got = u16::from_le_bytes([hs[2 * i], hs[2 * i + 1]]);
        let want = f16::from_f32(f).to_bits();
        if got != want {
            if bad < 16 {
                eprintln!("f32 {f:e} ({:#010x}) -> f16 {got:#06x}, half {want:#06x}", f.to_bits());
            }
            bad += 1;
        }
    }
    assert_eq!(bad, 0, "{bad} conversions differ from half's");
}

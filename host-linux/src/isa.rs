//! CPU feature detection for the core's kernel choice.
//!
//! Owns the question "which SIMD extensions does this CPU have", asked of the CPU at
//! run time (cpuid on x86_64, hwcaps on aarch64), never assumed from the build target.
//! The core picks kernels from the answer; this module does not know the kernels.
//!
//! `Isa` here mirrors `keel_core::quant::Isa` (same public bool fields, `Default` =
//! scalar only). When the core's type lands, this struct becomes
//! `pub use keel_core::quant::Isa;` and `detect` stays as is.

/// SIMD extensions the kernels may use. `Default` is none: the scalar reference.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Isa {
    /// x86_64 AVX2 and FMA.
    pub avx2_fma: bool,
    /// x86_64 AVX-512 F, BW and VL (the subset integer dot products need).
    pub avx512: bool,
    /// x86_64 AVX-512 VNNI (`vpdpbusd`), on top of `avx512`.
    pub avx512_vnni: bool,
    /// aarch64 dot product (`sdot`/`udot`).
    pub neon_dotprod: bool,
    /// aarch64 int8 matrix multiply (`smmla`).
    pub i8mm: bool,
}

/// Asks the CPU which extensions it has.
pub fn detect() -> Isa {
    #[allow(unused_mut)]
    let mut isa = Isa::default();
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        isa.avx2_fma = has!("avx2") && has!("fma");
        isa.avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl");
        isa.avx512_vnni = isa.avx512 && has!("avx512vnni");
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        isa.neon_dotprod = has!("dotprod");
        isa.i8mm = has!("i8mm");
    }
    isa
}

/// The detected extensions as a short space-separated list (`"avx2_fma avx512"`), or
/// `"scalar"` if none; for `keel info` and benchmark reports.
pub fn describe(isa: &Isa) -> String {
    let names = [
        (isa.avx2_fma, "avx2_fma"),
        (isa.avx512, "avx512"),
        (isa.avx512_vnni, "avx512_vnni"),
        (isa.neon_dotprod, "neon_dotprod"),
        (isa.i8mm, "i8mm"),
    ];
    let on: Vec<&str> = names.iter().filter(|(b, _)| *b).map(|(_, n)| *n).collect();
    if on.is_empty() {
        "scalar".to_string()
    } else {
        on.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_is_consistent() {
        let isa = detect();
        assert!(!isa.avx512_vnni || isa.avx512);
        if cfg!(target_arch = "x86_64") {
            assert!(!isa.neon_dotprod && !isa.i8mm);
        }
        if cfg!(target_arch = "aarch64") {
            assert!(!isa.avx2_fma && !isa.avx512);
        }
        assert_eq!(isa, detect());
    }

    #[test]
    fn describes_features() {
        assert_eq!(describe(&Isa::default()), "scalar");
        let isa = Isa {
            avx2_fma: true,
            avx512: true,
            ..Isa::default()
        };
        assert_eq!(describe(&isa), "avx2_fma avx512");
    }
}

//! CPU feature detection for the core's kernel choice.
//!
//! Owns the question "which SIMD extensions does this CPU have", asked of the CPU at
//! run time (cpuid on x86_64, hwcaps on aarch64), never assumed from the build target.
//! The core picks kernels from the answer; this module does not know the kernels.
//!
//! The answer is the core's [`Isa`] (re-exported here), which the core's
//! `quant::Kernels` take.

pub use keel_core::quant::Isa;

/// Asks the CPU which extensions it has.
pub fn detect() -> Isa {
    #[allow(unused_mut)]
    let mut isa = Isa::default();
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        isa.avx2_fma = has!("avx2") && has!("fma") && has!("f16c");
        isa.avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl");
        isa.avx512_vnni = isa.avx512 && has!("avx512vnni");
        // AVX512-FP16 is CPUID leaf 7, EDX bit 23 (std's detection name for it is newer
        // than keel's minimum Rust); `avx512f` above already confirmed ZMM state.
        if isa.avx512 {
            // SAFETY: CPUID exists on every x86_64 CPU, and leaf 7 when AVX-512 F does.
            #[allow(unused_unsafe)] // an unsafe fn on older compilers
            let leaf7 = unsafe { std::arch::x86_64::__cpuid_count(7, 0) };
            isa.avx512_fp16 = leaf7.edx >> 23 & 1 == 1;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        isa.neon = has!("neon");
        isa.neon_dotprod = isa.neon && has!("dotprod");
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
        (isa.avx512_fp16, "avx512_fp16"),
        (isa.neon, "neon"),
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
        assert!(!isa.avx512_fp16 || isa.avx512);
        if cfg!(target_arch = "x86_64") {
            assert!(!isa.neon && !isa.neon_dotprod && !isa.i8mm);
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

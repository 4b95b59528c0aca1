//! CPU feature detection for the core's kernel choice.
//!
//! Owns the question "which SIMD extensions does this CPU have", asked of the CPU at
//! run time (cpuid on x86_64, hwcaps on aarch64), never assumed from the build target.
//! The core picks kernels from the answer; this module does not know the kernels.
//!
//! The answer is the core's [`Isa`] (re-exported here), which the core's
//! `quant::Kernels` take.

pub use keel_core::quant::Isa;

/// The environment variable that limits the kernel set (see [`chosen`]).
pub const ENV: &str = "KEEL_ISA";

/// The extensions keel's kernels use: the CPU's ([`detect`]), limited by `KEEL_ISA` if
/// set. `KEEL_ISA` lists the extensions to keep, by [`describe`]'s names, separated by
/// spaces or commas (`avx2_fma avx512 avx512_vnni`: an AVX-512 machine without
/// AVX512-FP16, as Zen 4; `avx2_fma`: AVX2 only; `scalar`: none, the reference), so one
/// machine can run and time the kernel sets of smaller ones. Every listed extension must be
/// one this CPU has; an unknown or missing one is an error naming it.
pub fn chosen() -> Result<Isa, String> {
    match std::env::var(ENV) {
        Err(std::env::VarError::NotPresent) => Ok(detect()),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{ENV} is not UTF-8; give extension names such as \"avx2_fma avx512\"")),
        // (Set but empty: as if unset, so `KEEL_ISA=$X` with no X means this CPU's set.)
        Ok(v) if v.trim().is_empty() => Ok(detect()),
        Ok(v) => limit(detect(), &v),
    }
}

/// `isa` with only the extensions `list` names (see [`chosen`]).
pub fn limit(isa: Isa, list: &str) -> Result<Isa, String> {
    let mut out = Isa { hvx: isa.hvx, ..Isa::default() };
    for name in list.split(|c: char| c == ',' || c.is_whitespace()).filter(|n| !n.is_empty()) {
        let (have, keep) = match name {
            "scalar" => continue,
            "avx2_fma" => (isa.avx2_fma, &mut out.avx2_fma),
            "avx512" => (isa.avx512, &mut out.avx512),
            "avx512_vnni" => (isa.avx512_vnni, &mut out.avx512_vnni),
            "avx512_fp16" => (isa.avx512_fp16, &mut out.avx512_fp16),
            "neon" => (isa.neon, &mut out.neon),
            "neon_dotprod" => (isa.neon_dotprod, &mut out.neon_dotprod),
            "i8mm" => (isa.i8mm, &mut out.i8mm),
            _ => return Err(format!("{ENV}: unknown extension {name:?}; use names from: scalar avx2_fma avx512 avx512_vnni avx512_fp16 neon neon_dotprod i8mm")),
        };
        if !have {
            return Err(format!("{ENV}: this CPU has no {name} (it has: {}); drop {name} from {ENV}", describe(&isa)));
        }
        *keep = true;
    }
    if (out.avx512 || out.avx512_vnni || out.avx512_fp16) && !out.avx2_fma || (out.avx512_vnni || out.avx512_fp16) && !out.avx512 {
        return Err(format!("{ENV}={list:?}: the AVX-512 kernels build on avx2_fma and avx512; list those too"));
    }
    if out.neon_dotprod && !out.neon {
        return Err(format!("{ENV}={list:?}: neon_dotprod needs neon; list it too"));
    }
    Ok(out)
}

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
    fn limits_to_the_listed_extensions() {
        let all = Isa { avx2_fma: true, avx512: true, avx512_vnni: true, avx512_fp16: true, ..Isa::default() };
        let zen4 = Isa { avx512_fp16: false, ..all };
        assert_eq!(limit(all, "avx2_fma avx512 avx512_vnni"), Ok(zen4));
        assert_eq!(limit(all, "avx2_fma,avx512,avx512_vnni"), Ok(zen4));
        assert_eq!(limit(all, "avx2_fma"), Ok(Isa { avx2_fma: true, ..Isa::default() }));
        assert_eq!(limit(all, "scalar"), Ok(Isa::default()));
        assert_eq!(limit(all, &describe(&all)), Ok(all));
        let e = limit(all, "avx2 avx512").unwrap_err();
        assert!(e.contains("unknown extension \"avx2\"") && e.contains("avx2_fma"), "{e}");
        let e = limit(zen4, "avx2_fma avx512 avx512_fp16").unwrap_err();
        assert!(e.contains("no avx512_fp16"), "{e}");
        assert!(limit(all, "avx512").unwrap_err().contains("avx2_fma"));
        assert!(limit(all, "avx2_fma avx512_fp16").unwrap_err().contains("avx512"));
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

//! How to start a `hexagon-sim` device: which emulator, which firmware ELF,
//! which CPU, how much scratch and shared memory, how long to wait. Defaults
//! come from the environment so tests, CI and `keel probe` agree:
//!
//! | variable | default |
//! |---|---|
//! | `KEEL_QEMU` | `qemu-hexagon` on `PATH` |
//! | `KEEL_QEMU_CPU` | `v68` |
//! | `KEEL_DSP_ELF` | `dsp-firmware/target/<cpu>/hexagon-unknown-none-elf/release/keel-dsp-device` (what `dsp-firmware/ci.sh` builds) |
//! | `KEEL_DSP_TIMEOUT_MS` | 60000 ([`DEFAULT_TIMEOUT_MS`]) |
//! | `KEEL_DSP_THREADS` | 4 (the HVX contexts of a v68 or v73 cDSP; 1 to 8) |

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Everything needed to start the emulated DSP.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The `qemu-hexagon` binary.
    pub qemu: PathBuf,
    /// The firmware's `keel-dsp-device` ELF, built for `cpu`.
    pub elf: PathBuf,
    /// QEMU CPU model (`v68`, `v73`, …).
    pub cpu: String,
    /// VTCM granted to the firmware, bytes (4 MiB on v68, 8 MiB on v69–v75).
    pub vtcm_bytes: u32,
    /// Size of the shared `/dev/shm` pool, bytes (sparse until touched).
    pub pool_bytes: u64,
    /// Longest wait for any reply, and for a batch from its submission.
    pub timeout: Duration,
    /// Hardware threads the firmware splits a batch's products and attention over (`--threads`).
    pub threads: u8,
    /// A firmware fault mode (`hang-on-batch`, `malformed-reply`, `wrong-seq`,
    /// `other-version`), for fault tests only.
    pub fault: Option<String>,
    /// The variables of the environment that `from_env` could not read (what is wrong and
    /// the fix, `; ` between two): [`SimConfig::missing`] reports it, so the device is not
    /// opened with a default the user did not ask for.
    pub env_error: Option<String>,
}

/// How long the emulated DSP may take over one reply or one batch before it is called
/// hung, unless `KEEL_DSP_TIMEOUT_MS` says otherwise. A wall-clock bound on an emulator,
/// whose speed is the host's: SmolLM2 Q8_0's largest whole-layer batch takes about 2 s
/// under `qemu-hexagon` on an idle 2-core Xeon, yet in one CI run, with other tests sharing
/// the cores and the firmware's four threads each holding a fixed share, a batch that was
/// not hung passed 10 s (the old default). A firmware that really
/// hangs is still stopped, later; the fault tests set their own short bound.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;

/// Threads the firmware runs unless `KEEL_DSP_THREADS` says otherwise: the HVX
/// contexts of the v68 (QCS6490) and v73 cDSPs.
pub const DEFAULT_THREADS: u8 = 4;

/// A whole number from the environment variable `name` (its value `value`, `None` when
/// unset): `Ok(None)` when unset or empty, else the number if it lies in `range`, else
/// `Err` naming the variable, its value, what it takes and the default (`default`, said
/// as the variable's doc says it).
pub fn env_number(name: &str, value: Option<&str>, range: RangeInclusive<u64>, what: &str, default: &str) -> Result<Option<u64>, String> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if range.contains(&n) => Ok(Some(n)),
            _ => {
                let span = if *range.end() == u64::MAX { format!("{} or more", range.start()) } else { format!("{} to {}", range.start(), range.end()) };
                Err(format!("{name}={v:?} is not {what} ({span}): set it to one or unset it ({default})"))
            }
        },
    }
}

/// `KEEL_DSP_TIMEOUT_MS` read as [`env_number`] reads it: the timeout in milliseconds
/// (`default_ms` when unset), or what is wrong with the variable.
pub fn timeout_from_env(default_ms: u64) -> Result<Duration, String> {
    let v = std::env::var("KEEL_DSP_TIMEOUT_MS").ok();
    let ms = env_number("KEEL_DSP_TIMEOUT_MS", v.as_deref(), 1..=u64::MAX, "a whole number of milliseconds", &format!("{default_ms} ms"))?;
    Ok(Duration::from_millis(ms.unwrap_or(default_ms)))
}

/// VTCM size of a Hexagon generation, bytes.
pub fn vtcm_for(cpu: &str) -> u32 {
    match cpu.trim_start_matches('v').parse::<u32>() {
        Ok(v) if v >= 69 => 8 << 20,
        _ => 4 << 20,
    }
}

/// The firmware ELF `dsp-firmware/ci.sh` builds for `cpu`.
pub fn default_elf(cpu: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../dsp-firmware/target")
        .join(cpu)
        .join("hexagon-unknown-none-elf/release/keel-dsp-device")
}

/// `name` if it is a path, else the first match on `PATH`.
pub fn find_program(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| p.is_file())
}

impl SimConfig {
    /// The defaults, overridden by the environment (see the module doc).
    pub fn from_env() -> SimConfig {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let qemu_name = var("KEEL_QEMU").unwrap_or_else(|| "qemu-hexagon".into());
        let cpu = var("KEEL_QEMU_CPU").unwrap_or_else(|| "v68".into());
        // A variable set to something it cannot mean is kept as the error `missing` reports.
        let mut errors = Vec::new();
        let timeout = timeout_from_env(DEFAULT_TIMEOUT_MS).unwrap_or_else(|e| {
            errors.push(e);
            Duration::from_millis(DEFAULT_TIMEOUT_MS)
        });
        let t = std::env::var("KEEL_DSP_THREADS").ok();
        let what = "the firmware's hardware thread count";
        let threads = env_number("KEEL_DSP_THREADS", t.as_deref(), 1..=8, what, &DEFAULT_THREADS.to_string()).unwrap_or_else(|e| {
            errors.push(e);
            None
        });
        SimConfig {
            qemu: find_program(&qemu_name).unwrap_or_else(|| PathBuf::from(qemu_name)),
            elf: var("KEEL_DSP_ELF").map_or_else(|| default_elf(&cpu), PathBuf::from),
            vtcm_bytes: vtcm_for(&cpu),
            cpu,
            pool_bytes: 256 << 20,
            timeout,
            threads: threads.map_or(DEFAULT_THREADS, |n| n as u8),
            fault: None,
            env_error: (!errors.is_empty()).then(|| errors.join("; ")),
        }
    }

    /// What is missing to start the device, said so a user can fix it; `None` if nothing.
    pub fn missing(&self) -> Option<String> {
        if let Some(e) = &self.env_error {
            return Some(e.clone());
        }
        if !(1..=8).contains(&self.threads) {
            return Some(format!("{} hardware threads asked for: the firmware runs 1 to 8 (KEEL_DSP_THREADS)", self.threads));
        }
        if !self.qemu.is_file() {
            return Some(format!(
                "{} not found: install qemu-user (Debian bookworm-backports has qemu-hexagon with v68/v73; \
                 `bash dsp-firmware/ci.sh` installs it) or set KEEL_QEMU",
                self.qemu.display()
            ));
        }
        if !self.elf.is_file() {
            return Some(format!(
                "firmware ELF {} not found: build it with `bash dsp-firmware/ci.sh` or set KEEL_DSP_ELF",
                self.elf.display()
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::env_number;

    #[test]
    fn env_numbers_are_read_or_refused_never_defaulted() {
        let read = |v: Option<&str>| env_number("KEEL_DSP_TIMEOUT_MS", v, 1..=u64::MAX, "a whole number of milliseconds", "60000 ms");
        assert_eq!(read(None), Ok(None));
        assert_eq!(read(Some("")), Ok(None));
        assert_eq!(read(Some(" 2500 ")), Ok(Some(2500)));
        for bad in ["10s", "-5", "0", "1e4", "2.5", "99999999999999999999999"] {
            let e = read(Some(bad)).expect_err(bad);
            for want in ["KEEL_DSP_TIMEOUT_MS", bad, "milliseconds", "1 or more", "unset it (60000 ms)"] {
                assert!(e.contains(want), "{bad}: `{want}` missing from: {e}");
            }
        }
        // A session id: 0 taken, past u32 refused with the range said.
        let session = |v| env_number("KEEL_FASTRPC_SESSION", Some(v), 0..=u32::MAX as u64, "a session id", "the first session");
        assert_eq!(session("0"), Ok(Some(0)));
        let e = session("4294967296").unwrap_err();
        assert!(e.contains("0 to 4294967295") && e.contains("unset it (the first session)"), "{e}");
    }
}

//! The device ELF's command line, as the host's hexagon-sim shim passes it:
//!
//! `keel-dsp-device --shm PATH [--vtcm BYTES] [--threads N] [--fault MODE]`
//!
//! - `--shm PATH`: the shared-memory file (`/dev/shm/…`, or a memfd as
//!   `/proc/PID/fd/N`) holding every host buffer; `MapBuffer` maps pieces of it.
//! - `--vtcm BYTES`: scratch the platform grants (VTCM: 4 MiB on v68, 8 MiB on
//!   v69–v75); capped at the static region the ELF reserves.
//! - `--threads N`: hardware threads a batch's matrix products and attention are split over
//!   (1 to [`MAX_THREADS`](crate::threads::MAX_THREADS); default 1), as a cDSP's HVX
//!   contexts; the outputs are the same bits whatever N.
//! - `--fault MODE`: misbehave on purpose, for the host's fault tests
//!   ([`Fault`]). Never used outside tests.

/// A fault the firmware commits on purpose.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Behave.
    None,
    /// Never answer a batch (sleeps forever once one arrives).
    HangOnBatch,
    /// Answer a batch with bytes that are not a message.
    MalformedReply,
    /// Answer a batch with the wrong sequence number.
    WrongSeq,
    /// Claim another protocol version in `HelloAck`.
    OtherVersion,
}

impl Fault {
    fn parse(s: &[u8]) -> Option<Fault> {
        Some(match s {
            b"hang-on-batch" => Fault::HangOnBatch,
            b"malformed-reply" => Fault::MalformedReply,
            b"wrong-seq" => Fault::WrongSeq,
            b"other-version" => Fault::OtherVersion,
            _ => return None,
        })
    }
}

/// The parsed command line.
pub struct Config<'a> {
    /// The shared-memory path, NUL-terminated (as on the stack).
    pub shm: &'a [u8],
    /// Scratch bytes granted (0: not given).
    pub vtcm: usize,
    /// Hardware threads (`--threads`, default 1).
    pub threads: usize,
    /// The fault mode.
    pub fault: Fault,
    /// The platform's page size, from the auxiliary vector (`AT_PAGESZ`): shared
    /// mappings must start on it. QEMU's Hexagon target uses 64 KiB pages.
    pub page_size: u32,
}

const AT_NULL: u32 = 0;
const AT_PAGESZ: u32 = 6;

/// A NUL-terminated string at `p`, including the NUL.
///
/// # Safety
/// `p` points to a NUL-terminated string that lives for `'a`.
unsafe fn c_str<'a>(p: *const u8) -> &'a [u8] {
    let mut n = 0;
    // SAFETY: the caller guarantees a terminating NUL within the allocation.
    while unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    // SAFETY: the n bytes and the NUL were just read.
    unsafe { core::slice::from_raw_parts(p, n + 1) }
}

fn parse_usize(s: &[u8]) -> Option<usize> {
    let digits = s.strip_suffix(&[0]).unwrap_or(s);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0usize, |acc, &c| {
        c.is_ascii_digit().then_some(())?;
        acc.checked_mul(10)?.checked_add(usize::from(c - b'0'))
    })
}

/// Parses the command line from the initial stack (`[argc, argv…, NULL, envp…]`).
///
/// # Safety
/// `sp` is the stack pointer the kernel handed to `_start`.
pub unsafe fn from_stack<'a>(sp: *const u32) -> Result<Config<'a>, &'static str> {
    // SAFETY: the Linux ABI puts argc at sp and argc argv pointers after it.
    let argc = unsafe { *sp } as usize;
    // SAFETY: as above; argv strings live for the whole process.
    let arg = |i: usize| unsafe { c_str(*sp.add(1 + i) as usize as *const u8) };
    let mut cfg = Config { shm: &[], vtcm: 0, threads: 1, fault: Fault::None, page_size: 4096 };
    // After argv's NULL come envp, its NULL, then (type, value) pairs up to AT_NULL.
    let mut p = 1 + argc + 1;
    // SAFETY: the kernel terminates envp with NULL and auxv with AT_NULL.
    while unsafe { *sp.add(p) } != 0 {
        p += 1;
    }
    p += 1;
    loop {
        // SAFETY: as above: pairs up to and including AT_NULL.
        let (kind, value) = unsafe { (*sp.add(p), *sp.add(p + 1)) };
        match kind {
            AT_NULL => break,
            AT_PAGESZ if value.is_power_of_two() => cfg.page_size = value,
            _ => {}
        }
        p += 2;
    }
    let mut i = 1;
    while i < argc {
        let name = arg(i);
        let value = if i + 1 < argc { arg(i + 1) } else { return Err("option without a value") };
        match name {
            b"--shm\0" => cfg.shm = value,
            b"--vtcm\0" => cfg.vtcm = parse_usize(value).ok_or("--vtcm wants a byte count")?,
            b"--threads\0" => {
                cfg.threads = parse_usize(value).filter(|n| (1..=crate::threads::MAX_THREADS).contains(n)).ok_or("--threads wants 1 to 8")?
            }
            b"--fault\0" => cfg.fault = Fault::parse(value.strip_suffix(&[0]).unwrap_or(value)).ok_or("unknown --fault mode")?,
            _ => return Err("unknown option (usage: keel-dsp-device --shm PATH [--vtcm BYTES] [--threads N] [--fault MODE])"),
        }
        i += 2;
    }
    if cfg.shm.is_empty() {
        return Err("--shm PATH is required");
    }
    Ok(cfg)
}

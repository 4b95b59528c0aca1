//! Memory accounting: the process's resident set, and a counting global allocator.
//!
//! Owns the reading of `/proc/self/status` (peak and current RSS, for the CLI's
//! reports) and [`CountingAllocator`], a [`GlobalAlloc`] over [`System`] that counts
//! allocations so tests (and the binary, with a flag) can prove that generation
//! allocates nothing. It does not decide when to measure; callers do.
//!
//! Install it in a binary or test crate with
//! `#[global_allocator] static A: CountingAllocator = CountingAllocator::new();`
//! and read [`allocations`] before and after the code under test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Resident-set figures of this process, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rss {
    /// Current resident set (`VmRSS`).
    pub current: u64,
    /// Peak resident set since the process started (`VmHWM`).
    pub peak: u64,
}

/// Reads the current and peak resident set from `/proc/self/status`.
pub fn rss() -> io::Result<Rss> {
    let text = std::fs::read_to_string("/proc/self/status")?;
    parse_status(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "/proc/self/status has no VmRSS/VmHWM lines",
        )
    })
}

/// Peak resident set in bytes (`VmHWM`), or `None` if `/proc` cannot tell.
pub fn peak_rss_bytes() -> Option<u64> {
    rss().ok().map(|r| r.peak)
}

/// Current resident set in bytes (`VmRSS`), or `None` if `/proc` cannot tell.
pub fn current_rss_bytes() -> Option<u64> {
    rss().ok().map(|r| r.current)
}

/// Extracts `VmRSS` and `VmHWM` (given in kB) from the text of `/proc/<pid>/status`.
pub fn parse_status(text: &str) -> Option<Rss> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let rest = line[name.len()..].trim_start_matches(':').trim();
        let kb: u64 = rest
            .strip_suffix("kB")
            .unwrap_or(rest)
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    };
    Some(Rss {
        current: field("VmRSS")?,
        peak: field("VmHWM")?,
    })
}

/// This machine's physical memory in bytes: `MemTotal` of `/proc/meminfo`, else
/// `sysconf(_SC_PHYS_PAGES) * _SC_PAGESIZE`; `None` if neither tells.
pub fn physical_memory() -> Option<u64> {
    let from_proc = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| parse_meminfo_total(&t));
    from_proc.or_else(|| {
        // SAFETY: sysconf only reads system configuration.
        let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
        (pages > 0 && size > 0).then(|| pages as u64 * size as u64)
    })
}

/// `MemTotal` (given in kB) from the text of `/proc/meminfo`, in bytes.
pub fn parse_meminfo_total(text: &str) -> Option<u64> {
    parse_meminfo_field(text, "MemTotal")
}

/// Memory a process can take now without swapping, in bytes: `MemAvailable` of
/// `/proc/meminfo` (free memory plus what the kernel can reclaim, the page cache
/// included); `None` where it does not tell.
pub fn available_memory() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| parse_meminfo_field(&t, "MemAvailable"))
}

/// The field `name` (given in kB) from the text of `/proc/meminfo`, in bytes.
pub fn parse_meminfo_field(text: &str, name: &str) -> Option<u64> {
    let rest = text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?.trim();
    let kb: u64 = rest.strip_suffix("kB").unwrap_or(rest).trim().parse().ok()?;
    kb.checked_mul(1024)
}

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED_BYTES: AtomicU64 = AtomicU64::new(0);
static DEALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// A global allocator that forwards to [`System`] and counts what passes through.
///
/// Counters are process-wide (all threads). `realloc` counts as one allocation of the
/// new size. The counters stay at 0 unless this allocator is installed.
#[derive(Clone, Copy, Debug, Default)]
pub struct CountingAllocator;

impl CountingAllocator {
    /// The allocator, for a `#[global_allocator]` static.
    pub const fn new() -> Self {
        CountingAllocator
    }
}

/// Allocations (including reallocations) made so far through [`CountingAllocator`].
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Bytes requested so far through [`CountingAllocator`] (not net of frees).
pub fn allocated_bytes() -> u64 {
    ALLOCATED_BYTES.load(Ordering::Relaxed)
}

/// Deallocations made so far through [`CountingAllocator`].
pub fn deallocations() -> u64 {
    DEALLOCATIONS.load(Ordering::Relaxed)
}

fn count(size: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    ALLOCATED_BYTES.fetch_add(size as u64, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's own arguments, so the
// `GlobalAlloc` contract holds exactly as it does for `System`; counting touches only
// atomics and never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        DEALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: forwarded contract (see the impl).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_text() {
        let text = "Name:\tkeel\nVmPeak:\t  100 kB\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\n";
        assert_eq!(
            parse_status(text),
            Some(Rss {
                current: 1024 * 1024,
                peak: 2048 * 1024
            })
        );
        assert_eq!(parse_status("Name:\tkeel\nVmRSS:\t12 kB\n"), None);
        assert_eq!(parse_status("VmHWM:\tlots kB\nVmRSS:\t1 kB\n"), None);
    }

    #[test]
    fn parses_meminfo() {
        assert_eq!(parse_meminfo_total("MemTotal:       24684540 kB\nMemFree:  1 kB\n"), Some(24684540 * 1024));
        assert_eq!(parse_meminfo_total("MemFree: 1 kB\n"), None);
        assert!(physical_memory().is_some_and(|b| b > 0));
    }

    #[test]
    fn reads_own_rss() {
        let r = rss().expect("/proc/self/status");
        assert!(r.current > 0 && r.peak >= r.current, "{r:?}");
    }
}

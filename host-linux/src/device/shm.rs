//! Shared memory for the emulated DSP: one `/dev/shm` file, mapped `MAP_SHARED`
//! by the host here and, piece by piece, by the firmware under `qemu-hexagon`
//! (which opens it by path), so both sides see the same bytes without copies,
//! as FastRPC does with dma-buf. This module owns the file, the host mapping
//! and the placement of buffers inside it (first fit, 4 KiB granules); it knows
//! nothing of the wire protocol. Placement follows the device's granule (its
//! page size: 64 KiB under QEMU's Hexagon target, which refuses other offsets).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Placement granule until the device says otherwise, bytes.
pub const GRANULE: u64 = 4096;

/// The shared file and the host's mapping of it.
pub struct ShmPool {
    path: PathBuf,
    linked: bool,
    _file: File,
    ptr: NonNull<u8>,
    len: usize,
    granule: u64,
    /// Placed ranges `(offset, len)`, sorted by offset.
    used: Vec<(u64, u64)>,
}

// SAFETY: the pool exclusively owns its mapping; views of it are handed out only
// through `&mut self` (`bytes_mut`), so moving it to another thread is sound.
unsafe impl Send for ShmPool {}

impl ShmPool {
    /// Creates a fresh `/dev/shm/keel-hexagon-sim-PID-N` of `len` bytes (sparse:
    /// pages cost memory only when touched) and maps it.
    pub fn create(len: u64) -> io::Result<ShmPool> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let len = len.div_ceil(GRANULE) * GRANULE;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = PathBuf::from(format!("/dev/shm/keel-hexagon-sim-{}-{n}", std::process::id()));
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path)?;
        let mut pool = ShmPool { path, linked: true, _file: file, ptr: NonNull::dangling(), len: 0, granule: GRANULE, used: Vec::new() };
        pool._file.set_len(len)?;
        let size = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of a file we hold open, at an address the
        // kernel picks; it aliases no Rust object. Checked for MAP_FAILED below.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, pool._file.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        pool.ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        pool.len = size;
        Ok(pool)
    }

    /// The file's path (what the firmware opens).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes in the pool.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// True for an empty pool (never, once created).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Removes the file's name once both sides hold it open, so nothing is left
    /// in `/dev/shm` whatever happens next.
    pub fn unlink(&mut self) {
        if self.linked {
            let _ = std::fs::remove_file(&self.path);
            self.linked = false;
        }
    }

    /// Sets the placement granule (a power of two: the device's page size).
    pub fn set_granule(&mut self, granule: u64) {
        if granule.is_power_of_two() {
            self.granule = granule;
        }
    }

    /// Places `len` bytes (rounded up to the granule) at a multiple of the
    /// granule; the offset, or `None` if no gap fits.
    pub fn place(&mut self, len: u64) -> Option<u64> {
        let g = self.granule;
        let len = len.checked_add(g - 1)? / g * g;
        let mut at = 0u64;
        let mut slot = self.used.len();
        for (i, &(off, l)) in self.used.iter().enumerate() {
            if off >= at && off - at >= len {
                slot = i;
                break;
            }
            at = at.max((off + l).div_ceil(g) * g);
        }
        if slot == self.used.len() && self.len() < at.checked_add(len)? {
            return None;
        }
        self.used.insert(slot, (at, len));
        Some(at)
    }

    /// Releases the range placed at `offset`.
    pub fn release(&mut self, offset: u64) {
        self.used.retain(|&(off, _)| off != offset);
    }

    /// The host's view of `len` bytes at `offset` (inside the pool).
    pub fn bytes_mut(&mut self, offset: u64, len: u64) -> Option<&mut [u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        // SAFETY: [offset, end) lies inside our live mapping; `&mut self` makes
        // this the only host view. The emulated DSP may write the same pages only
        // while a batch naming the buffer is in flight, and the device refuses
        // `host_view` of such buffers (`Busy`).
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset as usize), len as usize) })
    }
}

impl Drop for ShmPool {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly the mapping made in `create`; no view of it
            // outlives `self` (views borrow `&mut self`).
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
        self.unlink();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_placement_and_reuse() {
        let mut p = ShmPool::create(5 * GRANULE).unwrap();
        assert!(p.path().exists());
        let a = p.place(1).unwrap();
        let b = p.place(GRANULE + 1).unwrap();
        let c = p.place(GRANULE).unwrap();
        assert_eq!((a, b, c), (0, GRANULE, 3 * GRANULE));
        assert_eq!(p.place(2 * GRANULE), None);
        p.release(b);
        assert_eq!(p.place(2 * GRANULE), Some(GRANULE));
        p.bytes_mut(c, GRANULE).unwrap()[7] = 42;
        assert_eq!(p.bytes_mut(c, 8).unwrap()[7], 42);
        assert!(p.bytes_mut(4 * GRANULE, GRANULE + 1).is_none());
        let path = p.path().to_path_buf();
        p.unlink();
        assert!(!path.exists());
    }

    #[test]
    fn placement_follows_the_device_granule() {
        let g = 2 * GRANULE;
        let mut p = ShmPool::create(4 * g).unwrap();
        p.set_granule(g);
        assert_eq!((p.place(1), p.place(g + 1)), (Some(0), Some(g)));
        p.release(0);
        assert_eq!(p.place(2 * g), None, "the freed gap is one granule, the tail one");
        assert_eq!(p.place(g), Some(0));
        assert_eq!(p.place(g), Some(3 * g));
    }
}

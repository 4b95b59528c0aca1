//! The shared-memory region the host hands over (a `/dev/shm` file or memfd,
//! opened by path), and the table of host buffers mapped from it: the emulated
//! counterpart of FastRPC's dma-buf mappings (`fastrpc_mmap` / `HAP_mmap_get`).
//! Each `MapBuffer` maps its piece with `mmap2(MAP_SHARED)`, so host and DSP
//! see the same bytes without copies; `FreeBuffer` unmaps it.

use keel_core::exec::Buffers;
use keel_npu_hal::{BufferId, ErrorKind};

use crate::sys;

/// Buffers that may be mapped at once.
pub const MAX_MAPPINGS: usize = 64;

#[derive(Copy, Clone)]
struct Mapping {
    id: BufferId,
    addr: usize,
    len: u32,
}

/// The opened region and what is mapped from it.
pub struct SharedRegion {
    fd: i32,
    size: u64,
    page: u64,
    maps: [Option<Mapping>; MAX_MAPPINGS],
}

impl SharedRegion {
    /// Opens the NUL-terminated `path` and measures its size; mappings will
    /// start on multiples of `page` bytes (the platform's page size).
    pub fn open(path: &[u8], page: u32) -> Result<SharedRegion, ErrorKind> {
        let fd = sys::open_rw(path);
        if fd < 0 {
            return Err(ErrorKind::DeviceLost);
        }
        let size = sys::file_size(fd).ok_or(ErrorKind::DeviceLost)?;
        Ok(SharedRegion { fd, size, page: u64::from(page), maps: [None; MAX_MAPPINGS] })
    }

    /// Alignment of mappings, bytes (the page size).
    pub fn page(&self) -> u32 {
        self.page as u32
    }

    /// Bytes in the region (the most the host can share with this device).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Maps `len` bytes at `offset` as buffer `id`; returns the device address.
    /// `region` names the region (under QEMU: 0, the `--shm` file).
    pub fn map(&mut self, id: BufferId, region: i32, offset: u64, len: u64) -> Result<u64, ErrorKind> {
        let end = offset.checked_add(len).ok_or(ErrorKind::InvalidArgument)?;
        if region != 0 || len == 0 || end > self.size || !offset.is_multiple_of(self.page) || len > u64::from(u32::MAX) {
            return Err(ErrorKind::InvalidArgument);
        }
        if self.get(id).is_some() {
            return Err(ErrorKind::Busy);
        }
        let slot = self.maps.iter_mut().find(|m| m.is_none()).ok_or(ErrorKind::OutOfMemory)?;
        let addr = sys::mmap_shared(self.fd, offset, len as u32).ok_or(ErrorKind::OutOfMemory)?;
        *slot = Some(Mapping { id, addr, len: len as u32 });
        Ok(addr as u64)
    }

    /// Unmaps buffer `id`.
    pub fn free(&mut self, id: BufferId) -> Result<(), ErrorKind> {
        let slot = self.maps.iter_mut().find(|m| m.is_some_and(|m| m.id == id)).ok_or(ErrorKind::InvalidArgument)?;
        if let Some(m) = slot.take() {
            if !sys::munmap(m.addr, m.len) {
                return Err(ErrorKind::Other);
            }
        }
        Ok(())
    }

    /// Address and length of buffer `id`, if mapped.
    pub fn get(&self, id: BufferId) -> Option<(usize, u32)> {
        self.maps.iter().flatten().find(|m| m.id == id).map(|m| (m.addr, m.len))
    }
}

// SAFETY: `get` answers only live mappings: `map` made each one `mmap2(PROT_READ |
// PROT_WRITE, MAP_SHARED)` of `len` bytes, and only `free` unmaps it, which the message
// loop cannot run while it runs a batch (one message at a time). Nothing else on the
// DSP references the mappings, and the host does not touch a batch's buffers until
// it is answered (the wire protocol's rule).
unsafe impl Buffers for SharedRegion {
    fn get(&self, id: BufferId) -> Option<(*mut u8, usize)> {
        SharedRegion::get(self, id).map(|(addr, len)| (addr as *mut u8, len as usize))
    }
}

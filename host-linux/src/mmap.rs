//! Memory maps: the read-only map of a model file, and the anonymous [`Arena`].
//!
//! Owns the `mmap(2)` uses of the host: [`ModelFile`] holds a GGUF file's bytes, either
//! read once into private memory in transparent huge pages ([`ModelFile::load`], the
//! CLI's default: decoding streams every weight per token, and 2 MiB pages spare the
//! TLB a miss every 4 KiB) or mapped read-only and shared ([`ModelFile::open`],
//! `--mmap`), so its weights are paged in from the page cache on demand and never
//! copied; [`Arena`] is the one private anonymous mapping the core's memory plan is laid
//! out in (KV cache, activations, logits). Pages of the arena are zero and not resident
//! until first written, so an unused tail of a large KV cache costs no memory.
//! It parses nothing itself: [`ModelFile::load_in_execution_order`] asks the core for
//! the header and the model's forward order.

use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Deref;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// Alignment guaranteed for [`Arena`] and [`ModelFile`] data (mappings are page-aligned).
pub const ALIGN: usize = 64;

/// Opening or mapping a model file failed. The message names the file.
#[derive(Debug)]
pub struct MapError {
    path: PathBuf,
    what: &'static str,
    source: io::Error,
}

/// `path` opened for reading, with its length in bytes: refused (as step `what`) if it
/// is a directory or longer than the address space.
fn open_for_reading(path: &Path, what: &'static str) -> Result<(File, usize), MapError> {
    let file = File::open(path).map_err(|e| MapError::new(path, "open", e))?;
    let meta = file.metadata().map_err(|e| MapError::new(path, "stat", e))?;
    if meta.is_dir() {
        return Err(MapError::new(path, what, io::Error::new(io::ErrorKind::InvalidInput, "is a directory")));
    }
    let len = usize::try_from(meta.len())
        .map_err(|_| MapError::new(path, what, io::Error::new(io::ErrorKind::InvalidInput, "larger than the address space")))?;
    Ok((file, len))
}

impl MapError {
    fn new(path: &Path, what: &'static str, source: io::Error) -> Self {
        MapError { path: path.to_path_buf(), what, source }
    }

    /// The file that could not be opened or mapped.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The underlying OS error.
    pub fn io_error(&self) -> &io::Error {
        &self.source
    }
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot {} model file {}: {}",
            self.what,
            self.path.display(),
            self.source
        )
    }
}

impl std::error::Error for MapError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// A run of one tensor's bytes that [`ModelFile::load_in_execution_order_placed`] reads
/// to a place of its own in the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The tensor's data offset in the copy's header (absolute, as `TensorInfo::offset`).
    pub offset: u64,
    /// The run's first byte within the tensor.
    pub from: usize,
    /// The run's bytes.
    pub len: usize,
    /// Where they go in the copy (absolute).
    pub to: usize,
}

/// A whole file's bytes, read-only: mapped ([`ModelFile::open`]) or read into huge pages
/// ([`ModelFile::load`]). Derefs to its bytes.
pub struct ModelFile {
    ptr: NonNull<u8>,
    len: usize,
    path: PathBuf,
    /// The SIGBUS watch on the map (see `fault`).
    watch: Option<usize>,
    /// The private copy's memory, for [`ModelFile::load`] (`None`: a map of the file).
    copy: Option<HugeMap>,
}

// SAFETY: the mapping is read-only and owned by this value; sharing `&[u8]` views of it
// across threads is like sharing any immutable byte slice.
unsafe impl Send for ModelFile {}
// SAFETY: as above.
unsafe impl Sync for ModelFile {}

impl ModelFile {
    /// Maps the file at `path` read-only (`PROT_READ`, `MAP_SHARED`).
    ///
    /// The file must not be truncated while mapped (reads past the new end fault);
    /// model files are written once by `keel pull` and renamed into place, so they are
    /// never modified in place. If one is anyway, the SIGBUS that follows is reported as
    /// an error naming the file (`fault::watch_map`), not a crash.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, MapError> {
        let path = path.as_ref();
        let err = |what, source| MapError::new(path, what, source);
        let (file, len) = open_for_reading(path, "map")?;
        if len == 0 {
            // mmap(2) rejects a length of 0; an empty map needs no memory at all.
            return Ok(ModelFile {
                ptr: NonNull::dangling(),
                len: 0,
                path: path.to_path_buf(),
                watch: None,
                copy: None,
            });
        }
        // SAFETY: a fresh mapping at an address the kernel picks, of a file we hold
        // open; it aliases nothing in this process. The fd may be closed afterwards.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(err("map", io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast::<u8>()).expect("mmap returned null without failing");
        let watch = crate::fault::watch_map(ptr.as_ptr(), len, path);
        Ok(ModelFile {
            ptr,
            len,
            path: path.to_path_buf(),
            watch,
            copy: None,
        })
    }

    /// Reads the file at `path` into private memory of its own, in transparent huge pages
    /// where the kernel has them (`MADV_HUGEPAGE` on a 2 MiB-aligned anonymous map), then
    /// makes that memory read-only. Decoding reads every weight once per token: with
    /// 4 KiB pages that is a TLB miss every 4 KiB (a two-level walk under a hypervisor),
    /// with 2 MiB pages one per 2 MiB (BENCHMARKS.md, "Model weights in huge pages").
    /// The memory is the file's size, resident from the start and not shared with other
    /// processes or the page cache ([`ModelFile::open`] is the shared, lazy choice).
    /// Without transparent huge pages (`never` in
    /// `/sys/kernel/mm/transparent_hugepage/enabled`) the copy is in ordinary pages.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, MapError> {
        use std::io::Read;
        let path = path.as_ref();
        let err = |what, source| MapError::new(path, what, source);
        let (mut file, len) = open_for_reading(path, "read")?;
        let mut copy = HugeMap::new(len).map_err(|e| err("allocate memory for", e))?;
        let buf = copy.as_mut_slice();
        let mut done = 0;
        while done < len {
            match file.read(&mut buf[done..]) {
                Ok(0) => {
                    return Err(err(
                        "read",
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("the file shrank to {done} of {len} bytes while it was read"),
                        ),
                    ))
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(err("read", e)),
            }
        }
        copy.make_read_only();
        Ok(ModelFile {
            ptr: copy.ptr,
            len,
            path: path.to_path_buf(),
            watch: None,
            copy: Some(copy),
        })
    }

    /// [`ModelFile::load`] with the tensors laid out in the order a forward pass reads
    /// them ([`forward_order`]): the header's tensor infos reordered (their offsets
    /// recomputed by the file's alignment, the metadata bytes unchanged) and each tensor's
    /// bytes read from the file into its new place, so the copy is a valid GGUF file with
    /// the same tensors and metadata, and decoding streams the weights forward from the
    /// first block to the last instead of back and forth inside each block as GGUF
    /// writers order them (SmolLM2 135M Q4_0 and Q4_1 tg128 +4% at one thread on the AMD
    /// EPYC, Zen 5: BENCHMARKS.md, "Weights in execution order"). The header is parsed
    /// through a read-only map of the file, of which only the header's pages are touched
    /// (peak RSS: those pages more than `load`'s, +4 MiB for Gemma 3's 262144-token
    /// vocabulary); the copy is the file's size, as `load`'s. A file the core cannot load as a model,
    /// or already in that order, is read as `load` reads it (the core then reports any
    /// error, as before).
    pub fn load_in_execution_order(path: impl AsRef<Path>) -> Result<Self, MapError> {
        Self::load_laid_out(path.as_ref(), None)
    }

    /// [`ModelFile::load_in_execution_order`] with some tensors' bytes read elsewhere in
    /// the copy: `place` is given the copy with its header written and no tensor read yet
    /// (a valid header over zeros) and returns [`Piece`]s; a tensor any piece names is read
    /// only as its pieces say (each run of its bytes straight from the file to its place,
    /// read once), every other tensor whole at its header's offset. The header is not
    /// changed: the caller tells the core where the pieces are (`Gguf::with_splits`). A
    /// piece outside its tensor or the copy, a piece whose offset no tensor starts at, or
    /// two pieces that overlap, is an error (of the caller's plan, not of the file). A
    /// file the core cannot parse is read as [`ModelFile::load`] reads it, `place` not
    /// called.
    pub fn load_in_execution_order_placed(path: impl AsRef<Path>, place: &mut dyn FnMut(&[u8]) -> Vec<Piece>) -> Result<Self, MapError> {
        Self::load_laid_out(path.as_ref(), Some(place))
    }

    fn load_laid_out(path: &Path, place: Option<&mut dyn FnMut(&[u8]) -> Vec<Piece>>) -> Result<Self, MapError> {
        use std::os::unix::fs::FileExt;
        let map = ModelFile::open(path)?;
        let Ok(g) = keel_core::gguf::Gguf::parse(map.bytes()) else { return Self::load(path) };
        let infos: Vec<_> = g.tensors().collect();
        let Some(order) = forward_order(&g) else { return Self::load(path) };
        if place.is_none() && order.iter().enumerate().all(|(k, &i)| k == i) {
            return Self::load(path);
        }
        // The header: magic, version and counts, the metadata entries, then the tensor
        // infos in the new order (the same records, so the same length and data start).
        let align = g.alignment();
        let bytes = map.bytes();
        let mut header = bytes[..g.tensor_infos_at()].to_vec();
        let mut at = vec![0u64; infos.len()];
        let mut end = 0u64;
        for &i in &order {
            let t = &infos[i];
            let offset = end.next_multiple_of(align);
            crate::gguf_write::encode_tensor_info(&mut header, t.name, t.n_dims, &t.ne, t.ty, offset);
            at[i] = offset;
            end = offset + t.data.len() as u64;
        }
        let data_start = g.data_start();
        if header.len().next_multiple_of(align as usize) as u64 != data_start {
            return Self::load(path);
        }
        let len = usize::try_from(data_start + end).map_err(|_| MapError::new(path, "read", io::Error::new(io::ErrorKind::InvalidInput, "larger than the address space")))?;
        let (file, _) = open_for_reading(path, "read")?;
        let mut copy = HugeMap::new(len).map_err(|e| MapError::new(path, "allocate memory for", e))?;
        let buf = copy.as_mut_slice();
        buf[..header.len()].copy_from_slice(&header);
        let mut pieces = place.map(|p| p(&buf[..len])).unwrap_or_default();
        pieces.sort_unstable_by_key(|p| p.to);
        let bad = |why: String| MapError::new(path, "place the tensors of", io::Error::new(io::ErrorKind::InvalidInput, why));
        for w in pieces.windows(2) {
            if w[0].to + w[0].len > w[1].to {
                return Err(bad(format!("pieces at {} and {} overlap", w[0].to, w[1].to)));
            }
        }
        if let Some(p) = pieces.iter().find(|p| !at.iter().any(|&a| data_start + a == p.offset)) {
            return Err(bad(format!("a piece for offset {} lies outside every tensor (no tensor starts there)", p.offset)));
        }
        for (t, &a) in infos.iter().zip(&at) {
            let offset = data_start + a;
            let mut mine = pieces.iter().filter(|p| p.offset == offset).peekable();
            if mine.peek().is_some() {
                for p in mine {
                    if p.from + p.len > t.data.len() || p.to < data_start as usize || p.to + p.len > len {
                        return Err(bad(format!("a piece of {} ({} bytes from {}) lies outside it or the copy", String::from_utf8_lossy(t.name), p.len, p.from)));
                    }
                    file.read_exact_at(&mut buf[p.to..p.to + p.len], t.offset + p.from as u64).map_err(|e| MapError::new(path, "read", e))?;
                }
            } else {
                let dst = &mut buf[offset as usize..][..t.data.len()];
                file.read_exact_at(dst, t.offset).map_err(|e| MapError::new(path, "read", e))?;
            }
        }
        drop(map);
        copy.make_read_only();
        Ok(ModelFile { ptr: copy.ptr, len, path: path.to_path_buf(), watch: None, copy: Some(copy) })
    }

    /// Whether the bytes are a private copy ([`ModelFile::load`]) rather than a map of
    /// the file.
    pub fn is_copy(&self) -> bool {
        self.copy.is_some()
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is a live read-only mapping owned by `self` (or a
        // dangling pointer with `len == 0`, which is valid for an empty slice).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Runs `f` on the bytes, writable, where they are a private copy
    /// ([`ModelFile::load`]; read-only again afterwards); `None` (and `f` not run) for a
    /// map of the file, which is never written, or if the copy cannot be made writable.
    pub fn rewrite<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let len = self.len;
        let copy = self.copy.as_mut()?;
        if !copy.make_writable() {
            return None;
        }
        let r = f(&mut copy.as_mut_slice()[..len]);
        copy.make_read_only();
        Some(r)
    }

    /// The file's path, as given to [`ModelFile::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Asks the kernel to start reading the whole file in (`MADV_WILLNEED`). A hint:
    /// errors are ignored.
    pub fn prefetch(&self) {
        if self.len > 0 {
            // SAFETY: advice on our own live mapping; it does not change its contents.
            unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, libc::MADV_WILLNEED) };
        }
    }
}

impl Deref for ModelFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

impl fmt::Debug for ModelFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelFile")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for ModelFile {
    fn drop(&mut self) {
        crate::fault::unwatch_map(self.watch.take());
        if self.len > 0 && self.copy.is_none() {
            // SAFETY: unmaps exactly the mapping made in `open`; no borrow of it can
            // outlive `self`.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

/// The indices of `g`'s tensors (file order) in the order a forward pass reads them: the
/// model keel builds from `g` walked by `keel_core::block::for_each_weight_in_order` (the
/// block description the passes run), each tensor at its first use, then the tensors no
/// op names in file order. `None` if `g` is not a model keel can load.
fn forward_order(g: &keel_core::gguf::Gguf<'_>) -> Option<Vec<usize>> {
    use keel_core::model::{HParams, Layer, Model};
    let hp = HParams::from_gguf(g).ok()?;
    let mut table: Vec<std::mem::MaybeUninit<Layer<'_>>> = (0..hp.n_layer).map(|_| std::mem::MaybeUninit::uninit()).collect();
    let model = Model::load(g, hp, &mut table).ok()?;
    let at: std::collections::HashMap<(usize, usize), usize> = g.tensors().enumerate().map(|(i, t)| ((t.data.as_ptr() as usize, t.data.len()), i)).collect();
    let mut seen = vec![false; g.n_tensors()];
    let mut order = Vec::with_capacity(g.n_tensors());
    keel_core::block::for_each_weight_in_order(&model, |t| {
        if let Some(&i) = at.get(&(t.data.as_ptr() as usize, t.data.len())) {
            if !std::mem::replace(&mut seen[i], true) {
                order.push(i);
            }
        }
    });
    order.extend((0..seen.len()).filter(|&i| !seen[i]));
    Some(order)
}

/// `map_len` (> 0) bytes of fresh private anonymous read-write memory, zeroed and
/// reserved, not touched (`MAP_NORESERVE`): what [`HugeMap`] and [`Arena`] are carved from.
/// The caller owns the mapping and unmaps it.
fn map_anonymous(map_len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh anonymous mapping at an address the kernel picks; it aliases
    // nothing in this process.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(NonNull::new(p.cast::<u8>()).expect("mmap returned null without failing"))
}

/// Size of a transparent huge page on x86_64 and aarch64 with 4 KiB base pages.
const HUGE_PAGE: usize = 2 << 20;

/// `len` bytes of zeroed, private, anonymous memory starting on a 2 MiB boundary and
/// advised for transparent huge pages (`MADV_HUGEPAGE`; a hint: the kernel may give
/// ordinary pages). For memory read in long streams: a model's weights
/// ([`ModelFile::load`]), the read-bandwidth buffer of `keel bench --roofline`.
pub struct HugeMap {
    /// Start of the usable memory (2 MiB-aligned).
    ptr: NonNull<u8>,
    len: usize,
    /// The whole mapping (the usable memory plus the alignment slack).
    base: NonNull<u8>,
    map_len: usize,
}

// SAFETY: the map exclusively owns its memory, as a `Vec<u8>` does.
unsafe impl Send for HugeMap {}
// SAFETY: as above.
unsafe impl Sync for HugeMap {}

impl HugeMap {
    /// Maps `len` bytes. Fails (with the size in the message) if the kernel refuses.
    pub fn new(len: usize) -> io::Result<Self> {
        let refused = |e: io::Error| io::Error::new(e.kind(), format!("cannot map {len} bytes: {e}"));
        let map_len = len
            .checked_next_multiple_of(HUGE_PAGE)
            .and_then(|l| l.checked_add(HUGE_PAGE))
            .ok_or_else(|| refused(io::Error::new(io::ErrorKind::InvalidInput, "too large")))?;
        let base = map_anonymous(map_len).map_err(refused)?;
        let skip = base.as_ptr().align_offset(HUGE_PAGE);
        // SAFETY: skip < HUGE_PAGE, inside the mapping of len + slack bytes.
        let ptr = unsafe { NonNull::new_unchecked(base.as_ptr().add(skip)) };
        let advised = len.next_multiple_of(HUGE_PAGE);
        // SAFETY: advice on our own fresh mapping (ptr..ptr + advised lies inside it);
        // it changes no contents. A refusal (no THP in this kernel) leaves 4 KiB pages.
        unsafe { libc::madvise(ptr.as_ptr().cast(), advised, libc::MADV_HUGEPAGE) };
        Ok(HugeMap { ptr, len, base, map_len })
    }

    /// The memory, for reading.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` lies in the live mapping owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The memory, for writing (while it is not [`HugeMap::make_read_only`]).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Makes the memory read-only (a write through any pointer then faults), as a map of
    /// a file opened for reading is. Private to this module: `as_mut_slice` must not be
    /// called afterwards, and [`ModelFile::load`] owns the only `HugeMap` it is used on.
    fn make_read_only(&mut self) {
        // SAFETY: changes the protection of our own mapping only; no `&mut` borrow of it
        // is live (the caller hands out only shared views from now on).
        unsafe { libc::mprotect(self.base.as_ptr().cast(), self.map_len, libc::PROT_READ) };
    }

    /// Makes the memory writable again (undoes [`HugeMap::make_read_only`]); false if the
    /// system refused.
    fn make_writable(&mut self) -> bool {
        // SAFETY: changes the protection of our own mapping only.
        unsafe { libc::mprotect(self.base.as_ptr().cast(), self.map_len, libc::PROT_READ | libc::PROT_WRITE) == 0 }
    }
}

impl Drop for HugeMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no borrow outlives `self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

impl fmt::Debug for HugeMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HugeMap").field("len", &self.len).finish()
    }
}

/// `len` bytes of zeroed, private, anonymous memory, page-aligned (so [`ALIGN`]-aligned).
///
/// Pages are reserved, not touched: they become resident only when written. The
/// mapping uses `MAP_NORESERVE`, so a large arena does not count against overcommit
/// until used.
pub struct Arena {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
}

// SAFETY: the arena exclusively owns its mapping; `&mut` access goes through
// `&mut self`, shared access through `&self`, as for a `Vec<u8>`.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// Maps `len` bytes. Fails (with the size in the message) if the kernel refuses.
    pub fn new(len: usize) -> io::Result<Self> {
        let map_len = len.max(1); // mmap(2) rejects 0
        let ptr = map_anonymous(map_len).map_err(|e| io::Error::new(e.kind(), format!("cannot map an arena of {len} bytes: {e}")))?;
        debug_assert_eq!(ptr.as_ptr() as usize % ALIGN, 0);
        Ok(Arena { ptr, len, map_len })
    }

    /// The arena's size in bytes, as requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the arena is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole arena, for reading.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is a live read-write mapping owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole arena, for the core's memory plan to carve up.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena").field("len", &self.len).finish()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no borrow outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_is_zero_writable_aligned() {
        for len in [0usize, 1, 63, 4096, 1 << 20] {
            let mut a = Arena::new(len).unwrap();
            assert_eq!(a.len(), len);
            assert_eq!(a.as_slice().as_ptr() as usize % ALIGN, 0);
            assert!(a.as_slice().iter().all(|&b| b == 0));
            for (i, b) in a.as_mut_slice().iter_mut().enumerate() {
                *b = i as u8;
            }
            assert!(a.as_slice().iter().enumerate().all(|(i, &b)| b == i as u8));
        }
    }

    #[test]
    fn untouched_arena_is_not_resident() {
        let before = crate::mem::current_rss_bytes().unwrap();
        let mut a = Arena::new(1 << 30).unwrap();
        a.as_mut_slice()[0] = 1;
        a.as_mut_slice()[(1 << 30) - 1] = 1;
        let after = crate::mem::current_rss_bytes().unwrap();
        // Other tests run concurrently in this process; 1 GiB would be unmistakable.
        assert!(
            after.saturating_sub(before) < 256 << 20,
            "{before} -> {after}"
        );
    }

    #[test]
    fn maps_a_file_and_names_missing_ones() {
        let dir = std::env::temp_dir().join(format!("keel-mmap-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.gguf");
        std::fs::write(&p, b"GGUF\x03\0\0\0rest").unwrap();
        let m = ModelFile::open(&p).unwrap();
        assert_eq!(&m[..4], b"GGUF");
        assert_eq!(m.len(), 12);
        m.prefetch();
        std::fs::write(dir.join("empty"), b"").unwrap();
        assert!(ModelFile::open(dir.join("empty")).unwrap().is_empty());
        let e = ModelFile::open(dir.join("nope.gguf")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("nope.gguf") && msg.contains("cannot open"),
            "{msg}"
        );
        assert!(ModelFile::open(&dir)
            .unwrap_err()
            .to_string()
            .contains("directory"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `load` holds the same bytes as `open` (a file of several huge pages and a tail,
    /// an empty one), read-only, and names the file it cannot read.
    #[test]
    fn loads_a_file_into_huge_pages() {
        let dir = std::env::temp_dir().join(format!("keel-load-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.gguf");
        let bytes: Vec<u8> = (0..(5 << 20) + 12345u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        let (m, l) = (ModelFile::open(&p).unwrap(), ModelFile::load(&p).unwrap());
        assert!(l.is_copy() && !m.is_copy());
        assert_eq!(l.len(), bytes.len());
        assert!(l[..] == bytes[..] && m[..] == l[..]);
        assert_eq!(l.as_ptr() as usize % HUGE_PAGE, 0);
        drop((m, l));
        std::fs::write(dir.join("empty"), b"").unwrap();
        assert!(ModelFile::load(dir.join("empty")).unwrap().is_empty());
        let msg = ModelFile::load(dir.join("nope.gguf")).unwrap_err().to_string();
        assert!(msg.contains("nope.gguf") && msg.contains("cannot open"), "{msg}");
        assert!(ModelFile::load(&dir).unwrap_err().to_string().contains("directory"));
        let h = HugeMap::new(3 << 20).unwrap();
        assert!(h.as_slice().len() == 3 << 20 && h.as_slice().iter().all(|&b| b == 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `load_in_execution_order_placed` hands the plan the new header over zeros and reads
    /// each piece from the file to its place, every other tensor as
    /// `load_in_execution_order` does; pieces that overlap or lie outside their tensor are
    /// errors naming the file.
    #[test]
    fn loads_pieces_where_the_plan_places_them() {
        use keel_core::gguf::Gguf;
        let Some(model) = keel_test_support::smollm2_path() else { return };
        let plain = ModelFile::load_in_execution_order(&model).unwrap();
        let g = Gguf::parse(plain.bytes()).unwrap();
        let q = g.tensor("blk.2.attn_q.weight").unwrap();
        let (o, half) = (q.offset, q.data.len() / 2);
        // The tensor's halves swapped in its own place.
        let swap = [Piece { offset: o, from: 0, len: half, to: o as usize + half }, Piece { offset: o, from: half, len: half, to: o as usize }];
        let mut seen = false;
        let placed = ModelFile::load_in_execution_order_placed(&model, &mut |copy| {
            let h = Gguf::parse(copy).unwrap();
            seen = h.n_tensors() == g.n_tensors() && copy[h.data_start() as usize..].iter().all(|&b| b == 0);
            swap.to_vec()
        })
        .unwrap();
        assert!(seen, "the plan is given the header over zeros");
        let (a, b) = (plain.bytes(), placed.bytes());
        assert_eq!(a.len(), b.len());
        let o = o as usize;
        assert!(b[o..o + half] == a[o + half..o + 2 * half] && b[o + half..o + 2 * half] == a[o..o + half]);
        assert!(a[..o] == b[..o] && a[o + 2 * half..] == b[o + 2 * half..], "only the pieces' bytes differ");
        // Plans that cannot be followed.
        let q = q.offset;
        for (pieces, why) in [
            (vec![Piece { offset: q, from: 0, len: 64, to: o }, Piece { offset: q, from: 64, len: 64, to: o + 32 }], "overlap"),
            (vec![Piece { offset: q, from: 2 * half - 32, len: 64, to: o }], "outside"),
            (vec![Piece { offset: q, from: 0, len: 64, to: b.len() - 32 }], "outside"),
            (vec![Piece { offset: q + 1, from: 0, len: 64, to: o }], "outside"),
        ] {
            let err = ModelFile::load_in_execution_order_placed(&model, &mut |_| pieces.clone()).unwrap_err().to_string();
            assert!(err.contains(model.to_str().unwrap()) && err.contains(why), "{err}");
        }
    }

    /// `load_in_execution_order` gives a valid GGUF image with the same metadata and the
    /// same bytes under every tensor name, the tensors in the order a forward pass reads
    /// them (SmolLM2, whose file orders a block attn_norm, ffn_down, ffn_gate, ffn_up,
    /// ffn_norm, attn_k, attn_output, attn_q, attn_v); a file in that order already, a
    /// GGUF file that is not a model, or a file that is not GGUF is read as `load` reads it.
    #[test]
    fn loads_tensors_in_execution_order() {
        use crate::gguf_write::{encode_kv, GgufWriter, TensorDecl};
        use keel_core::ggml_type::GgmlType;
        use keel_core::gguf::{Gguf, Value};
        let Some(model) = keel_test_support::smollm2_path() else { return };
        let dir = crate::fsutil::test_dir("exec-order");
        let (orig, copy) = (ModelFile::load(&model).unwrap(), ModelFile::load_in_execution_order(&model).unwrap());
        assert!(copy.is_copy() && orig.bytes() != copy.bytes());
        let (a, b) = (Gguf::parse(orig.bytes()).unwrap(), Gguf::parse(copy.bytes()).unwrap());
        let names: Vec<String> = b.tensors().map(|t| String::from_utf8(t.name.to_vec()).unwrap()).collect();
        let block0: Vec<&str> = names.iter().filter_map(|n| n.strip_prefix("blk.0.")).collect();
        assert_eq!(block0, ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]);
        assert_eq!((names[0].as_str(), names[names.len() - 1].as_str()), ("token_embd.weight", "output_norm.weight"));
        assert!(names.iter().position(|n| n.starts_with("blk.1.")) > names.iter().position(|n| n == "blk.0.ffn_down.weight"));
        assert_eq!((a.n_tensors(), a.n_keys(), a.data_start(), a.alignment()), (b.n_tensors(), b.n_keys(), b.data_start(), b.alignment()));
        assert_eq!(orig.bytes()[..a.tensor_infos_at()], copy.bytes()[..b.tensor_infos_at()]);
        for t in a.tensors() {
            let u = b.tensor(std::str::from_utf8(t.name).unwrap()).unwrap();
            assert_eq!((t.ty, t.ne, t.n_dims, t.data), (u.ty, u.ne, u.n_dims, u.data));
        }
        // In that order already: the file's bytes.
        let p = dir.join("in-order.gguf");
        std::fs::write(&p, copy.bytes()).unwrap();
        assert!(ModelFile::load_in_execution_order(&p).unwrap().bytes() == copy.bytes());
        drop((orig, copy));
        // A GGUF file that is not a model keel loads (no hyper-parameters): its bytes.
        let p = dir.join("not-a-model.gguf");
        let mut kv = Vec::new();
        encode_kv(&mut kv, b"general.alignment", &Value::U32(64));
        let decls: Vec<TensorDecl> = ["blk.0.ffn_down.weight", "blk.0.attn_q.weight"].iter().map(|n| TensorDecl { name: n.as_bytes().to_vec(), ne: [3, 1, 1, 1], n_dims: 1, ty: GgmlType::F32 }).collect();
        let mut w = GgufWriter::create(&p, &kv, 1, &decls, 64).unwrap();
        for _ in &decls {
            w.write_data(&[7u8; 12]).unwrap();
            w.end_tensor().unwrap();
        }
        w.finish().unwrap();
        assert_eq!(ModelFile::load_in_execution_order(&p).unwrap().bytes(), &std::fs::read(&p).unwrap()[..]);
        // Not a GGUF file: its bytes, for the core to refuse as before.
        let p = dir.join("junk.gguf");
        std::fs::write(&p, b"GGUF\x03\0\0\0rest").unwrap();
        assert_eq!(ModelFile::load_in_execution_order(&p).unwrap().bytes(), b"GGUF\x03\0\0\0rest");
        assert!(ModelFile::load_in_execution_order(dir.join("nope.gguf")).unwrap_err().to_string().contains("nope.gguf"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The memory plan and the one arena every session runs in.
//!
//! [`Plan::new`] lists every region a session needs, in bytes, from the model's
//! hyper-parameters and the run limits, before anything runs. The host hands the core one
//! `&mut [u8]` of [`Plan::total_bytes`]; [`carve`] cuts it into the planned regions and
//! nothing is allocated afterwards. Owns: sizes, offsets, alignment, and the casts from
//! bytes to typed slices.

use core::mem::{align_of, size_of, MaybeUninit};

/// Alignment of every region (a cache line; enough for any SIMD load).
pub const REGION_ALIGN: usize = 64;

/// Most regions a plan holds.
pub const MAX_REGIONS: usize = 32;

/// One named region of the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// What the region holds (`kv_k`, `logits`, ...).
    pub name: &'static str,
    /// Offset from the (aligned) start of the arena.
    pub offset: usize,
    /// Size in bytes.
    pub bytes: usize,
}

/// The arena plan: every region, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    regions: heapless::Vec<Region, MAX_REGIONS>,
    end: usize,
}

/// A plan that cannot be made (sizes overflow the address space).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanOverflow {
    /// The region whose size overflowed.
    pub region: &'static str,
}

impl core::fmt::Display for PlanOverflow {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "arena region '{}' does not fit in this machine's address space; lower -c or -b", self.region)
    }
}

impl Plan {
    /// An empty plan.
    pub fn empty() -> Self {
        Plan { regions: heapless::Vec::new(), end: 0 }
    }

    /// Appends a region of `count` elements of `elem` bytes each.
    pub fn add(&mut self, name: &'static str, count: usize, elem: usize) -> Result<(), PlanOverflow> {
        let err = PlanOverflow { region: name };
        let bytes = count.checked_mul(elem).ok_or(err)?;
        let offset = self.end.checked_add(REGION_ALIGN - 1).ok_or(err)? / REGION_ALIGN * REGION_ALIGN;
        self.end = offset.checked_add(bytes).ok_or(err)?;
        self.regions.push(Region { name, offset, bytes }).map_err(|_| err)
    }

    /// The regions, in order.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// The region called `name`.
    pub fn region(&self, name: &str) -> Option<Region> {
        self.regions.iter().copied().find(|r| r.name == name)
    }

    /// Bytes the host must provide: the regions plus slack to align the start.
    pub fn total_bytes(&self) -> usize {
        self.end + REGION_ALIGN
    }
}

/// The arena cut into the plan's regions, handed out one at a time in plan order.
pub struct Carver<'a> {
    base: usize,
    rest: &'a mut [u8],
    consumed: usize,
}

/// The arena given to the core is smaller than the plan says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaTooSmall {
    /// Bytes the plan needs.
    pub needed: usize,
    /// Bytes given.
    pub given: usize,
}

impl core::fmt::Display for ArenaTooSmall {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "arena of {} bytes given, the plan needs {}", self.given, self.needed)
    }
}

/// Starts cutting `mem` for `plan`.
pub fn carve<'a>(mem: &'a mut [u8], plan: &Plan) -> Result<Carver<'a>, ArenaTooSmall> {
    let given = mem.len();
    if given < plan.total_bytes() {
        return Err(ArenaTooSmall { needed: plan.total_bytes(), given });
    }
    let skip = mem.as_ptr().align_offset(REGION_ALIGN).min(REGION_ALIGN);
    let rest = &mut mem[skip..];
    let base = rest.as_ptr() as usize;
    Ok(Carver { base, rest, consumed: 0 })
}

impl<'a> Carver<'a> {
    /// The next region's bytes; `region` must be the next in plan order.
    pub fn bytes(&mut self, region: Region) -> &'a mut [u8] {
        let pad = region.offset - self.consumed;
        let rest = core::mem::take(&mut self.rest);
        let (_, rest) = rest.split_at_mut(pad);
        let (mine, rest) = rest.split_at_mut(region.bytes);
        self.rest = rest;
        self.consumed = region.offset + region.bytes;
        debug_assert_eq!((mine.as_ptr() as usize - self.base) % REGION_ALIGN, 0);
        mine
    }

    /// The next region as `f32`s.
    pub fn f32s(&mut self, region: Region) -> &'a mut [f32] {
        cast_pod(self.bytes(region))
    }

    /// The next region as `f16`s.
    pub fn f16s(&mut self, region: Region) -> &'a mut [half::f16] {
        cast_pod(self.bytes(region))
    }

    /// The next region as `u32`s.
    pub fn u32s(&mut self, region: Region) -> &'a mut [u32] {
        cast_pod(self.bytes(region))
    }

    /// The next region as uninitialised `T`s (for tables of structs).
    pub fn uninit<T>(&mut self, region: Region) -> &'a mut [MaybeUninit<T>] {
        let b = self.bytes(region);
        assert!(align_of::<T>() <= REGION_ALIGN);
        let n = b.len() / size_of::<T>().max(1);
        // SAFETY: the region starts REGION_ALIGN-aligned (>= align_of::<T>()), holds at
        // least n * size_of::<T>() bytes, is borrowed exclusively for 'a, and
        // MaybeUninit<T> has no validity requirement.
        unsafe { core::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<MaybeUninit<T>>(), n) }
    }
}

/// Element types whose every bit pattern is valid, so bytes may be viewed as them.
///
/// # Safety
/// Implementors must be plain data with no padding and no invalid bit patterns.
pub unsafe trait Pod: Copy {}
// SAFETY: all bit patterns are valid for these primitive types; none has padding.
unsafe impl Pod for f32 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for half::f16 {}
// SAFETY: as above.
unsafe impl Pod for u8 {}

/// Views bytes as `T`s; `b` must be aligned for `T` (regions are).
pub fn cast_pod<T: Pod>(b: &mut [u8]) -> &mut [T] {
    assert_eq!(b.as_ptr() as usize % align_of::<T>(), 0, "region misaligned for element type");
    let n = b.len() / size_of::<T>();
    // SAFETY: alignment checked above, length fits, T is Pod (any bits valid), and the
    // exclusive borrow of `b` is transferred to the result.
    unsafe { core::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<T>(), n) }
}

/// Rounds `n` up to a multiple of `m`.
pub fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_aligned_and_disjoint() {
        let mut p = Plan::empty();
        p.add("a", 3, 4).unwrap();
        p.add("b", 100, 1).unwrap();
        p.add("c", 7, 2).unwrap();
        let r = p.regions();
        assert_eq!(r[0].offset, 0);
        assert_eq!(r[1].offset, 64);
        assert_eq!(r[2].offset, 192);
        assert_eq!(p.total_bytes(), 192 + 14 + 64);
        let mut mem = [0u8; 512];
        let mut c = carve(&mut mem[1..], &p).unwrap();
        let a = c.f32s(r[0]);
        assert_eq!(a.len(), 3);
        assert_eq!(a.as_ptr() as usize % 64, 0);
        let b = c.bytes(r[1]);
        assert_eq!(b.len(), 100);
        let cc = c.f16s(r[2]);
        assert_eq!(cc.len(), 7);
    }

    #[test]
    fn too_small_and_overflow_are_errors() {
        let mut p = Plan::empty();
        p.add("a", 1000, 4).unwrap();
        let mut mem = [0u8; 100];
        assert_eq!(carve(&mut mem, &p).err(), Some(ArenaTooSmall { needed: 4064, given: 100 }));
        assert_eq!(p.add("huge", usize::MAX, 2), Err(PlanOverflow { region: "huge" }));
    }
}

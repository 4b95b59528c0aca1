//! Parallelism supplied by the host.
//!
//! The core never spawns threads. A host that has them implements [`Parallel`]; the core
//! splits work by output rows or heads (never inside a reduction), so results are
//! bit-identical whatever the number of threads.

/// A way to run independent tasks at once, supplied by the host.
pub trait Parallel: Sync {
    /// How many tasks may usefully run at once (1 = single-threaded).
    fn n_threads(&self) -> usize;

    /// Runs `task(i)` for every `i` in `0..n_tasks`, possibly concurrently, and returns
    /// when all have finished. Must not allocate per call.
    fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync));
}

/// The single-threaded [`Parallel`]: runs every task in order on the caller's thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sequential;

impl Parallel for Sequential {
    fn n_threads(&self) -> usize {
        1
    }

    fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        for i in 0..n_tasks {
            task(i);
        }
    }
}

/// A mutable slice shared by the tasks of one [`Parallel::run`], each of which writes
/// only parts no other task touches (its rows of a product, its heads of an attention).
pub struct Disjoint<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: core::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: tasks reach the elements only through `part`, whose callers guarantee that no
// two live parts overlap; sending `T`s between threads that way needs `T: Send`.
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    /// Shares `s` (borrowed for as long as the `Disjoint` lives).
    pub fn new(s: &'a mut [T]) -> Self {
        Disjoint { ptr: s.as_mut_ptr(), len: s.len(), _borrow: core::marker::PhantomData }
    }

    /// Elements in the slice.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements `at .. at + n` (panics if they are not all inside).
    ///
    /// # Safety
    /// No other live reference covers any of those elements.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn part(&self, at: usize, n: usize) -> &mut [T] {
        assert!(at <= self.len && n <= self.len - at, "part {at}+{n} of {}", self.len);
        // SAFETY: in bounds (asserted) of a slice borrowed mutably for 'a; exclusive as
        // the caller guarantees.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(at), n) }
    }
}

/// Splits `0..n` into `parts` contiguous ranges of nearly equal length (the first
/// `n % parts` get one more) and returns range `i`.
pub fn split_range(n: usize, parts: usize, i: usize) -> core::ops::Range<usize> {
    let parts = parts.max(1);
    let base = n / parts;
    let extra = n % parts;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    start.min(n)..(start + len).min(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_everything_once() {
        for n in 0..50 {
            for parts in 1..9 {
                let mut next = 0;
                for i in 0..parts {
                    let r = split_range(n, parts, i);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}

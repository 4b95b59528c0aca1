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

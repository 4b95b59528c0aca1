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

/// Task `i`'s items of `0..n` dealt to `parts` tasks in rounds of `parts`, every other
/// round in reverse (round 0: 0, 1, .., parts - 1; round 1: parts - 1, .., 0; ...). Where
/// later items cost more (a prompt's later tokens attend to more keys), this evens the
/// tasks' totals: for a steady rise each round's cost gap is undone by the next, where
/// dealing in order (`i, i + parts, ..`) leaves the last task a round's gap per round
/// (Gemma 3 pp512, 16 blocks of 32 queries on two tasks: 6% over the mean, here none).
pub fn snake_deal(n: usize, parts: usize, i: usize) -> impl Iterator<Item = usize> {
    let parts = parts.max(1);
    (0..n.div_ceil(parts)).map(move |r| r * parts + if r % 2 == 0 { i } else { parts - 1 - i }).filter(move |&k| k < n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_deal_covers_everything_once_and_evens_a_rising_cost() {
        for n in 0..50 {
            for parts in 1..9 {
                let mut seen = [0u8; 50];
                for i in 0..parts {
                    for k in snake_deal(n, parts, i) {
                        seen[k] += 1;
                    }
                }
                assert!(seen[..n].iter().all(|&c| c == 1), "n={n} parts={parts}: {seen:?}");
            }
        }
        // Costs 1, 2, .., 16 on two tasks: 68 each (in order: 64 and 72).
        let total = |i: usize| snake_deal(16, 2, i).map(|k| k + 1).sum::<usize>();
        assert_eq!((total(0), total(1)), (68, 68));
        assert_eq!(snake_deal(7, 3, 1).collect::<heapless::Vec<usize, 8>>().as_slice(), &[1, 4]);
        assert_eq!(snake_deal(7, 3, 0).collect::<heapless::Vec<usize, 8>>().as_slice(), &[0, 5, 6]);
    }

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

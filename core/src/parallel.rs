//! Parallelism supplied by the host.
//!
//! The core never spawns threads. A host that has them implements [`Parallel`]; the core
//! splits work by output rows or heads (never inside a reduction), so results are
//! bit-identical whatever the number of threads.

use core::sync::atomic::{AtomicUsize, Ordering};

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

/// Items of `0..n` claimed one at a time from a shared counter by whichever task is free,
/// the costliest first (the highest index: a prompt's later tokens attend to more keys).
/// A task whose core is slower for a while (a busier core, a host that takes the vCPU
/// away) claims fewer, where a fixed deal (the alternating rounds used before) leaves
/// every task waiting for the slowest one's share. Which task computes an item changes
/// no bit when each item writes only its own outputs. One atomic add per item; no
/// allocation.
pub struct Claims {
    next: AtomicUsize,
    n: usize,
}

impl Claims {
    /// `n` items, none claimed yet.
    pub fn new(n: usize) -> Claims {
        Claims { next: AtomicUsize::new(0), n }
    }

    /// The items this task claims, each of `0..n` handed to exactly one caller over all
    /// tasks, from `n - 1` down.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        core::iter::from_fn(move || {
            let k = self.next.fetch_add(1, Ordering::Relaxed);
            (k < self.n).then(|| self.n - 1 - k)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_hand_out_every_item_once_costliest_first() {
        for n in 0..40 {
            // Three tasks taking turns unevenly (one item, two, three): each item once.
            let c = Claims::new(n);
            let mut its = [c.iter(), c.iter(), c.iter()];
            let (mut seen, mut order) = ([0u8; 40], heapless::Vec::<usize, 40>::new());
            'outer: loop {
                for (t, it) in its.iter_mut().enumerate() {
                    for _ in 0..=t {
                        let Some(k) = it.next() else { break 'outer };
                        seen[k] += 1;
                        order.push(k).unwrap();
                    }
                }
            }
            for it in its.iter_mut() {
                assert_eq!(it.next(), None, "n={n}: an item after the end");
            }
            assert!(seen[..n].iter().all(|&s| s == 1), "n={n}: {seen:?}");
            assert!(order.windows(2).all(|w| w[0] > w[1]), "n={n}: not costliest first: {order:?}");
        }
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

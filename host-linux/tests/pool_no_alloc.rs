//! `ThreadPool::run` must not allocate: checked with the counting global allocator.
//!
//! The count is process-wide, so this binary has its own `main` (`harness = false` in
//! Cargo.toml): under libtest, its main thread's bookkeeping (the running-test table,
//! the timeout queue) could allocate while the test counts, as it once did on a loaded
//! CI machine (3 allocations with a one-thread pool, which has no worker at all).

use std::sync::atomic::{AtomicUsize, Ordering};

use keel_core::parallel::Parallel;
use keel_host_linux::mem::{allocations, CountingAllocator};
use keel_host_linux::pool::ThreadPool;

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator::new();

fn main() {
    for threads in [1, 2, 4] {
        let pool = ThreadPool::new(threads).unwrap();
        let sum = AtomicUsize::new(0);
        let task = |i: usize| {
            sum.fetch_add(i, Ordering::Relaxed);
        };
        pool.run(8, &task); // warm-up: first-use lazy statics, if any
        let before = allocations();
        for n in [0, 1, 2, 3, 8, 100] {
            for _ in 0..1000 {
                pool.run(n, &task);
            }
        }
        let after = allocations();
        assert_eq!(after - before, 0, "{threads} threads: {} allocations in run", after - before);
        let per_round: usize = [0usize, 1, 2, 3, 8, 100].iter().map(|n| n * (n.max(&1) - 1) / 2).sum();
        assert_eq!(sum.load(Ordering::Relaxed), 28 + 1000 * per_round);
    }
    assert!(allocations() > 0, "the counting allocator is installed");
    println!("test run_allocates_nothing ... ok (1, 2 and 4 threads: 0 allocations in 6,000 runs each)");
}

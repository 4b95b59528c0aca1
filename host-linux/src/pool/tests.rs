//! Tests of the thread pool; the overhead bench is `#[ignore]`d (see `bench_run_overhead`).

use super::*;
use std::sync::atomic::AtomicU8;

fn check_each_once(pool: &ThreadPool, n: usize) {
    let hits: Vec<AtomicU8> = (0..n).map(|_| AtomicU8::new(0)).collect();
    pool.run(n, &|i| {
        hits[i].fetch_add(1, Ordering::Relaxed);
    });
    for (i, h) in hits.iter().enumerate() {
        assert_eq!(h.load(Ordering::Relaxed), 1, "task {i} of {n}");
    }
}

#[test]
fn every_index_runs_exactly_once() {
    for threads in [0, 1, 2, 3, 4, 7] {
        for spin in [Duration::ZERO, DEFAULT_SPIN] {
            let pool = ThreadPool::with_spin(threads, spin).unwrap();
            assert_eq!(pool.n_threads(), threads.max(1));
            for n in (0..40).chain([100, 1000, 4097]) {
                check_each_once(&pool, n);
            }
            for _ in 0..300 {
                check_each_once(&pool, 5);
            }
        }
    }
}

#[test]
fn jobs_counts_hand_offs_only() {
    let pool = ThreadPool::new(2).unwrap();
    let j0 = pool.jobs();
    for n in [2, 3, 64] {
        pool.run(n, &|_| {});
    }
    assert_eq!(pool.jobs().wrapping_sub(j0), 3, "three calls of 2+ tasks: three hand-offs");
    // One task runs on the caller; a call from inside a task finds the pool busy and
    // runs its tasks in order there: neither hands anything off.
    pool.run(1, &|_| {});
    pool.run(2, &|_| pool.run(4, &|_| {}));
    assert_eq!(pool.jobs().wrapping_sub(j0), 4);
    let single = ThreadPool::new(1).unwrap();
    single.run(8, &|_| {});
    assert_eq!(single.jobs(), 0, "no workers: nothing handed off");
}

/// `time` splits the caller's time by job: a worker's task that sleeps is the caller's
/// wait, the caller's own sleeping task its tasks, its sleep between jobs (and a call it
/// runs alone) between; jobs handed off outside `time` are not counted. (Lower bounds
/// only: a sleep takes at least its time, however slow the machine.)
#[test]
fn time_splits_the_callers_time_by_job() {
    let pool = ThreadPool::new(2).unwrap();
    let ms = Duration::from_millis;
    let mut t = JobTimes::default();
    let started = Instant::now();
    let r = pool.time(&mut t, || {
        std::thread::sleep(ms(3));
        for _ in 0..3 {
            pool.run(2, &|i| std::thread::sleep(ms(if i == 0 { 1 } else { 4 })));
        }
        pool.run(1, &|_| std::thread::sleep(ms(2)));
        7
    });
    let elapsed = started.elapsed();
    assert_eq!((r, t.jobs), (7, 3));
    assert!(t.tasks >= ms(3), "{t:?}: three tasks of the caller's, 1 ms each");
    assert!(t.tasks + t.wait >= ms(3 * 4) && t.wait > Duration::ZERO, "{t:?}: each job lasts as long as its worker's 4 ms task");
    assert!(t.between >= ms(5), "{t:?}: 3 ms before the first job, 2 ms in a call run alone");
    assert!(t.total() <= elapsed, "{t:?} in {elapsed:?}");
    // Off again: a job outside `time` is not counted; a second `time` adds to the first.
    pool.run(2, &|_| {});
    let before = t;
    pool.time(&mut t, || pool.run(2, &|_| {}));
    assert_eq!(t.jobs, before.jobs + 1);
    assert!(t.tasks >= before.tasks && t.between >= before.between);
}

#[test]
fn hand_off_is_a_job_there_and_back() {
    let pool = ThreadPool::new(2).unwrap();
    let j0 = pool.jobs();
    let d = pool.hand_off(3, 10).expect("two threads hand off");
    assert!(d > Duration::ZERO && d < Duration::from_millis(10), "{d:?}");
    assert_eq!(pool.jobs().wrapping_sub(j0), 30, "3 batches of 10 jobs");
    assert_eq!(pool.hand_off(0, 10), None);
    assert_eq!(ThreadPool::new(1).unwrap().hand_off(3, 10), None, "no workers: nothing handed off");
}

#[test]
fn workers_take_part() {
    let pool = ThreadPool::with_spin(3, Duration::from_millis(5)).unwrap();
    let caller = std::thread::current().id();
    let others = AtomicUsize::new(0);
    for _ in 0..200 {
        pool.run(64, &|_| {
            if std::thread::current().id() != caller {
                others.fetch_add(1, Ordering::Relaxed);
            }
            std::hint::black_box((0..2000u32).sum::<u32>());
        });
    }
    assert!(
        others.load(Ordering::Relaxed) > 0,
        "only the caller ran tasks"
    );
}

#[test]
fn panic_propagates_and_pool_survives() {
    for threads in [1, 2, 4] {
        let pool = ThreadPool::with_spin(threads, Duration::ZERO).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(50, &|i| {
                if i == 7 {
                    panic!("task seven failed");
                }
            })
        }));
        let payload = r.expect_err("the panic must reach the caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"task seven failed"));
        check_each_once(&pool, 50);
    }
}

#[test]
fn nested_and_concurrent_runs_do_not_deadlock() {
    let pool = ThreadPool::new(3).unwrap();
    let total = AtomicUsize::new(0);
    pool.run(8, &|_| {
        pool.run(10, &|_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
    });
    assert_eq!(total.load(Ordering::Relaxed), 80);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..200 {
                    check_each_once(&pool, 17);
                }
            });
        }
    });
}

/// Per-call overhead at 2 threads, against the floor of one cache-line round trip
/// between two spinning threads. Reports the best and the median of 40 batches
/// (the machine may be shared). Run with
/// `cargo test --release -p keel-host-linux pool::tests::bench -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_run_overhead() {
    fn report(what: &str, mut per_call: Vec<f64>) {
        per_call.sort_by(f64::total_cmp);
        println!(
            "{what}: best {:.0} ns, median {:.0} ns per call",
            per_call[0],
            per_call[per_call.len() / 2]
        );
    }
    const BATCH: u32 = 10_000;
    let ping = AtomicU32::new(0);
    let pong = AtomicU32::new(0);
    let stop = AtomicBool::new(false);
    let mut floor = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                let v = ping.load(Ordering::Acquire);
                if v != last {
                    last = v;
                    pong.store(v, Ordering::Release);
                }
                spin_loop();
            }
        });
        let mut v = 0;
        for _ in 0..40 {
            let t = Instant::now();
            for _ in 0..BATCH {
                v += 1;
                ping.store(v, Ordering::Release);
                while pong.load(Ordering::Acquire) != v {
                    spin_loop();
                }
            }
            floor.push(t.elapsed().as_nanos() as f64 / f64::from(BATCH));
        }
        stop.store(true, Ordering::Relaxed);
    });
    report("floor: one round trip between 2 spinning threads", floor);
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads).unwrap();
        let task = |i: usize| {
            std::hint::black_box(i);
        };
        let mut times = Vec::new();
        for _ in 0..40 {
            let t = Instant::now();
            for _ in 0..BATCH {
                pool.run(2, &task);
            }
            times.push(t.elapsed().as_nanos() as f64 / f64::from(BATCH));
        }
        report(
            &format!("ThreadPool::run, {threads} thread(s), 2 empty tasks"),
            times,
        );
    }
}

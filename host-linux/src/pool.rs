//! `ThreadPool`: the core's [`Parallel`] on std threads.
//!
//! Owns the worker threads and the hand-off protocol between the calling thread and
//! them; knows nothing of models or kernels.
//!
//! Protocol, per [`Parallel::run`] call (no heap allocation, no lock on the fast path):
//! 1. the caller claims the pool (`busy`), stores the lifetime-erased task pointer, the
//!    task count and the check-out count it will wait for, then bumps the generation
//!    counter `epoch`; workers spinning on it see the change, and workers asleep on it
//!    (futex) are woken, with a syscall only if some are asleep;
//! 2. thread `t` (the caller is 0, workers are 1..) runs task `t`; tasks beyond the
//!    thread count are handed out by the atomic counter `next`. So the common job of
//!    one task per thread touches no shared counter at all;
//! 3. each worker then "checks out" by incrementing `done`, and the caller waits (spin,
//!    then futex) until `done` reaches its target. Only then does it return, so no
//!    worker ever touches a dead closure.
//!
//! The job (which the workers spin on and read) and the check-outs (which they write)
//! sit on separate cache lines, so a job costs about one line transfer each way.
//! Measured on a 2-vCPU KVM guest, 2 threads, empty tasks: 0.4–0.55 µs per `run`, the
//! same as one round trip between two threads spinning on a flag there (0.13–0.5 µs,
//! depending on the host). `pool::tests::bench_run_overhead` measures both.
//!
//! Waiting threads spin for [`DEFAULT_SPIN`] (or the value given to
//! [`ThreadPool::with_spin`]) before sleeping in the kernel, so back-to-back calls of a
//! forward pass hand off in well under a microsecond while an idle pool costs no CPU.
//!
//! Panics: a panic in a task is caught; the remaining tasks of that call that have
//! not started are skipped, the caller waits for every thread to check out, and then
//! re-raises the first panic on the calling thread (`resume_unwind`). The pool stays
//! usable afterwards. (With `panic = "abort"` the process aborts, as anywhere.)
//!
//! Re-entrancy: a `run` made while the pool is busy (from inside one of its tasks, or
//! concurrently from another thread) runs its tasks in order on the calling thread. It
//! never deadlocks and gives the same results, since the core's tasks are independent.

use core::ptr::NonNull;
use std::any::Any;
use std::cell::UnsafeCell;
use std::hint::spin_loop;
use std::io;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use keel_core::parallel::Parallel;

/// How long an idle thread spins before it sleeps in the kernel: longer than the gap
/// between two tokens' forward passes (sampling, and for a large vocabulary the scan of
/// the logits), so that during generation the workers never sleep. Waking a sleeping
/// worker costs far more than the gap: on the 2-vCPU KVM guest (AMD EPYC), the caller's
/// `FUTEX_WAKE` took ~23 µs and the worker started 60-110 µs late. With 100 µs, Gemma 3
/// 270M (262144 logits) slept once per token at two threads; with 1 ms it does not:
/// tg128 244 -> 250 t/s (four alternations; SmolLM2, whose gap is shorter, unchanged).
pub const DEFAULT_SPIN: Duration = Duration::from_millis(1);

/// The job closure with its lifetime erased (stored only between hand-off and check-out).
type Task = dyn Fn(usize) + Sync + 'static;

/// A fixed set of worker threads that run [`Parallel`] jobs with the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

/// Keeps a value on its own cache line(s), so writes to it do not evict its neighbours
/// (128 bytes: x86 prefetches lines in pairs).
#[repr(align(128))]
struct Padded<T>(T);

/// State shared between the caller of `run` and the workers.
struct Shared {
    /// Held by the thread whose job is in flight (its own line: only callers touch it).
    busy: Padded<AtomicBool>,
    /// Written by the caller once per job, read by the workers.
    job: Padded<Job>,
    /// Next task index to hand out; used only when there are more tasks than threads.
    next: Padded<AtomicUsize>,
    /// Written by the workers as they check out, read by the caller.
    done: Padded<Done>,
    /// Threads taking part, the caller included.
    n_threads: usize,
    /// The first panic of the current job (touched only when a task panics).
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    spin: Duration,
    /// The calling thread's time by hand-off, while [`ThreadPool::time`] runs (its own
    /// line: only the thread holding `busy`, or the one timing, touches it).
    timing: Padded<Timing>,
}

/// [`ThreadPool::time`]'s counters: nanoseconds since `clock`, summed per job.
struct Timing {
    on: AtomicBool,
    clock: Instant,
    /// When the caller's last job ended (or the timing started).
    last_end: AtomicU64,
    jobs: AtomicU64,
    tasks: AtomicU64,
    wait: AtomicU64,
    between: AtomicU64,
}

impl Timing {
    fn now(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }
}

/// Where the calling thread's time went while [`ThreadPool::time`] ran its closure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobTimes {
    /// Jobs handed to the workers.
    pub jobs: u64,
    /// In its own tasks of those jobs (each hand-off itself included).
    pub tasks: Duration,
    /// Waiting, its tasks done, for the workers to finish theirs.
    pub wait: Duration,
    /// Outside the jobs: from the closure's start to the first hand-off, from each job's
    /// end to the next hand-off, from the last job's end to the closure's end (the work
    /// only the calling thread does, calls run on it alone included, while the workers
    /// spin).
    pub between: Duration,
}

impl JobTimes {
    /// All three parts: the time the closures took.
    pub fn total(&self) -> Duration {
        self.tasks + self.wait + self.between
    }
}

impl std::ops::AddAssign for JobTimes {
    fn add_assign(&mut self, o: JobTimes) {
        self.jobs += o.jobs;
        self.tasks += o.tasks;
        self.wait += o.wait;
        self.between += o.between;
    }
}

/// The current job, written by the caller, read by the workers. One line: the
/// workers spin on `epoch`, and the same transfer that shows them a new epoch brings
/// them the job's data.
struct Job {
    /// Generation counter: bumped once per job and once at shutdown. Futex word.
    epoch: AtomicU32,
    /// Workers asleep (or about to sleep) on `epoch`.
    sleepers: AtomicU32,
    shutdown: AtomicBool,
    /// Number of tasks in the current job.
    n_tasks: AtomicUsize,
    /// The value `done.count` reaches when every worker has checked out of this job.
    done_target: AtomicU32,
    /// The current job's closure, its lifetime erased (see `run_parallel`).
    task: UnsafeCell<Option<NonNull<Task>>>,
}

struct Done {
    /// Check-outs so far (wrapping). Futex word.
    count: AtomicU32,
    /// Set while the caller is (about to be) asleep on `count`.
    caller_waiting: AtomicBool,
    /// Set (before check-out) when a task of the current job panicked.
    panicked: AtomicBool,
}

// SAFETY: every field but `job.task` is Sync/Send on its own. `job.task` is written
// only by the thread holding `busy`, and only while no worker reads it: after every
// worker checked out of the previous job and before the `epoch` bump that publishes the
// next (SeqCst). Workers read and dereference it only between that bump and their
// check-out, while the caller keeps the closure alive.
// The pointee is `Sync`, so calling it from several threads at once is allowed.
unsafe impl Sync for Shared {}
// SAFETY: as above; the pointer is only a borrowed `&(dyn Fn + Sync)` in disguise.
unsafe impl Send for Shared {}

impl ThreadPool {
    /// A pool in which `n_threads` threads run tasks: `n_threads - 1` workers plus the
    /// thread that calls `run`. `0` is taken as 1 (no workers: `run` is sequential).
    pub fn new(n_threads: usize) -> io::Result<Self> {
        Self::with_spin(n_threads, DEFAULT_SPIN)
    }

    /// Like [`ThreadPool::new`], with the time an idle thread spins before sleeping.
    pub fn with_spin(n_threads: usize, spin: Duration) -> io::Result<Self> {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            busy: Padded(AtomicBool::new(false)),
            job: Padded(Job {
                epoch: AtomicU32::new(0),
                sleepers: AtomicU32::new(0),
                shutdown: AtomicBool::new(false),
                n_tasks: AtomicUsize::new(0),
                done_target: AtomicU32::new(0),
                task: UnsafeCell::new(None),
            }),
            next: Padded(AtomicUsize::new(0)),
            done: Padded(Done {
                count: AtomicU32::new(0),
                caller_waiting: AtomicBool::new(false),
                panicked: AtomicBool::new(false),
            }),
            n_threads,
            panic: Mutex::new(None),
            spin,
            timing: Padded(Timing {
                on: AtomicBool::new(false),
                clock: Instant::now(),
                last_end: AtomicU64::new(0),
                jobs: AtomicU64::new(0),
                tasks: AtomicU64::new(0),
                wait: AtomicU64::new(0),
                between: AtomicU64::new(0),
            }),
        });
        let mut pool = ThreadPool {
            shared,
            workers: Vec::with_capacity(n_threads - 1),
        };
        for index in 1..n_threads {
            let sh = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("keel-pool-{index}"))
                .spawn(move || worker_loop(&sh, index))?; // on error, Drop joins the others
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Jobs handed to the workers so far, wrapping (the job counter `epoch`): the
    /// difference of two readings is the number of hand-offs between them. Calls that
    /// ran on the calling thread alone (one task, no workers, a busy pool) hand nothing
    /// off and are not counted.
    pub fn jobs(&self) -> u32 {
        self.shared.job.0.epoch.load(Ordering::Relaxed)
    }

    /// Runs `f` and adds to `times` where the calling thread's time went meanwhile: its
    /// own tasks, waiting for the workers, and outside the jobs ([`JobTimes`]), job by
    /// job. Two clock reads a job while it runs, none otherwise. Call it from the thread
    /// that calls `run` (the engine's); jobs another thread hands off meanwhile are not
    /// told apart.
    pub fn time<R>(&self, times: &mut JobTimes, f: impl FnOnce() -> R) -> R {
        let t = &self.shared.timing.0;
        for c in [&t.jobs, &t.tasks, &t.wait, &t.between] {
            c.store(0, Ordering::Relaxed);
        }
        t.last_end.store(t.now(), Ordering::Relaxed);
        t.on.store(true, Ordering::Relaxed);
        let r = f();
        t.on.store(false, Ordering::Relaxed);
        let tail = t.now().saturating_sub(t.last_end.load(Ordering::Relaxed));
        let ns = |c: &AtomicU64| Duration::from_nanos(c.load(Ordering::Relaxed));
        *times += JobTimes { jobs: t.jobs.load(Ordering::Relaxed), tasks: ns(&t.tasks), wait: ns(&t.wait), between: ns(&t.between) + Duration::from_nanos(tail) };
        r
    }

    /// What one hand-off costs now: an empty job of one task per thread, from the
    /// calling thread to the workers and back, per job, the fastest of `batches` batches
    /// of `per_batch` jobs. `None` with no workers, or where another thread had the pool
    /// meanwhile (a job ran on the caller alone). A shared machine moves its vCPUs: on the
    /// two-vCPU Zen 5 VM it was 57-102 ns in minutes when the two threads shared one
    /// core and 550-560 ns when they ran on two (BENCHMARKS.md), so a decode figure
    /// comes with the minutes' hand-off beside it (`keel bench --roofline`).
    pub fn hand_off(&self, batches: u32, per_batch: u32) -> Option<Duration> {
        if self.workers.is_empty() || batches == 0 || per_batch == 0 {
            return None;
        }
        let empty = |i: usize| {
            std::hint::black_box(i);
        };
        let mut best = Duration::MAX;
        for _ in 0..batches {
            let (t, j0) = (Instant::now(), self.jobs());
            for _ in 0..per_batch {
                self.run(self.shared.n_threads, &empty);
            }
            let took = t.elapsed();
            if self.jobs().wrapping_sub(j0) != per_batch {
                return None;
            }
            best = best.min(took / per_batch);
        }
        Some(best)
    }

    /// The number of hardware threads available to this process (at least 1).
    pub fn default_threads() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    /// The job protocol described in the module docs; `n_tasks >= 2`, pool claimed.
    fn run_parallel(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        let sh = &*self.shared;
        let (job, done) = (&sh.job.0, &sh.done.0);
        // SAFETY: only the lifetime is erased. Workers dereference the pointer only
        // until they check out of this job, and this function does not return (not even
        // by unwinding: tasks run under catch_unwind) before every worker has checked
        // out; `task` outlives this call.
        let erased: NonNull<Task> = unsafe {
            core::mem::transmute::<NonNull<dyn Fn(usize) + Sync + '_>, NonNull<Task>>(
                NonNull::from(task),
            )
        };
        // SAFETY: we hold `busy` and every worker checked out of the previous job, so
        // no worker reads the cell now (see `unsafe impl Sync for Shared`).
        unsafe { *job.task.get() = Some(erased) };
        let target = job
            .done_target
            .load(Ordering::Relaxed)
            .wrapping_add(self.workers.len() as u32);
        job.done_target.store(target, Ordering::Relaxed);
        job.n_tasks.store(n_tasks, Ordering::Relaxed);
        if n_tasks > sh.n_threads {
            sh.next.0.store(sh.n_threads, Ordering::Relaxed);
        }
        let timing = &sh.timing.0;
        let t0 = timing.on.load(Ordering::Relaxed).then(|| timing.now());
        // Publishes everything above to the workers that observe the new epoch.
        job.epoch.fetch_add(1, Ordering::SeqCst);
        if job.sleepers.load(Ordering::SeqCst) != 0 {
            futex_wake(&job.epoch, i32::MAX);
        }

        do_tasks(sh, task, 0);
        let t1 = t0.map(|_| timing.now());

        // Wait for every worker to check out: spin, then sleep on `done.count`.
        let mut spin = Spin::new(sh.spin);
        while done.count.load(Ordering::Acquire) != target && spin.again() {}
        let mut slept = false;
        loop {
            let seen = done.count.load(Ordering::SeqCst);
            if seen == target {
                break;
            }
            slept = true;
            done.caller_waiting.store(true, Ordering::SeqCst);
            if done.count.load(Ordering::SeqCst) != seen {
                continue;
            }
            futex_wait(&done.count, seen);
        }
        if slept {
            done.caller_waiting.store(false, Ordering::Relaxed);
        }
        if let (Some(t0), Some(t1)) = (t0, t1) {
            let t2 = timing.now();
            timing.between.fetch_add(t0.saturating_sub(timing.last_end.load(Ordering::Relaxed)), Ordering::Relaxed);
            timing.tasks.fetch_add(t1 - t0, Ordering::Relaxed);
            timing.wait.fetch_add(t2 - t1, Ordering::Relaxed);
            timing.jobs.fetch_add(1, Ordering::Relaxed);
            timing.last_end.store(t2, Ordering::Relaxed);
        }
        // The cell keeps the now dangling pointer: workers dereference it only after a
        // new epoch, and every new epoch but shutdown comes with a new pointer.
        let mut panic = None;
        if done.panicked.load(Ordering::Relaxed) {
            done.panicked.store(false, Ordering::Relaxed);
            panic = sh.panic.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
        sh.busy.0.store(false, Ordering::Release);
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
    }
}

impl Parallel for ThreadPool {
    fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        let parallel = n_tasks >= 2
            && !self.workers.is_empty()
            && self
                .shared
                .busy
                .0
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok();
        if parallel {
            self.run_parallel(n_tasks, task);
        } else {
            (0..n_tasks).for_each(task);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let job = &self.shared.job.0;
        job.shutdown.store(true, Ordering::SeqCst);
        job.epoch.fetch_add(1, Ordering::SeqCst);
        futex_wake(&job.epoch, i32::MAX);
        for handle in self.workers.drain(..) {
            // Tasks run under catch_unwind, so a worker cannot have died of a panic.
            let _ = handle.join();
        }
    }
}

impl core::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.shared.n_threads)
            .field("spin", &self.shared.spin)
            .finish()
    }
}

fn worker_loop(sh: &Shared, index: usize) {
    let (job, done) = (&sh.job.0, &sh.done.0);
    let mut seen = 0u32;
    loop {
        seen = wait_for_new_epoch(sh, seen);
        if job.shutdown.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: a new epoch other than shutdown means a job was published with the
        // cell set, and the caller keeps the closure alive until we check out below.
        if let Some(task) = unsafe { *job.task.get() } {
            // SAFETY: as above; the pointee is a live `&(dyn Fn(usize) + Sync)`.
            do_tasks(sh, unsafe { task.as_ref() }, index);
        }
        // Read before checking out: the caller changes it only after every check-out.
        let target = job.done_target.load(Ordering::Relaxed);
        // Check out. After this the job's closure must not be touched.
        let now = done.count.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
        if now == target && done.caller_waiting.load(Ordering::SeqCst) {
            futex_wake(&done.count, 1);
        }
    }
}

/// Spins, then sleeps, until `epoch` differs from `seen`; returns the new value.
fn wait_for_new_epoch(sh: &Shared, seen: u32) -> u32 {
    let job = &sh.job.0;
    let mut spin = Spin::new(sh.spin);
    loop {
        let e = job.epoch.load(Ordering::Acquire);
        if e != seen {
            return e;
        }
        if !spin.again() {
            break;
        }
    }
    loop {
        job.sleepers.fetch_add(1, Ordering::SeqCst);
        if job.epoch.load(Ordering::SeqCst) == seen {
            futex_wait(&job.epoch, seen);
        }
        job.sleepers.fetch_sub(1, Ordering::SeqCst);
        let e = job.epoch.load(Ordering::Acquire);
        if e != seen {
            return e;
        }
    }
}

/// Runs task `first` (this thread's own), then takes indices from the shared counter
/// while tasks beyond the thread count remain.
fn do_tasks(sh: &Shared, task: &(dyn Fn(usize) + Sync), first: usize) {
    let n = sh.job.0.n_tasks.load(Ordering::Relaxed);
    if first < n {
        run_caught(sh, task, first, n);
    }
    if n > sh.n_threads {
        loop {
            let i = sh.next.0.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return;
            }
            run_caught(sh, task, i, n);
        }
    }
}

fn run_caught(sh: &Shared, task: &(dyn Fn(usize) + Sync), i: usize, n: usize) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| task(i))) {
        sh.next.0.store(n, Ordering::Relaxed); // skip the tasks not yet handed out
        let mut slot = sh.panic.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(payload);
        }
        sh.done.0.panicked.store(true, Ordering::Relaxed);
    }
}

/// A bounded busy-wait: `again()` waits a little and says whether to keep waiting.
///
/// The first iterations only pause the core (`spin_loop`); after [`PAUSE_PHASE`] each
/// iteration yields the CPU instead, so that when there are more runnable threads than
/// cores (a loaded machine, or more pool threads than cores) the thread being waited
/// for gets to run. After `limit` the caller sleeps in the kernel.
struct Spin {
    limit: Duration,
    iters: u32,
    start: Option<Instant>,
    yielding: bool,
}

/// How long a wait only pauses before it starts yielding the CPU.
const PAUSE_PHASE: Duration = Duration::from_micros(4);

impl Spin {
    fn new(limit: Duration) -> Self {
        Spin {
            limit,
            iters: 0,
            start: None,
            yielding: false,
        }
    }

    fn again(&mut self) -> bool {
        self.iters = self.iters.wrapping_add(1);
        if self.yielding || self.iters % 64 == 0 {
            // The clock is read only once a hand-off is not immediate.
            let waited = self.start.get_or_insert_with(Instant::now).elapsed();
            if waited >= self.limit {
                return false;
            }
            self.yielding = waited >= PAUSE_PHASE;
        }
        if self.yielding {
            std::thread::yield_now();
        } else {
            spin_loop();
        }
        true
    }
}

fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: FUTEX_WAIT only reads the aligned u32 behind a live atomic and sleeps
    // while it equals `expected`; a null timeout means no deadline. EINTR, EAGAIN and
    // spurious wake-ups are fine: every caller re-checks its condition in a loop.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            core::ptr::null::<libc::timespec>(),
        );
    }
}

fn futex_wake(word: &AtomicU32, n: i32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key; it does not access memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
        );
    }
}

#[cfg(test)]
mod tests;

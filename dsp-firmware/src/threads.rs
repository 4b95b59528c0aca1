//! Hardware threads for keel-core's [`Parallel`]: a device splits each matrix product's
//! row groups over several threads, as the products of a cDSP are split over its HVX
//! contexts. The pool is the same everywhere; how a thread is started, parked and
//! ended is an [`Os`]:
//! - [`Linux`] (the device ELF under `qemu-hexagon`, `--threads N`): `clone` with the
//!   thread flags (QEMU runs each on a host thread of its own), futexes;
//! - the FastRPC skel's QuRT backend (`skel/src/lib.rs`): `qurt_thread_create`,
//!   `qurt_futex_wait/wake`, each worker holding an HVX context while it runs its share.
//!
//! A parked thread executes no packets. Thread `i` always runs share `i` (no stealing),
//! so the cost model's critical path does not depend on how QEMU's host threads happen
//! to be scheduled. Nothing is allocated after [`Threads::start`]; [`Threads::stop`]
//! ends and joins the workers (the skel's close: its code may be unloaded after it).

use core::arch::asm;
use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use keel_core::parallel::Parallel;

use crate::sys;

/// Most threads a device runs (the caller included): HVX contexts of current cDSPs are
/// 4 (v66 to v75) or 6; 8 leaves room.
pub const MAX_THREADS: usize = 8;

/// How threads are started, parked and ended.
pub trait Os: Sync + 'static {
    /// Starts worker `me` (1, 2, …) running `entry(me)`; false if it could not be started.
    fn spawn(me: usize, entry: extern "C" fn(usize) -> !) -> bool;
    /// Parks the caller while `word` holds `expected` (it may return early: callers re-check).
    fn wait(word: &AtomicU32, expected: u32);
    /// Wakes up to `n` threads parked on `word`.
    fn wake(word: &AtomicU32, n: i32);
    /// Ends the calling worker.
    fn exit() -> !;
    /// Waits until worker `me` has ended.
    fn join(me: usize);
    /// Before a worker runs its share of a run (the skel takes an HVX context).
    fn begin_share() {}
    /// After a worker has run its share.
    fn end_share() {}
}

/// What the caller and the workers share: one product's tasks at a time.
struct Shared {
    /// Bumped for every run (and once to stop); parked workers wait on it.
    generation: AtomicU32,
    /// Workers that have finished the current run; the caller waits on it.
    done: AtomicU32,
    /// Tasks in the current run.
    n_tasks: AtomicU32,
    /// Address of the caller's `&dyn Fn(usize)` for the current run (on its stack, alive
    /// until every worker has counted itself done).
    task: AtomicUsize,
    /// Workers started.
    workers: AtomicU32,
    /// Set (before a generation bump) to end the workers.
    stop: AtomicBool,
}

static SHARED: Shared = Shared {
    generation: AtomicU32::new(0),
    done: AtomicU32::new(0),
    n_tasks: AtomicU32::new(0),
    task: AtomicUsize::new(0),
    workers: AtomicU32::new(0),
    stop: AtomicBool::new(false),
};
static STARTED: AtomicBool = AtomicBool::new(false);
/// The generation when the current workers were started: a worker waits for the next one
/// (after a stop and a new start the count goes on from where it was).
static START_GENERATION: AtomicU32 = AtomicU32::new(0);

type Task<'a> = &'a (dyn Fn(usize) + Sync);

impl Shared {
    /// Runs thread `me`'s tasks of the current run: `me`, `me + threads`, … (a fixed
    /// share, as each HVX context of a board would take its own).
    fn run_share(&self, me: usize) {
        let n = self.n_tasks.load(Ordering::Relaxed) as usize;
        let threads = self.workers.load(Ordering::Relaxed) as usize + 1;
        // SAFETY: `task` holds the address of the caller's `Task`, stored before the
        // generation was bumped (Release, read with Acquire by every taker) and alive
        // until every worker has counted itself done.
        let task: Task<'_> = unsafe { *(self.task.load(Ordering::Relaxed) as *const Task<'_>) };
        (me..n).step_by(threads).for_each(task);
    }
}

/// Worker `me`'s life (1, 2, …; the caller is 0): park until a run begins, run its
/// share of the tasks, count itself done; end when told to stop.
extern "C" fn worker<O: Os>(me: usize) -> ! {
    let s = &SHARED;
    let mut seen = START_GENERATION.load(Ordering::Acquire);
    loop {
        let mut g = s.generation.load(Ordering::Acquire);
        while g == seen {
            O::wait(&s.generation, seen);
            g = s.generation.load(Ordering::Acquire);
        }
        seen = g;
        if s.stop.load(Ordering::Acquire) {
            O::exit();
        }
        O::begin_share();
        s.run_share(me);
        O::end_share();
        if s.done.fetch_add(1, Ordering::AcqRel) + 1 == s.workers.load(Ordering::Relaxed) {
            O::wake(&s.done, 1);
        }
    }
}

/// The device's threads: the caller plus `n - 1` parked workers. One run at a time: only
/// the thread that started them (the message loop) calls [`Parallel::run`].
pub struct Threads<O: Os> {
    n: usize,
    os: PhantomData<O>,
}

impl<O: Os> Threads<O> {
    /// Starts `n - 1` workers (`n` clamped to `1..=MAX_THREADS`), once until [`Self::stop`];
    /// the threads actually running (fewer if a thread could not be started).
    pub fn start(n: usize) -> Threads<O> {
        let n = n.clamp(1, MAX_THREADS);
        if STARTED.swap(true, Ordering::AcqRel) {
            return Threads { n: SHARED.workers.load(Ordering::Relaxed) as usize + 1, os: PhantomData };
        }
        SHARED.stop.store(false, Ordering::Relaxed);
        START_GENERATION.store(SHARED.generation.load(Ordering::Relaxed), Ordering::Release);
        let mut started = 0;
        for me in 1..n {
            if !O::spawn(me, worker::<O>) {
                break;
            }
            started += 1;
        }
        SHARED.workers.store(started, Ordering::Relaxed);
        Threads { n: started as usize + 1, os: PhantomData }
    }

    /// Ends the workers and waits for each to be gone; afterwards [`Self::start`] may run again.
    pub fn stop(self) {
        let s = &SHARED;
        let workers = s.workers.load(Ordering::Relaxed) as usize;
        s.stop.store(true, Ordering::Release);
        s.generation.fetch_add(1, Ordering::Release);
        O::wake(&s.generation, i32::MAX);
        for me in 1..=workers {
            O::join(me);
        }
        s.workers.store(0, Ordering::Relaxed);
        STARTED.store(false, Ordering::Release);
    }
}

impl<O: Os> Parallel for Threads<O> {
    fn n_threads(&self) -> usize {
        self.n
    }

    fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        let s = &SHARED;
        let workers = s.workers.load(Ordering::Relaxed);
        if self.n == 1 || workers == 0 || n_tasks <= 1 {
            (0..n_tasks).for_each(task);
            return;
        }
        // Publish the run (the task's address, its count, a fresh counter), then wake the
        // workers and run the caller's share.
        let t: Task<'_> = task;
        s.task.store(&t as *const Task<'_> as usize, Ordering::Relaxed);
        s.n_tasks.store(n_tasks as u32, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::Release);
        O::wake(&s.generation, i32::MAX);
        s.run_share(0);
        // Every worker counts itself done once its share has returned: then none reads
        // `t` any more.
        loop {
            let d = s.done.load(Ordering::Acquire);
            if d == workers {
                break;
            }
            O::wait(&s.done, d);
        }
    }
}

/// Linux threads under `qemu-hexagon` (the device ELF; the shell's QuRT stand-ins).
pub struct Linux;

/// Stack of a Linux worker: a Q8_0 product keeps 16 KiB of lane accumulators on it.
const STACK_BYTES: u32 = 256 << 10;
const SYS_FUTEX: i32 = 98;
const SYS_CLONE: i32 = 220;
const FUTEX_WAIT_PRIVATE: i32 = 128;
const FUTEX_WAKE_PRIVATE: i32 = 128 | 1;
/// `CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM`:
/// a thread of this process (the set QEMU's user mode accepts as a thread), plus
/// `CLONE_CHILD_CLEARTID`: the kernel zeroes the thread's id word and wakes it when the
/// thread ends (what [`Linux::join`] waits for).
const CLONE_THREAD_FLAGS: i32 = 0x100 | 0x200 | 0x400 | 0x800 | 0x1_0000 | 0x4_0000 | 0x20_0000;

/// Per worker: non-zero while the thread lives (cleared by the kernel at its end).
static LINUX_ALIVE: [AtomicU32; MAX_THREADS] = [const { AtomicU32::new(0) }; MAX_THREADS];

/// `futex(word, FUTEX_WAIT)` while `word` holds `expected`.
pub fn futex_wait(word: &AtomicU32, expected: u32) {
    // Returns at once if the word no longer holds `expected` (EAGAIN) or on a wake-up;
    // callers re-check the word either way.
    sys::syscall(SYS_FUTEX, [word.as_ptr() as i32, FUTEX_WAIT_PRIVATE, expected as i32, 0, 0, 0]);
}

/// `futex(word, FUTEX_WAKE, n)`.
pub fn futex_wake(word: &AtomicU32, n: i32) {
    sys::syscall(SYS_FUTEX, [word.as_ptr() as i32, FUTEX_WAKE_PRIVATE, n, 0, 0, 0]);
}

/// Waits until the thread whose `alive` word [`spawn`] was given has ended.
pub fn join_word(alive: &AtomicU32) {
    // FUTEX_WAIT without the private flag: the kernel's wake-up at a thread's end (the
    // clear-tid word) is a shared-futex wake, which a private waiter does not get.
    const FUTEX_WAIT: i32 = 0;
    loop {
        let v = alive.load(Ordering::Acquire);
        if v == 0 {
            return;
        }
        sys::syscall(SYS_FUTEX, [alive.as_ptr() as i32, FUTEX_WAIT, v as i32, 0, 0, 0]);
    }
}

/// Starts a thread running `entry(arg)` on the stack whose top is `stack_top`; `alive`
/// is set non-zero now and zeroed by the kernel when the thread ends. The thread id, or
/// `-errno`.
///
/// # Safety
/// `stack_top` is the 8-aligned end of memory that only the new thread uses, large
/// enough for `entry`; `entry` never returns; `alive` outlives the thread.
pub unsafe fn spawn(entry: extern "C" fn(usize) -> !, arg: usize, stack_top: usize, alive: &AtomicU32) -> i32 {
    alive.store(1, Ordering::Release);
    let ret: i32;
    // SAFETY: clone(flags, newsp, ptid, ctid, tls) with the thread flags and the
    // clear-tid word (Linux's generic argument order, which QEMU follows for Hexagon); the child returns 0 in r0 on the
    // new stack with the other registers copied, so it calls `entry(arg)` from r7/r8 and
    // never comes back; the parent (r0 = the child's id) jumps past that and has changed
    // only r0.
    unsafe {
        asm!(
            "trap0(#1)",
            "if (r0!=#0) jump:t 1f",
            "r0 = r8",
            "callr r7",
            "1:",
            inlateout("r0") CLONE_THREAD_FLAGS => ret,
            in("r1") stack_top as i32,
            in("r2") 0,
            in("r3") alive.as_ptr() as i32,
            in("r4") 0,
            in("r6") SYS_CLONE,
            in("r7") entry as usize as i32,
            in("r8") arg as i32,
        );
    }
    if ret <= 0 {
        alive.store(0, Ordering::Release);
    }
    ret
}

impl Os for Linux {
    fn spawn(me: usize, entry: extern "C" fn(usize) -> !) -> bool {
        let Some(base) = sys::mmap_anon(STACK_BYTES) else { return false };
        // SAFETY: the mapping is fresh, STACK_BYTES long, page-aligned (so its end is
        // 8-aligned) and given to this thread alone; `entry` never returns; the word is static.
        unsafe { spawn(entry, me, base + STACK_BYTES as usize, &LINUX_ALIVE[me]) > 0 }
    }
    fn wait(word: &AtomicU32, expected: u32) {
        futex_wait(word, expected)
    }
    fn wake(word: &AtomicU32, n: i32) {
        futex_wake(word, n)
    }
    fn exit() -> ! {
        // `exit` (not `exit_group`): this thread only. Its stack stays mapped (a few
        // hundred KiB per start; the device ELF starts its workers once).
        sys::exit_thread()
    }
    fn join(me: usize) {
        join_word(&LINUX_ALIVE[me])
    }
}

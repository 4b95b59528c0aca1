//! Hardware threads for keel-core's [`Parallel`]: the device ELF splits each matrix
//! product's row groups over several threads (`--threads N`), as the products of a cDSP
//! would be split over its HVX contexts. Under `qemu-hexagon` a thread is a Linux thread
//! (`clone` with the thread flags; QEMU runs each on a host thread of its own), parked
//! on a futex between products, so a parked thread executes no packets. On a board the
//! FastRPC skel would start QuRT threads instead (it runs one thread today).
//!
//! Started once, at start-up, and never stopped: workers live as long as the process;
//! nothing is allocated after [`Threads::start`] (each worker's stack is one anonymous
//! mapping made there).

use core::arch::asm;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use keel_core::parallel::Parallel;

use crate::sys;

/// Most threads a device runs (the caller included): HVX contexts of current cDSPs are
/// at most 4 (v68, v73); 8 leaves room.
pub const MAX_THREADS: usize = 8;
/// Stack of a worker: a Q8_0 product keeps 16 KiB of lane accumulators on it.
const STACK_BYTES: u32 = 256 << 10;

const SYS_FUTEX: i32 = 98;
const SYS_CLONE: i32 = 220;
const FUTEX_WAIT_PRIVATE: i32 = 128;
const FUTEX_WAKE_PRIVATE: i32 = 128 | 1;
/// `CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM`:
/// a thread of this process (the set QEMU's user mode accepts as a thread).
const CLONE_THREAD_FLAGS: i32 = 0x100 | 0x200 | 0x400 | 0x800 | 0x1_0000 | 0x4_0000;

/// What the caller and the workers share: one product's tasks at a time.
struct Shared {
    /// Bumped for every run; parked workers wait on it.
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
}

static SHARED: Shared = Shared {
    generation: AtomicU32::new(0),
    done: AtomicU32::new(0),
    n_tasks: AtomicU32::new(0),
    task: AtomicUsize::new(0),
    workers: AtomicU32::new(0),
};
static STARTED: AtomicBool = AtomicBool::new(false);

type Task<'a> = &'a (dyn Fn(usize) + Sync);

impl Shared {
    /// Runs thread `me`'s tasks of the current run: `me`, `me + threads`, … (a fixed
    /// share, as each HVX context of a board would take its own: the cost model's
    /// critical path does not depend on how QEMU's host threads happen to be scheduled).
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

fn futex_wait(word: &AtomicU32, expected: u32) {
    // Returns at once if the word no longer holds `expected` (EAGAIN) or on a wake-up;
    // callers re-check the word either way.
    sys::syscall(SYS_FUTEX, [word.as_ptr() as i32, FUTEX_WAIT_PRIVATE, expected as i32, 0, 0, 0]);
}

fn futex_wake(word: &AtomicU32, n: i32) {
    sys::syscall(SYS_FUTEX, [word.as_ptr() as i32, FUTEX_WAKE_PRIVATE, n, 0, 0, 0]);
}

/// Worker `me`'s life (1, 2, …; the caller is 0): park until a run begins, run its
/// share of the tasks, count itself done.
extern "C" fn worker(me: usize) -> ! {
    let s = &SHARED;
    let mut seen = 0;
    loop {
        let mut g = s.generation.load(Ordering::Acquire);
        while g == seen {
            futex_wait(&s.generation, seen);
            g = s.generation.load(Ordering::Acquire);
        }
        seen = g;
        s.run_share(me);
        if s.done.fetch_add(1, Ordering::AcqRel) + 1 == s.workers.load(Ordering::Relaxed) {
            futex_wake(&s.done, 1);
        }
    }
}

/// Starts a thread running `entry(arg)` on the stack whose top is `stack_top`; its
/// thread id, or `-errno`.
///
/// # Safety
/// `stack_top` is the 8-aligned end of a mapping of at least [`STACK_BYTES`] that only
/// the new thread uses, and `entry` never returns.
unsafe fn spawn(entry: extern "C" fn(usize) -> !, arg: usize, stack_top: usize) -> i32 {
    let ret: i32;
    // SAFETY: clone(flags, newsp, ptid, ctid, tls) with the thread flags only (no TID or
    // TLS words); the child returns 0 in r0 on the new stack with the other registers
    // copied, so it calls `entry(arg)` from r7/r8 and never comes back; the parent
    // (r0 = the child's id) jumps past that and has changed only r0.
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
            in("r3") 0,
            in("r4") 0,
            in("r6") SYS_CLONE,
            in("r7") entry as usize as i32,
            in("r8") arg as i32,
        );
    }
    ret
}

/// The device's threads: the caller plus `n - 1` parked workers. One run at a time: only
/// the thread that started them (the message loop) calls [`Parallel::run`].
pub struct Threads {
    n: usize,
}

impl Threads {
    /// Starts `n - 1` workers (`n` clamped to `1..=MAX_THREADS`), once per process; the
    /// threads actually running (fewer if a stack or a thread could not be made).
    pub fn start(n: usize) -> Threads {
        let n = n.clamp(1, MAX_THREADS);
        if STARTED.swap(true, Ordering::AcqRel) {
            return Threads { n: SHARED.workers.load(Ordering::Relaxed) as usize + 1 };
        }
        let mut started = 0;
        for me in 1..n {
            let Some(base) = sys::mmap_anon(STACK_BYTES) else { break };
            // SAFETY: the mapping is fresh, STACK_BYTES long, page-aligned (so its end is
            // 8-aligned) and given to this thread alone; `worker` never returns.
            if unsafe { spawn(worker, me, base + STACK_BYTES as usize) } <= 0 {
                break;
            }
            started += 1;
        }
        SHARED.workers.store(started, Ordering::Relaxed);
        Threads { n: started as usize + 1 }
    }
}

impl Parallel for Threads {
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
        futex_wake(&s.generation, i32::MAX);
        s.run_share(0);
        // Every worker counts itself done once its share has returned: then none reads
        // `t` any more.
        loop {
            let d = s.done.load(Ordering::Acquire);
            if d == workers {
                break;
            }
            futex_wait(&s.done, d);
        }
    }
}

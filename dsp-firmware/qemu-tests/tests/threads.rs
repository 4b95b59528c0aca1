//! The firmware's thread pool (`threads::Threads`) as Hexagon code: started, used and
//! stopped several times in one process (as the FastRPC skel does at each open and close
//! of a session in the same PD). Every task runs exactly once per run at every thread
//! count, and a pool started again after a stop does not run a finished run's tasks.

use keel_dsp_qemu_tests::{elf, put, run_elf, words, CMD_THREADS, MAGIC};

#[test]
fn the_pool_starts_runs_and_stops_again_and_again() {
    for (threads, tasks) in [(1u32, 7u32), (2, 64), (4, 3), (4, 200), (8, 256)] {
        let cycles = 3;
        let mut req = MAGIC.to_vec();
        put(&mut req, &[CMD_THREADS, threads, tasks, cycles]);
        let w: Vec<u32> = words(&run_elf(&elf(), &req)).collect();
        assert_eq!(w.len(), 1 + 2 * cycles as usize, "status, then (threads, wrong slots) per cycle: {w:?}");
        assert_eq!(w[0], 0, "status");
        for c in 0..cycles as usize {
            assert_eq!(w[1 + 2 * c], threads, "cycle {c}: threads started");
            assert_eq!(w[2 + 2 * c], 0, "cycle {c} with {threads} threads and {tasks} tasks: slots wrong");
        }
    }
}

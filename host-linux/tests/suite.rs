//! keel-host-linux's integration tests, one test binary: each file below is a module
//! (`cargo test -p keel-host-linux --test suite MODULE::`). One binary instead of one per
//! file: every test binary links the whole program again under the release profile's LTO,
//! and with a binary per file the links took most of CI's test build. Three files stay
//! binaries of their own (Cargo.toml): `pool_no_alloc` and `sim_no_alloc` count the
//! process's allocations, and `fastrpc_faults` sets the process's environment.

mod fastrpc;
mod sim;
mod support;

mod bad_input;
mod batches_cli;
mod bench;
mod chat_cli;
mod cli_flags;
mod cli_fuzz;
mod cli_help;
mod dsp_cost;
mod fake_device;
mod fastrpc_double;
mod hexagon_sim;
mod hexagon_sim_faults;
mod hostile;
mod perplexity;
mod placement_sim;
mod plan_cli;
mod probe_cli;
mod quantize;
mod rknpu_device;
mod rknpu_golden;
mod rknpu_ioctl;
mod rknpu_roundtrip;
mod rope_scaling;
mod rows16_cli;
mod serve;
mod speculative;

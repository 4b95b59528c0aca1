//! keel bare-metal on a Cortex-M4F (QEMU's MPS2 AN386): the model in flash
//! (`include_bytes!`), the arena a `static` sized at build time from keel-core's plan
//! (build.rs), the greedy continuation of config::PROMPT printed over semihosting, then its
//! token ids, the elapsed time (SysTick), the arena and the stack's high-water mark.
//! Logs go through `defmt` into a RAM buffer (src/log.rs).
#![no_std]
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]

mod clock;
mod config;
mod log;

use clock::Clock;
use config::{N_BATCH, N_CTX, N_OUTPUTS, N_PREDICT, N_THREADS, PROMPT};
use cortex_m_rt::entry;
use cortex_m_semihosting::{debug, hprint, hprintln};
use embedded_hal::delay::DelayNs;
use keel_core::engine::Engine;
use keel_core::gguf::Gguf;
use keel_core::parallel::Sequential;
use keel_core::quant::{Isa, Kernels};
use keel_core::sampler::SamplerConfig;
use keel_core::session::{Outputs, SessionConfig};
use keel_core::tokenizer::{Tokenizer, Utf8Stream};

// PLAN_BYTES, ARENA_BYTES and MODEL_BYTES, from keel-core's plan (build.rs).
include!(concat!(env!("OUT_DIR"), "/arena.rs"));
// build.rs refuses a smaller arena (stating both sizes); this holds it to that.
const _: () = assert!(ARENA_BYTES >= PLAN_BYTES, "the static arena is smaller than keel-core's plan");

/// Bytes aligned for keel-core: the arena's regions and the weights' blocks.
#[repr(C, align(64))]
struct Aligned<T: ?Sized>(T);

/// The model, in flash (the image's read-only data).
static MODEL: &Aligned<[u8]> = &Aligned(*include_bytes!(env!("KEEL_CORTEX_M_MODEL_PATH")));
/// Everything keel-core needs beyond the model: layer table, tokenizer index, KV cache,
/// activations, logits, sampler candidates (in .bss: zeroed by cortex-m-rt, no flash).
static mut ARENA: Aligned<[u8; ARENA_BYTES]> = Aligned([0; ARENA_BYTES]);
/// The tokenizer's scratch for PROMPT.
static mut WORK: [u8; Tokenizer::work_bytes(PROMPT.len())] = [0; Tokenizer::work_bytes(PROMPT.len())];

#[entry]
fn main() -> ! {
    let painted = clock::paint_stack();
    let cp = cortex_m::Peripherals::take().expect("the core peripherals, once");
    let mut clock = Clock::start(cp.SYST);
    let t0 = clock.now_us();
    clock.delay_ms(2);
    defmt::info!("keel on Cortex-M4F: SysTick delay_ms(2) took {=u64} us", clock.now_us() - t0);
    let ok = run(&mut clock);
    let stack = clock::stack_used(painted);
    hprintln!("stack: {} bytes used", stack);
    defmt::info!("stack high-water mark: {=usize} bytes", stack);
    hprintln!("defmt: {} bytes of log frames in RAM", log::bytes());
    debug::exit(if ok { debug::EXIT_SUCCESS } else { debug::EXIT_FAILURE });
    loop {
        cortex_m::asm::wfi();
    }
}

/// Runs the prompt and prints the continuation; false (after a message) on an error.
fn run(clock: &mut Clock) -> bool {
    // SAFETY: run is called once, from main, and nothing else touches these statics, so
    // these are their only borrows.
    let (arena, work): (&mut [u8], &mut [u8]) = unsafe { (&mut (*core::ptr::addr_of_mut!(ARENA)).0, &mut *core::ptr::addr_of_mut!(WORK)) };
    let gguf = match Gguf::parse(&MODEL.0) {
        Ok(g) => g,
        Err(e) => return fail(format_args!("the embedded model: {e}")),
    };
    let cfg = SessionConfig { n_ctx: N_CTX, n_batch: N_BATCH, n_outputs: N_OUTPUTS, n_threads: N_THREADS };
    let greedy = SamplerConfig { temp: 0.0, ..SamplerConfig::default() };
    let kernels = Kernels::new(Isa::default());
    let mut e = match Engine::new(&gguf, arena, cfg, kernels, greedy) {
        Ok(e) => e,
        Err(er) => return fail(format_args!("loading the model: {er}")),
    };
    defmt::info!("model {=usize} bytes in flash, arena {=usize} bytes (plan {=usize})", MODEL_BYTES, ARENA_BYTES, PLAN_BYTES);

    let mut ids = [0u32; N_CTX];
    let n = match e.tokenizer.tokenize(PROMPT, true, true, &mut ids, work) {
        Ok(n) => n,
        Err(er) => return fail(format_args!("tokenizing the prompt: {er}")),
    };
    defmt::info!("prompt: {=usize} tokens {}", n, &ids[..n]);
    let t0 = clock.now_us();
    let mut generated = [0u32; N_PREDICT];
    let mut n_gen = 0;
    let mut piece = [0u8; 256];
    let mut stream = Utf8Stream::new();
    let mut step = e.eval(&ids[..n], Outputs::Last, &Sequential).map(|_| ());
    let t_prompt = clock.now_us() - t0;
    while step.is_ok() && n_gen < N_PREDICT {
        let tok = e.sample();
        if e.tokenizer.is_eog(tok) {
            break;
        }
        generated[n_gen] = tok;
        n_gen += 1;
        defmt::debug!("token {=u32}", tok);
        match e.tokenizer.piece(tok, true, &mut piece) {
            Ok(len) => stream.push(&piece[..len], |s: &str| hprint!("{}", s)),
            Err(er) => return fail(format_args!("token {tok}: {er}")),
        }
        if e.session.n_past() >= N_CTX {
            break;
        }
        step = e.eval(&[tok], Outputs::Last, &Sequential).map(|_| ());
    }
    if let Err(er) = step {
        return fail(format_args!("evaluating: {er}"));
    }
    let t_total = clock.now_us() - t0;
    stream.finish(|s: &str| hprint!("{}", s));
    hprint!("\ntokens:");
    for t in &generated[..n_gen] {
        hprint!(" {}", t);
    }
    hprintln!("\nkernels: {}", kernels.name());
    hprintln!("arena: {} bytes (keel-core's plan: {})", ARENA_BYTES, PLAN_BYTES);
    hprintln!("model: {} bytes", MODEL_BYTES);
    hprintln!("time: prompt {} us, prompt + {} tokens {} us (SysTick, QEMU's clock)", t_prompt, n_gen, t_total);
    defmt::info!("{=usize} tokens in {=u64} us", n_gen, t_total);
    true
}

/// Prints `error: msg` on the host's stderr; false.
fn fail(msg: core::fmt::Arguments<'_>) -> bool {
    cortex_m_semihosting::heprintln!("error: {}", msg);
    defmt::error!("failed (message on semihosting stderr)");
    false
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    cortex_m_semihosting::heprintln!("keel-example-cortex-m: {}", info);
    debug::exit(debug::EXIT_FAILURE);
    loop {
        cortex_m::asm::wfi();
    }
}

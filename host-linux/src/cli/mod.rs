//! The `keel` command line: one module per subcommand.

pub mod args;
pub mod bench;
pub mod chat;
pub mod common;
pub mod eval;
pub mod info;
pub mod load;
pub mod logits_digest;
pub mod offload;
pub mod perplexity;
pub mod probe;
pub mod quantize;
pub mod roofline;
pub mod run;
pub mod speculate;
pub mod tokenize;

use anyhow::Result;
use args::Args;

/// Usage text.
pub const USAGE: &str = "\
keel: run GGUF language models on small devices

usage: keel <command> [options]

commands:
  run         generate text:  keel run -m MODEL -p PROMPT [-f FILE] [-n N] [-c N_CTX] [-t THREADS]
              [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty F] [--seed S]
              [--chat [--system TEXT]] [--reference] [--force-ctx] [--json]
              [--device LIST] [--offload-* flags]: see below
              speculative decoding (greedy output unchanged; at --temp > 0 the target's
              distribution): --draft-model M [--draft-max 8] [--device-draft LIST] drafts
              with a smaller model of the same vocabulary; --lookup N drafts up to N tokens
              from the context (prompt lookup); --draft-fixed turns the adaptive length off;
              statistics at the end (and in --json)
  chat        keel chat -m MODEL [--system TEXT] [-n N] [-c N_CTX] [sampling flags as run]
              (interactive; the conversation stays in the fixed context; /reset, /quit)
  tokenize    keel tokenize -m MODEL [--add-special] [--parse-special] [-f FILE | TEXT] [--json]
  eval        keel eval -m MODEL (-p PROMPT | -f FILE | --tokens-file FILE) [--top-k 10]
              [--dump-last FILE] [--reference] --json
  perplexity  keel perplexity -m MODEL -f TEXT [-c 512] [-t T] [--batch-invariant] [--json]
  info        keel info MODEL [--json]
  plan        keel plan -m MODEL [-c N_CTX] [-b N_BATCH] [-t T] [--json]
              --placement [--device LIST] [--offload-* flags]: for every layer, each op of its
              block and where it runs (why, when on the CPU)
  bench       keel bench -m MODEL [-p 512] [-n 128] [-r 3] [-t T] [--roofline] [--json]
              (pp and tg speed; checks its own output and refuses to report broken runs)
              keel bench -m MODEL --draft-sweep 1..N (--draft-model M | --lookup)
              (-p TEXT | -f FILE) [-n 128] [-r 3]: greedy t/s of plain decoding and of
              speculation per n_max and adaptive, medians of interleaved runs, as a table
  pull        keel pull NAME        (known: smollm2-135m, gemma3-270m)
  probe       keel probe --device hexagon-sim [--json]   identity, capabilities, memory, self-test
  quantize    keel quantize IN OUT TYPE [--allow-requantize] [-t THREADS] [--json]
              TYPE as llama-quantize names it: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1

device flags of run (matrix products placed on devices; the rest on the CPU):
  --device LIST        e.g. hexagon-sim,cpu (cpu is always last; hexagon-sim twice = two
                       device sessions, weights split when one budget is full)
  --offload-layers N   (-ngl) only layers 0..N on devices (default all)
  --offload-min-batch N  offload only forward passes of at least N tokens (default 1)
  --offload-output on|off  the output projection (lm head) on a device (default on)
  --offload-kinds LIST attn, ffn, output, all, or tensor kinds (attn_q, ffn_down, ...)
  --offload-types LIST file types allowed on devices (e.g. q8_0,q4_0,q4_k; default all)
  --offload-convert T  type for weights the device lacks (q8_0 default, q4_0, none)
  --device-mem MIB[,MIB..]  weight budget per device session
  after load and at exit run prints each device's memory (model, context, compute, free,
  as the device measured it); a run that places nothing on a device says so loudly

limits checked before any work (run, chat, eval, perplexity, bench):
  the arena a -c/-b (bench: -p/-n) plans must fit in physical memory, else refused;
  a -c beyond the model's training context (<arch>.context_length) is warned about
  unless --force-ctx; a -f prompt file may have at most 16 bytes per -c token + 64 KiB

MODEL is a path to a .gguf file or a known name, fetched on first use into
$KEEL_MODELS (default ~/.cache/keel/models).
";

/// Dispatches `argv[1..]`.
pub fn main(argv: Vec<String>) -> Result<()> {
    let mut it = argv.into_iter();
    let cmd = it.next().unwrap_or_default();
    let a = Args::new(it);
    match cmd.as_str() {
        "run" => run::main(a),
        "chat" => chat::main(a),
        "tokenize" => tokenize::main(a),
        "eval" => eval::main(a),
        "perplexity" => perplexity::main(a),
        "info" => info::info(a),
        "plan" => info::plan(a),
        "pull" => pull(a),
        "probe" => probe::main(a),
        "quantize" => quantize::main(a),
        "bench" => bench::main(a),
        "help" | "-h" | "--help" | "" => {
            print!("{USAGE}");
            Ok(())
        }
        "--version" | "-V" | "version" => {
            println!("keel {}", crate::VERSION);
            Ok(())
        }
        other => anyhow::bail!("unknown command '{other}'; see `keel help`"),
    }
}

fn pull(mut a: Args) -> Result<()> {
    let names = a.positionals();
    a.finish()?;
    if names.is_empty() {
        anyhow::bail!("keel pull NAME; known: {}", crate::pull::known_models_list());
    }
    for n in names {
        let path = crate::pull::pull_by_name(&n)?;
        println!("{}", path.display());
    }
    Ok(())
}

//! The `keel` command line: one module per subcommand, each with its own `clap` argument
//! struct (`RunArgs`, `ChatArgs`, …) and `main`; [`Command`] lists them.

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
pub mod rknpu;
pub mod roofline;
pub mod run;
pub mod speculate;
pub mod tokenize;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};

/// Shown after the top-level help.
const AFTER_HELP: &str = "\
Limits checked before any work (run, chat, eval, perplexity, bench): the arena a -c/-b (bench: -p/-n) plans must fit in physical memory, else refused; a -c beyond the model's training context (<arch>.context_length) is warned about unless --force-ctx; a -f prompt file may have at most 16 bytes per -c token + 64 KiB.

MODEL is a path to a .gguf file or a known name, fetched on first use into $KEEL_MODELS (default ~/.cache/keel/models). `keel help COMMAND` or `keel COMMAND --help` shows a command's flags and defaults; `keel completions bash|zsh|fish` prints a shell completion script. Errors exit with status 1.";

/// keel: run GGUF language models on small devices
#[derive(Parser, Debug)]
#[command(name = "keel", version = crate::VERSION, about = "keel: run GGUF language models on small devices", after_help = AFTER_HELP, arg_required_else_help = true, propagate_version = true)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
    /// Map the model file (shared with the page cache, paged in on demand) instead of
    /// reading it into private memory in transparent huge pages, as the commands that run
    /// a model do by default (faster decoding; the file's size resident from the start).
    /// `info`, `plan`, `tokenize` and `quantize` always map it, and so does every command
    /// when it is larger than the memory available
    #[arg(long, global = true)]
    pub mmap: bool,
}

/// Declares [`Command`] and [`dispatch`] from one list: a command is one line,
/// `Name(its Args struct) => its main,` with its one-line help as a doc comment (e.g.
/// `Serve(crate::serve::ServeArgs) => crate::serve::main,`).
macro_rules! commands {
    ($($(#[doc = $doc:literal])* $name:ident($args:ty) => $main:path,)*) => {
        /// Every subcommand, each with its module's argument struct.
        #[derive(Subcommand, Debug)]
        pub enum Command {
            $($(#[doc = $doc])* $name($args),)*
        }

        /// Runs one parsed command.
        pub fn dispatch(cmd: Command) -> Result<()> {
            match cmd {
                $(Command::$name(a) => $main(a),)*
            }
        }
    };
}

commands! {
    /// Generate text from a prompt, streaming it; then prompt/generation speed, arena and peak RSS
    Run(run::RunArgs) => run::main,
    /// Interactive conversation in the model's chat format (line editing, history; /help)
    Chat(chat::ChatArgs) => chat::main,
    /// Text to token ids
    Tokenize(tokenize::TokenizeArgs) => tokenize::main,
    /// Evaluate a prompt in one batch: per position the log-sum-exp and the top logits (JSON)
    Eval(eval::EvalArgs) => eval::main,
    /// Perplexity of a text by llama.cpp's method
    Perplexity(perplexity::PerplexityArgs) => perplexity::main,
    /// What a model file holds: metadata, tensors by type, hyper-parameters
    Info(info::InfoArgs) => info::info,
    /// The arena a model needs, region by region (or, with --placement, where each op runs)
    Plan(info::PlanArgs) => info::plan,
    /// Prompt processing (pp) and generation (tg) speed, checking its own output
    Bench(bench::BenchArgs) => bench::main,
    /// Fetch a known model by name
    Pull(PullArgs) => pull,
    /// Open a device and print its identity, capabilities, memory and self-test
    Probe(probe::ProbeArgs) => probe::main,
    /// An OpenAI-compatible HTTP server with a fixed number of slots, each with its own arena
    Serve(crate::serve::ServeArgs) => crate::serve::main,
    /// RK3588 NPU tools: keel's command stream for a rocket-capture fixture (gen), the W8A8 scheme's accuracy (kl)
    Rknpu(rknpu::RknpuArgs) => rknpu::main,
    /// Write a copy of a model quantized to one of llama.cpp's mixes
    Quantize(quantize::QuantizeArgs) => quantize::main,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions(CompletionsArgs) => completions,
    /// Print keel's version
    Version(VersionArgs) => version,
}

/// `keel version` (no arguments).
#[derive(clap::Args, Debug)]
pub struct VersionArgs {}

fn version(_: VersionArgs) -> Result<()> {
    println!("keel {}", crate::VERSION);
    Ok(())
}

fn completions(a: CompletionsArgs) -> Result<()> {
    clap_complete::generate(a.shell, &mut command(), "keel", &mut std::io::stdout());
    Ok(())
}

/// `keel pull NAME…`.
#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// Known model names (smollm2-135m: SmolLM2-135M-Instruct Q4_1, instruction-tuned; gemma3-270m: Gemma 3 270M Q4_K_M, the base model)
    #[arg(value_name = "NAME", required = true)]
    pub names: Vec<String>,
}

/// `keel completions SHELL`.
#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// The whole command tree (for help, completions and the tests that compare help with
/// the parser).
pub fn command() -> clap::Command {
    Cli::command()
}

/// Runs `keel` with `args` (after the program name): parses, then dispatches. Help and
/// the version print to stdout and succeed; a usage error is an error like any other
/// (the caller prints `error: …` and exits 1).
pub fn main_os(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<()> {
    let argv = args::llama_spellings(args::from_os(args)?);
    let cmd = command();
    args::refuse_repeats(&cmd, &argv)?;
    let cli = match Cli::try_parse_from(std::iter::once("keel".to_string()).chain(argv)) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) {
                let _ = crate::fault::stdout_ok(std::io::Write::write_all(&mut std::io::stdout(), e.render().to_string().as_bytes()));
                return Ok(());
            }
            let text = e.render().to_string();
            anyhow::bail!("{}", text.trim_end().strip_prefix("error: ").unwrap_or(text.trim_end()));
        }
    };
    // A bad KEEL_ISA is refused before any work (the kernels are chosen later).
    crate::isa::chosen().map_err(anyhow::Error::msg)?;
    load::set_mmap(cli.mmap);
    dispatch(cli.command)
}

fn pull(a: PullArgs) -> Result<()> {
    for n in &a.names {
        let path = crate::pull::pull_by_name(n)?;
        if let Some(m) = crate::pull::known_model(n) {
            eprintln!("keel pull: {n} is {}: {}", m.description, m.variant);
        }
        println!("{}", path.display());
    }
    Ok(())
}

/// Prints `v` as one line of JSON on stdout (NaN and infinities print as `null`: JSON has
/// no spelling for them).
pub fn print_json<T: serde::Serialize>(v: &T) {
    match serde_json::to_string(v) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("keel: could not write the JSON output: {e}"),
    }
}

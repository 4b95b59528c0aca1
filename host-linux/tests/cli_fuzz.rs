//! Property test of the whole command line (issue 22, acceptance 2): seeded random argument
//! vectors — subcommands and keel's real flags with values drawn from edge cases, garbage
//! and non-UTF-8 bytes — against `keel`, some of them running generated models (the
//! synthetic llama and copies with rewritten metadata, consistent or hostile) for a few
//! tokens. Every case must end with exit 0, or exit 1 (2 is allowed for usage errors)
//! with an `error:` line; never a signal (panic=abort, SIGSEGV, SIGBUS), a panic message,
//! or a file written outside the case's scratch directory.
//!
//! `KEEL_FUZZ_SEED` and `KEEL_FUZZ_CASES` (default 300) change the run; a failure prints
//! the seed, the case number and the argument vector to replay it.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use crate::support::{keel, synth, synth_with};

/// xorshift64*: a reproducible stream from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

const COMMANDS: &[&str] = &["run", "chat", "tokenize", "eval", "perplexity", "info", "plan", "bench", "probe", "quantize", "pull", "completions", "help", "version", "--version", "-h", ""];

/// Every flag keel's subcommands read (and a few near misses).
const FLAGS: &[&str] = &[
    "-m", "--model", "-p", "--prompt", "-f", "--file", "-n", "--n-predict", "-c", "--ctx-size", "-b", "--batch-size", "-t", "--threads", "--reference", "--force-ctx", "--temp",
    "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n", "-s", "--seed", "--chat", "--system", "--json", "--device", "-dev", "--offload-layers", "-ngl",
    "--n-gpu-layers", "--offload-min-batch", "--offload-output", "--offload-kinds", "--offload-types", "--offload-convert", "--offload-mode", "--device-mem", "--tensor-split", "-ts", "--device-in-flight", "--device-batch-work", "--add-special",
    "--parse-special", "--tokens-file", "--dump-last", "--batch-invariant", "--placement", "-r", "--repetitions", "--roofline", "--allow-requantize", "--n-prompt", "--n-gen",
    "--batches", "--mmap", "--ignore-eos", "-r", "--reverse-prompt", "--stop", "--rknpu-products", "-e", "--escape", "-h", "--help", "--version", "-", "--", "-x", "--nope", "---m",
];

/// Values for any flag: numbers at the edges, words the flags take, and garbage. No
/// path outside the fixture's folders: a value may land as `quantize`'s output.
const VALUES: &[&str] = &[
    "0", "1", "2", "3", "16", "64", "-1", "-0", "0.5", "1.5", "1e9", "NaN", "inf", "-inf", "4294967296", "18446744073709551615", "99999999999999999999999", "0x10", "",
    " ", "abc", "on", "off", "cpu", "all", "attn,ffn", "q8_0", "Q4_0", "Q5_1", "q4_k", "none", "1,2", "hello world", "<|im_start|>system", "\u{1F600}", "-n", "--json",
    "/nonexistent/x.gguf", "smollm2-135m", "nothing-known", "invariant", "llama-cpp", "bash", "\\n\\x4", "\\",
];

/// Small numbers for the model-running cases (so each runs a few tokens).
const SMALL: &[&str] = &["0", "1", "2", "3", "4", "8", "-1", "x", "NaN", "1e3", "64"];

struct Fixture {
    dir: PathBuf,
    /// Models: consistent ones first (they run), hostile ones after (they are refused).
    models: Vec<PathBuf>,
    text: PathBuf,
    tokens: PathBuf,
}

fn fixture() -> Fixture {
    use keel_core::gguf::Value;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-fuzz");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("models")).unwrap();
    let variants: &[(&str, &[(&str, Value<'static>)])] = &[
        ("ctx16.gguf", &[("llama.context_length", Value::U32(16))]),
        ("rope.gguf", &[("llama.rope.freq_base", Value::F32(500000.0)), ("tokenizer.ggml.add_bos_token", Value::Bool(true))]),
        ("eos0.gguf", &[("tokenizer.ggml.eos_token_id", Value::U32(0))]),
        ("bos-out.gguf", &[("tokenizer.ggml.bos_token_id", Value::U32(u32::MAX))]),
        ("split.gguf", &[("split.count", Value::U16(2))]),
        ("moe.gguf", &[("llama.expert_count", Value::U32(4))]),
        ("kv3.gguf", &[("llama.attention.head_count_kv", Value::U32(3))]),
        ("layers0.gguf", &[("llama.block_count", Value::U32(0))]),
        ("eps.gguf", &[("llama.attention.layer_norm_rms_epsilon", Value::F32(f32::NAN))]),
        ("ctxstr.gguf", &[("llama.context_length", Value::Str(b"long"))]),
    ];
    // A copy: a drawn `quantize IN OUT` may name any fixture model as its output.
    let mut models = vec![dir.join("synth.gguf")];
    std::fs::copy(synth(), &models[0]).unwrap();
    models.extend(variants.iter().map(|(name, set)| synth_with(&dir, name, set)));
    let text = dir.join("text.txt");
    std::fs::write(&text, "The quick brown fox jumps over the lazy dog. ".repeat(40)).unwrap();
    let tokens = dir.join("tokens.json");
    std::fs::write(&tokens, "[1, 2, 3, 49151]").unwrap();
    Fixture { dir, models, text, tokens }
}

/// A value for `flag`: a path where the flag takes one, else a drawn value (sometimes
/// non-UTF-8, sometimes random bytes).
fn value(rng: &mut Rng, fx: &Fixture, flag: &str) -> OsString {
    if rng.chance(8) {
        return OsString::from_vec(b"caf\xe9\xff".to_vec());
    }
    if rng.chance(5) {
        let n = rng.below(12);
        return OsString::from_vec((0..n).map(|_| (rng.next() % 255 + 1) as u8).collect());
    }
    match flag {
        "-m" | "--model" if rng.chance(10) => "/dev/null".into(),
        "-m" | "--model" => rng.pick(&fx.models).clone().into_os_string(),
        "-f" | "--file" if rng.chance(10) => "/dev/zero".into(),
        "-f" | "--file" if rng.chance(60) => fx.text.clone().into_os_string(),
        "--tokens-file" if rng.chance(60) => fx.tokens.clone().into_os_string(),
        "--dump-last" => OsString::from(format!("dump{}.bin", rng.below(3))),
        _ => OsString::from(*rng.pick(VALUES)),
    }
}

/// Random flags and values, in any order, any count.
fn garbage_case(rng: &mut Rng, fx: &Fixture) -> Vec<OsString> {
    let mut args = vec![OsString::from(*rng.pick(COMMANDS))];
    if rng.chance(3) {
        args[0] = OsString::from_vec(vec![0xff, b'r', b'u', b'n']);
    }
    for _ in 0..rng.below(9) {
        match rng.below(10) {
            0..=5 => {
                let f = *rng.pick(FLAGS);
                args.push(f.into());
                if rng.chance(85) {
                    args.push(value(rng, fx, f));
                }
            }
            6 => args.push(rng.pick(&fx.models).clone().into_os_string()),
            7 => args.push(format!("out{}.gguf", rng.below(3)).into()),
            _ => args.push(value(rng, fx, "")),
        }
    }
    args
}

/// A command that loads a model and runs a few tokens, with a few sampling and run flags
/// drawn from valid and invalid values.
fn model_case(rng: &mut Rng, fx: &Fixture) -> Vec<OsString> {
    let m = if rng.chance(70) { &fx.models[rng.below(4)] } else { rng.pick(&fx.models) };
    let mut args: Vec<OsString> = match rng.below(6) {
        0 => vec!["eval".into(), "--json".into(), "-p".into(), "hello there".into()],
        1 => vec!["tokenize".into(), "--json".into(), "hello <|im_end|> world".into()],
        2 => vec!["plan".into()],
        3 => vec!["run".into(), "--chat".into(), "-p".into(), "hi".into(), "-n".into(), (*rng.pick(SMALL)).into()],
        _ => vec!["run".into(), "-p".into(), "Once upon a time".into(), "-n".into(), (*rng.pick(SMALL)).into()],
    };
    args.push("-m".into());
    args.push(m.clone().into_os_string());
    let extra: &[(&str, &[&str])] = &[
        ("-c", &["1", "8", "16", "64", "128", "0", "8192"]),
        ("-b", &["1", "4", "512", "0"]),
        ("-t", &["1", "2", "0", "257"]),
        ("--temp", &["0", "0.8", "-1", "NaN", "1e30"]),
        ("--top-k", &["0", "1", "40", "-3"]),
        ("--top-p", &["1", "0.9", "0", "2"]),
        ("--min-p", &["0", "0.05", "1", "-0.1"]),
        ("--repeat-penalty", &["1", "1.1", "0", "inf"]),
        ("--repeat-last-n", &["0", "64", "100000"]),
        ("-s", &["1", "42", "-1"]),
        ("--batches", &["invariant", "llama-cpp", "both"]),
    ];
    for (flag, vals) in extra {
        if rng.chance(30) {
            args.push((*flag).into());
            args.push((*rng.pick(vals)).into());
        }
    }
    for flag in ["--reference", "--json", "--force-ctx"] {
        if rng.chance(20) {
            args.push(flag.into());
        }
    }
    args
}

fn show(args: &[OsString]) -> String {
    args.iter().map(|a| format!("{:?}", a.to_string_lossy())).collect::<Vec<_>>().join(" ")
}

#[test]
fn random_command_lines_end_with_a_message_never_a_crash() {
    let seed: u64 = std::env::var("KEEL_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x6b65_656c_2222);
    let cases: usize = std::env::var("KEEL_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    let fx = fixture();
    let mut rng = Rng(seed | 1);
    let (mut ok, mut refused) = (0, 0);
    for case in 0..cases {
        let args = if rng.chance(35) { model_case(&mut rng, &fx) } else { garbage_case(&mut rng, &fx) };
        let work = fx.dir.join("work");
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).unwrap();
        let replay = || format!("seed {seed}, case {case}: keel {}", show(&args));
        let mut child = keel()
            .args(&args)
            .current_dir(&work)
            // No network: names resolve in an empty models folder, and fetching fails at once.
            .env("KEEL_MODELS", fx.dir.join("models"))
            .env("KEEL_PYTHON", "/nonexistent/python3")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A hang is a failure too; the bound only catches one and never fails a slow case
        // (the slowest cases here take well under a second).
        let t0 = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed() > Duration::from_secs(300) {
                let _ = child.kill();
                panic!("hung for 300 s: {}", replay());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.signal().is_none(), "killed by signal {:?}: {}\n{err}", o.status.signal(), replay());
        assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "panic: {}\n{err}", replay());
        match o.status.code() {
            Some(0) => ok += 1,
            Some(1 | 2) => {
                assert!(err.lines().any(|l| l.starts_with("error: ") && l.len() > 10), "exit {:?} without an error line: {}\n{err}", o.status.code(), replay());
                refused += 1;
            }
            c => panic!("exit {c:?}: {}\n{err}", replay()),
        }
        // Only the named outputs (quantize's OUT, --dump-last) may appear, in the case's folder.
        for e in std::fs::read_dir(&work).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(name.starts_with("out") || name.starts_with("dump"), "left {name} behind: {}", replay());
        }
        assert_eq!(std::fs::read_dir(fx.dir.join("models")).unwrap().count(), 0, "wrote into the models folder: {}", replay());
    }
    eprintln!("cli fuzz: {cases} cases (seed {seed}): {ok} exit 0, {refused} refused with a message");
    assert!(ok > cases / 20 && refused > cases / 4, "the generator should give both outcomes: {ok} ok, {refused} refused");
    std::fs::remove_dir_all(&fx.dir).unwrap();
}

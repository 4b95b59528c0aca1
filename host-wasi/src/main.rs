//! `keel-wasi`: run the keel reference guest in wasmtime, and check the committed
//! reference digests.

use anyhow::{anyhow, bail, Context, Result};
use keel_host_wasi::digests::{self, DigestFile, Runner, Timing};
use keel_host_wasi::runtime::{hex, Guest, Limits, DEFAULT_FUEL};
use std::path::PathBuf;
use std::time::Instant;

const USAGE: &str = "\
usage:
  keel-wasi run -m MODEL -p PROMPT [-n N] [-c N_CTX] [--fuel F] [--max-memory-mib M] [--guest WASM] [--json]
      greedy generation with the reference kernels in wasmtime; --json prints
      {\"tokens\",\"generated\",\"logits_sha256\",\"row_sha256\",\"text\",\"stop\",\"fuel_used\"}
  keel-wasi check [--digests FILE] [--keel PATH [--wrap 'CMD ARGS'] [--keel-args 'ARGS'] | --guest WASM]
                  [--prompts K] [--model NAME]
      recompute the reference digests (default: in wasmtime; with --keel: with
      `PATH run ARGS --reference --json --temp 0 ...`, run through --wrap, e.g.
      'qemu-aarch64 -cpu max')
      and fail on any difference, naming the prompt and the first differing position
  keel-wasi digests [--write FILE]
      compute the digest file with the guest (stdout, or FILE)

--guest runs another build of the guest instead of the embedded one.
MODEL is a path, or a file name in $KEEL_MODELS (default ~/.cache/keel/models).";

/// Minimal flag parsing: `--flag VALUE` pairs and bare `--flag`s.
struct Args(Vec<String>);

impl Args {
    fn value(&mut self, names: &[&str]) -> Result<Option<String>> {
        let Some(i) = self.0.iter().position(|a| names.contains(&a.as_str())) else { return Ok(None) };
        if i + 1 >= self.0.len() {
            bail!("{} needs a value", self.0[i]);
        }
        let v = self.0.remove(i + 1);
        self.0.remove(i);
        Ok(Some(v))
    }

    fn parsed<T: std::str::FromStr>(&mut self, names: &[&str], default: T) -> Result<T> {
        match self.value(names)? {
            Some(v) => v.parse().map_err(|_| anyhow!("{}: cannot read {v:?}", names[0])),
            None => Ok(default),
        }
    }

    fn flag(&mut self, name: &str) -> bool {
        let had = self.0.iter().any(|a| a == name);
        self.0.retain(|a| a != name);
        had
    }

    fn finish(self) -> Result<()> {
        match self.0.first() {
            Some(a) => bail!("unexpected argument {a:?}\n{USAGE}"),
            None => Ok(()),
        }
    }
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("keel-wasi: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() || argv.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    let cmd = argv.remove(0);
    let mut a = Args(argv);
    match cmd.as_str() {
        "run" => run(a),
        "check" => check(a),
        "digests" => {
            let out = a.value(&["--write"])?;
            a.finish()?;
            let f = digests::generate(Guest::embedded()?, Limits::default())?;
            match out {
                Some(p) => std::fs::write(&p, f.to_json_text()).with_context(|| format!("writing {p}"))?,
                None => print!("{}", f.to_json_text()),
            }
            Ok(())
        }
        c => bail!("unknown command {c:?}\n{USAGE}"),
    }
}

/// The embedded guest, or the module given with `--guest FILE`.
fn guest(a: &mut Args) -> Result<Guest> {
    match a.value(&["--guest"])? {
        Some(p) => Guest::from_wasm(&std::fs::read(&p).with_context(|| format!("reading {p}"))?),
        None => Guest::embedded(),
    }
}

fn limits(a: &mut Args) -> Result<Limits> {
    let d = Limits::default();
    let fuel = a.parsed(&["--fuel"], DEFAULT_FUEL)?;
    let mib = a.parsed(&["--max-memory-mib"], d.max_memory >> 20)?;
    if mib == 0 || mib > 4096 {
        bail!("--max-memory-mib must be 1..=4096 (wasm32 addresses 4 GiB)");
    }
    Ok(Limits { max_memory: mib << 20, fuel })
}

fn run(mut a: Args) -> Result<()> {
    let model = a.value(&["-m", "--model"])?.ok_or_else(|| anyhow!("no model: give -m MODEL"))?;
    let prompt = a.value(&["-p", "--prompt"])?.ok_or_else(|| anyhow!("no prompt: give -p PROMPT"))?;
    let n = a.parsed(&["-n", "--n-predict"], digests::N_PREDICT)?;
    let n_ctx = a.parsed(&["-c", "--ctx-size"], digests::N_CTX)?;
    let lim = limits(&mut a)?;
    let guest = guest(&mut a)?;
    let as_json = a.flag("--json");
    a.finish()?;
    let mut path = PathBuf::from(&model);
    if !path.is_file() && !model.contains('/') {
        path = digests::models_dir().join(&model);
    }
    let mut g = guest.load(&path, n_ctx, lim)?;
    let t0 = Instant::now();
    let r = g.run(&prompt, n)?;
    let secs = t0.elapsed().as_secs_f64();
    if as_json {
        let v = serde_json::json!({
            "tokens": r.tokens,
            "generated": r.generated,
            "logits_sha256": hex(&r.logits_sha256),
            "row_sha256": r.row_sha256.iter().map(|d| hex(d)).collect::<Vec<_>>(),
            "text": r.text,
            "stop": r.stop.as_str(),
            "fuel_used": r.fuel_used,
        });
        println!("{v}");
    } else {
        println!("{}", r.text);
        eprintln!(
            "keel-wasi: prompt {} tokens, generated {} ({}) in {secs:.2} s | logits sha256 {} | fuel {}",
            r.tokens.len(),
            r.generated.len(),
            r.stop.as_str(),
            hex(&r.logits_sha256),
            r.fuel_used
        );
    }
    Ok(())
}

fn check(mut a: Args) -> Result<()> {
    let file = a.value(&["--digests"])?.map(PathBuf::from).unwrap_or_else(digests::default_digest_file);
    let keel = a.value(&["--keel"])?;
    let words = |v: Option<String>| -> Vec<String> { v.map(|w| w.split_whitespace().map(String::from).collect()).unwrap_or_default() };
    let wrap = words(a.value(&["--wrap"])?);
    let args = words(a.value(&["--keel-args"])?);
    let prompts = a.parsed(&["--prompts"], usize::MAX)?;
    let model = a.value(&["--model"])?;
    let lim = limits(&mut a)?;
    let wasm = if keel.is_none() { Some(guest(&mut a)?) } else { None };
    a.finish()?;
    let f = DigestFile::read(&file)?;
    let t0 = Instant::now();
    let (what, mut runner) = match keel {
        Some(k) => {
            let what = [wrap.join(" "), k.clone(), "run".into(), args.join(" "), "--reference".into()].iter().filter(|w| !w.is_empty()).cloned().collect::<Vec<_>>().join(" ");
            (what, Runner::Keel { keel: PathBuf::from(k), wrap, args })
        }
        None if !wrap.is_empty() || !args.is_empty() => bail!("--wrap and --keel-args need --keel"),
        None => ("wasmtime".to_string(), Runner::Wasm(wasm.expect("built above"), lim)),
    };
    let t = digests::check(&f, &mut runner, prompts, model.as_deref())?;
    report(&what, &t, t0.elapsed().as_secs_f64(), &file);
    Ok(())
}

fn report(what: &str, t: &Timing, total: f64, file: &std::path::Path) {
    let toks = (t.prompt_tokens + t.generated) as f64;
    println!(
        "reference digests match ({what}): {} runs of {}, {} prompt + {} generated tokens; eval {:.1} s ({:.1} tok/s), runs {:.1} s, total {:.1} s",
        t.runs,
        file.display(),
        t.prompt_tokens,
        t.generated,
        t.eval_secs,
        toks / t.eval_secs.max(1e-9),
        t.run_secs,
        total
    );
}

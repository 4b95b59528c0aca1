//! An attacker's and a careless user's command lines (issue 22): files keel writes,
//! arguments, pipes, signals, flags. Each case must end with exit 0, or exit 1 and an
//! `error:` line naming what is wrong; never a panic, an abort, or a file outside the
//! named output changed.
//!
//! `KEEL_TEST_BIN=/path/to/keel` runs the suite against another build (e.g. the code
//! before a fix, to see a test fail there).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn keel() -> Command {
    match std::env::var_os("KEEL_TEST_BIN") {
        Some(b) => Command::new(b),
        None => Command::new(env!("CARGO_BIN_EXE_keel")),
    }
}

fn synth() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/synth/synth-llama-q8_0.gguf")
}

/// A fresh, empty directory for one test.
fn scratch(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-{tag}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// Exit 1, an `error:` line containing every one of `needles`, no panic.
fn fails_with(out: &Output, needles: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "panicked: {err}");
    assert_eq!(out.status.code(), Some(1), "expected exit 1, got {:?}; stderr: {err}", out.status);
    assert!(err.contains("error:"), "no error line: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr should mention {n:?}: {err}");
    }
    err
}

fn succeeds(out: &Output) {
    assert!(out.status.success(), "keel failed: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
}

// ---- item 1: the one file writer ----

/// Plants symlinks to `victim` at every name the old writers used for a temporary file
/// beside `dest` (`.NAME.keel-tmp-PID`, `.NAME.partial-PID`) for the next few thousand
/// process ids.
fn plant_symlinks(dest: &Path, victim: &Path) {
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(1);
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(32768);
    let name = dest.file_name().unwrap().to_string_lossy().into_owned();
    let dir = dest.parent().unwrap();
    for i in 1..=3000 {
        let pid = (last + i) % max;
        for tmp in [format!(".{name}.keel-tmp-{pid}"), format!(".{name}.partial-{pid}")] {
            std::os::unix::fs::symlink(victim, dir.join(tmp)).unwrap();
        }
    }
}

#[test]
fn a_planted_symlink_cannot_redirect_a_write() {
    let dir = scratch("symlink");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    let planted = dir.join("planted");
    std::fs::create_dir(&planted).unwrap();

    let dump = planted.join("dump.bin");
    plant_symlinks(&dump, &victim);
    succeeds(&keel().args(["eval", "-c", "64", "-p", "hi", "--json", "-m"]).arg(synth()).arg("--dump-last").arg(&dump).output().unwrap());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "eval --dump-last wrote through a planted symlink");
    assert_eq!(std::fs::metadata(&dump).unwrap().len(), 49152 * 4, "the dump itself is whole");

    let out = planted.join("out.gguf");
    plant_symlinks(&out, &victim);
    succeeds(&keel().arg("quantize").arg(synth()).arg(&out).args(["Q4_0", "--allow-requantize", "-t", "1"]).output().unwrap());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "quantize wrote through a planted symlink");
    assert!(std::fs::symlink_metadata(&out).unwrap().file_type().is_file());
    // Nothing but the outputs and the planted links remain.
    let files: Vec<String> = entries(&planted).into_iter().filter(|n| !std::fs::symlink_metadata(planted.join(n)).unwrap().file_type().is_symlink()).collect();
    assert_eq!(files, ["dump.bin", "out.gguf"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn quantize_onto_its_own_input_is_refused() {
    let dir = scratch("own-input");
    let input = dir.join("in.gguf");
    std::fs::copy(synth(), &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    std::os::unix::fs::symlink(&input, dir.join("link.gguf")).unwrap();
    std::fs::hard_link(&input, dir.join("hard.gguf")).unwrap();
    let same = [input.clone(), dir.join("link.gguf"), dir.join("hard.gguf"), dir.join(".").join("in.gguf")];
    for out in &same {
        let o = keel().arg("quantize").arg(&input).arg(out).args(["Q4_0", "--allow-requantize", "-t", "1"]).output().unwrap();
        fails_with(&o, &["is the input file", "choose another output path"]);
        assert_eq!(std::fs::read(&input).unwrap(), before, "the input changed ({})", out.display());
        assert!(std::fs::symlink_metadata(dir.join("link.gguf")).unwrap().file_type().is_symlink());
    }
    assert_eq!(entries(&dir), ["hard.gguf", "in.gguf", "link.gguf"]);
    // eval --dump-last onto the model file it reads, too.
    let o = keel().args(["eval", "-c", "64", "-p", "hi", "--json", "-m"]).arg(&input).arg("--dump-last").arg(dir.join("link.gguf")).output().unwrap();
    fails_with(&o, &["--dump-last", "is the input file"]);
    assert_eq!(std::fs::read(&input).unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// SIGTERM (and SIGINT, SIGHUP) while `quantize` writes: the temporary file is removed
/// and keel dies of that signal.
#[test]
fn a_killed_quantize_leaves_no_partial_file() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let dir = scratch(&format!("killed-{sig}"));
        let out = dir.join("out.gguf");
        // The write takes tens of milliseconds; poll for the temporary file and signal
        // keel as soon as it exists. If keel wins the race and finishes, try again.
        let mut caught = false;
        for _ in 0..20 {
            let mut child = keel().arg("quantize").arg(synth()).arg(&out).args(["Q4_0", "--allow-requantize", "-t", "1"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
            let t0 = Instant::now();
            let mut sent = false;
            while t0.elapsed() < Duration::from_secs(20) {
                if !entries(&dir).is_empty() && !out.exists() {
                    // SAFETY: signals our own child.
                    unsafe { libc::kill(child.id() as i32, sig) };
                    sent = true;
                    break;
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
            }
            let status = child.wait().unwrap();
            if sent && !status.success() {
                assert!(status.signal() == Some(sig) || status.code() == Some(128 + sig), "signal {sig}: {status:?}");
                assert_eq!(entries(&dir), Vec::<String>::new(), "signal {sig} left files behind");
                caught = true;
                break;
            }
            let _ = std::fs::remove_file(&out);
        }
        assert!(caught, "signal {sig}: never caught quantize mid-write");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

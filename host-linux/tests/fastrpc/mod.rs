//! Shared pieces of the `hexagon` (FastRPC) device tests: the test double of
//! libcdsprpc (`keel-cdsprpc-double`, built as `target/release/libcdsprpc.so`), whose DSP
//! is keel's skel (`libkeel_skel.so`) loaded by `keel-dsp-shell` under qemu-hexagon (both
//! built by `dsp-firmware/ci.sh`); and the checker of the double's call log. Skips loudly
//! when a piece is missing (`KEEL_REQUIRE_DSP=1`: fails).

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The double's path, or `None` (after a loud SKIPPED line) when it or the emulated DSP is missing.
pub fn double(test: &str) -> Option<PathBuf> {
    let cfg = super::sim::config(test)?;
    // Tests run from target/release/deps; the cdylib is in target/release.
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().and_then(Path::parent).map(|d| d.join("libcdsprpc.so")).unwrap();
    let fw = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dsp-firmware/target");
    let skel = fw.join(format!("skel-{}/hexagon-unknown-none-elf/release/libkeel_skel.so", cfg.cpu));
    let shell = cfg.elf.with_file_name("keel-dsp-shell");
    let why = if !lib.is_file() {
        format!("{} not built: `cargo build --release -p keel-cdsprpc-double` (tests/run.sh does)", lib.display())
    } else if std::env::var_os("KEEL_DSP_SKEL").is_none() && !skel.is_file() {
        format!("the skel {} is not built: `bash dsp-firmware/ci.sh`", skel.display())
    } else if std::env::var_os("KEEL_DSP_SHELL").is_none() && !shell.is_file() {
        format!("{} is not built: `bash dsp-firmware/ci.sh`", shell.display())
    } else {
        return Some(lib);
    };
    if std::env::var("KEEL_REQUIRE_DSP").is_ok_and(|v| v == "1") {
        panic!("KEEL_REQUIRE_DSP=1 but the libcdsprpc test double is missing: {why}");
    }
    eprintln!("\n*** SKIPPED {test}: {why} (set KEEL_REQUIRE_DSP=1 to make this a failure) ***\n");
    None
}

/// What a call log showed.
#[derive(Debug, Default)]
pub struct LogSummary {
    /// Batches written to the queue.
    pub batches: usize,
    /// Buffers allocated (and freed).
    pub allocs: usize,
    /// Mappings made (and unmapped).
    pub maps: usize,
    /// The open's address-budget probe: the most bytes it had mapped at once.
    pub probe_bytes: u64,
    /// Its fastrpc_mmap calls, and how many of them the "DSP" refused (AEE_EFAILED).
    pub probe_calls: usize,
    /// See `probe_calls`.
    pub probe_refused: usize,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key))
}

/// Checks that the calls of one `hexagon` session came in a valid order, that every call
/// succeeded but the address-budget probe's refused mappings (`AEE_EFAILED`, before any
/// batch), and that every mapping was unmapped and every buffer freed, in that order. The
/// probe is the first allocations, up to the point where none is live again after one was
/// mapped: that point must come before the first batch (the probe leaves nothing behind).
pub fn check_log(text: &str) -> LogSummary {
    let lines: Vec<&str> = text.lines().collect();
    let pos = |prefix: &str| lines.iter().position(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no `{prefix}` call in the log:\n{text}"));
    let last = |prefix: &str| lines.iter().rposition(|l| l.starts_with(prefix)).unwrap();
    let first_batch = lines.iter().position(|l| l.starts_with("dspqueue_write") && l.contains(" batch ")).unwrap_or(lines.len());
    for (i, l) in lines.iter().enumerate() {
        if let Some(rc) = l.rsplit_once("-> ").map(|(_, rc)| rc) {
            let refused_probe = l.starts_with("fastrpc_mmap") && rc == "1" && i < first_batch;
            assert!(rc == "0" || rc.starts_with("fd=") || refused_probe, "a call failed: {l}\n{text}");
            assert!(rc != "fd=-1", "an allocation failed: {l}");
        }
    }
    let unsigned = pos("remote_session_control req=2");
    let open = pos("remote_handle64_open");
    assert!(lines[open].contains("_dom=cdsp") && lines[open].contains("_handle_invoke"), "{}", lines[open]);
    let latency = pos("remote_handle64_control");
    let create = pos("dspqueue_create");
    let export = pos("dspqueue_export");
    let start = pos("remote_handle64_invoke");
    assert!(lines[start].contains("method=2"));
    let first_write = pos("dspqueue_write");
    let close_q = pos("dspqueue_close");
    let close_h = pos("remote_handle64_close");
    let order = [unsigned, open, latency, create, export, start, first_write, close_q, close_h];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "calls out of order {order:?}:\n{text}");
    assert!(last("dspqueue_write") < close_q && last("dspqueue_read") < close_q, "queue used after close");
    assert_eq!(lines.iter().filter(|l| l.starts_with("rpcmem_init")).count(), lines.iter().filter(|l| l.starts_with("rpcmem_deinit")).count());
    // fd -> mapped: every allocation is freed, every mapping unmapped before its free.
    let mut live: HashMap<String, (bool, u64)> = HashMap::new();
    let mut s = LogSummary::default();
    // 0: before the probe, 1: probing, 2: after it.
    let (mut phase, mut mapped) = (0, 0u64);
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("rpcmem_alloc") {
            let fd = field(l, "fd=").unwrap().to_string();
            assert!(i > open, "allocation before the session: {l}");
            let size: u64 = field(l, "size=").unwrap().parse().unwrap();
            assert!(live.insert(fd, (false, size)).is_none(), "fd reused while live: {l}");
            s.allocs += 1;
            if phase == 0 {
                phase = 1;
            }
        } else if l.starts_with("fastrpc_mmap") {
            let fd = field(l, "fd=").unwrap();
            assert!(l.contains("flags=2"), "not mapped with FASTRPC_MAP_FD: {l}");
            let ok = l.ends_with("-> 0");
            let Some(&(false, size)) = live.get(fd) else { panic!("mapping of a buffer not allocated, or mapped twice: {l}") };
            if phase == 1 {
                s.probe_calls += 1;
                s.probe_refused += usize::from(!ok);
                if ok {
                    mapped += size;
                    s.probe_bytes = s.probe_bytes.max(mapped);
                }
            } else {
                assert!(ok, "a mapping failed outside the budget probe: {l}");
            }
            if ok {
                live.insert(fd.to_string(), (true, size));
                s.maps += 1;
            }
        } else if l.starts_with("fastrpc_munmap") {
            let fd = field(l, "fd=").unwrap();
            let Some(&(true, size)) = live.get(fd) else { panic!("unmapping what is not mapped: {l}") };
            live.insert(fd.to_string(), (false, size));
            if phase == 1 {
                mapped -= size;
            }
        } else if l.starts_with("rpcmem_free") {
            assert!(!l.contains("STILL-MAPPED") && !l.contains("UNKNOWN"), "{l}");
            let fd = field(l, "fd=").unwrap();
            assert!(matches!(live.remove(fd), Some((false, _))), "free of a buffer not allocated or still mapped: {l}");
            assert!(i < close_h, "buffer freed after the session closed: {l}");
            // A refused mapping's buffer is freed at once; the probe ends when what it mapped is all released.
            if phase == 1 && live.is_empty() && s.probe_bytes > 0 {
                phase = 2;
                assert_eq!(mapped, 0);
                assert!(i < first_batch, "the budget probe's buffers outlive the first batch: {l}");
            }
        } else if l.starts_with("dspqueue_write") && l.contains(" batch ") {
            s.batches += 1;
        }
    }
    assert!(live.is_empty(), "leaked at exit (fd -> still mapped): {live:?}\n{text}");
    s
}

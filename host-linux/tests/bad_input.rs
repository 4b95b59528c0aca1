//! Broken and hostile GGUF files given to `keel info` and `keel run`: each must end with
//! exit code 1 and an `error:` line on stderr, never a panic, a signal, or a hang.

use std::path::{Path, PathBuf};
use std::process::Command;

fn keel() -> &'static str {
    env!("CARGO_BIN_EXE_keel")
}

fn synth() -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/synth/synth-llama-q8_0.gguf");
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Byte offset of the first tensor info record (after all metadata), found by walking
/// the header the way the format defines it.
fn tensor_infos_offset(b: &[u8]) -> usize {
    let n_kv = u64_at(b, 16) as usize;
    let mut p = 24;
    let skip_val = |p: &mut usize, t: u32| {
        let fixed = |t: u32| match t {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4 | 5 | 6 => 4,
            10 | 11 | 12 => 8,
            _ => 0,
        };
        match t {
            8 => *p += 8 + u64_at(b, *p) as usize,
            9 => {
                let et = u32::from_le_bytes(b[*p..*p + 4].try_into().unwrap());
                let n = u64_at(b, *p + 4) as usize;
                *p += 12;
                if et == 8 {
                    for _ in 0..n {
                        *p += 8 + u64_at(b, *p) as usize;
                    }
                } else {
                    *p += n * fixed(et);
                }
            }
            t => *p += fixed(t),
        }
    };
    for _ in 0..n_kv {
        p += 8 + u64_at(b, p) as usize;
        let t = u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
        p += 4;
        skip_val(&mut p, t);
    }
    p
}

/// The corpus: (name, bytes).
fn corpus() -> Vec<(String, Vec<u8>)> {
    let good = synth();
    let ti = tensor_infos_offset(&good);
    let mut out = Vec::new();
    // Truncated at many points: inside the header, the metadata, the tensor infos, the data.
    for cut in [0, 3, 4, 7, 8, 15, 16, 23, 24, 40, 1000, 100_000, ti - 1, ti, ti + 10, ti + 200, good.len() / 2, good.len() - 1] {
        out.push((format!("truncated-at-{cut}"), good[..cut].to_vec()));
    }
    let mut m = good.clone();
    m[0..4].copy_from_slice(b"GGML");
    out.push(("bad-magic".into(), m));
    let mut m = good.clone();
    m[4..8].copy_from_slice(&99u32.to_le_bytes());
    out.push(("bad-version".into(), m));
    let mut m = good.clone();
    m[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    out.push(("absurd-tensor-count".into(), m));
    let mut m = good.clone();
    m[16..24].copy_from_slice(&(1u64 << 62).to_le_bytes());
    out.push(("absurd-key-count".into(), m));
    // First key's name length absurd.
    let mut m = good.clone();
    m[24..32].copy_from_slice(&(1u64 << 60).to_le_bytes());
    out.push(("absurd-string-length".into(), m));
    // First key's value type unknown.
    let mut m = good.clone();
    let klen = u64_at(&good, 24) as usize;
    m[32 + klen..36 + klen].copy_from_slice(&77u32.to_le_bytes());
    out.push(("unknown-value-type".into(), m));
    // First tensor: absurd dims, unknown type, offset past the end, misaligned offset.
    let name_len = u64_at(&good, ti) as usize;
    let dims_at = ti + 8 + name_len + 4;
    let n_dims = u32::from_le_bytes(good[ti + 8 + name_len..dims_at].try_into().unwrap()) as usize;
    let type_at = dims_at + 8 * n_dims;
    let off_at = type_at + 4;
    let mut m = good.clone();
    m[dims_at..dims_at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    out.push(("absurd-dim".into(), m));
    let mut m = good.clone();
    m[ti + 8 + name_len..dims_at].copy_from_slice(&9u32.to_le_bytes());
    out.push(("too-many-dims".into(), m));
    let mut m = good.clone();
    m[type_at..type_at + 4].copy_from_slice(&5u32.to_le_bytes());
    out.push(("unknown-tensor-type".into(), m));
    let mut m = good.clone();
    m[off_at..off_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    out.push(("offset-past-end".into(), m));
    let mut m = good.clone();
    m[off_at..off_at + 8].copy_from_slice(&(u64_at(&good, off_at) + 3).to_le_bytes());
    out.push(("misaligned-offset".into(), m));
    // A key holding the wrong type: llama.block_count as a string.
    let mut m = good.clone();
    if let Some(pos) = find(&good, b"llama.block_count") {
        let t = pos + b"llama.block_count".len();
        m[t..t + 4].copy_from_slice(&8u32.to_le_bytes()); // now claims a string: its "length" is the old u32 + following bytes
        out.push(("wrong-key-type".into(), m));
    }
    // A required key missing: rename it.
    let mut m = good.clone();
    if let Some(pos) = find(&good, b"llama.embedding_length") {
        m[pos] = b'X';
        out.push(("missing-required-key".into(), m));
    }
    // A required tensor missing: rename it.
    let mut m = good.clone();
    if let Some(pos) = find(&good, b"output_norm.weight") {
        m[pos] = b'X';
        out.push(("missing-required-tensor".into(), m));
    }
    out.push(("empty".into(), Vec::new()));
    out.push(("random-bytes".into(), (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()));
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn check(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: expected exit code 1, got {:?}; stderr: {stderr}", out.status);
    assert!(stderr.contains("error:"), "{what}: no error line; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: panicked: {stderr}");
}

#[test]
fn broken_files_are_clear_errors() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bad-gguf");
    std::fs::create_dir_all(&dir).unwrap();
    let cases = corpus();
    assert!(cases.len() >= 30, "corpus shrank to {}", cases.len());
    for (name, bytes) in cases {
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, &bytes).unwrap();
        check(Command::new(keel()).args(["info"]).arg(&path), &format!("info {name}"));
        check(Command::new(keel()).args(["run", "-n", "2", "-c", "64", "-p", "hi", "-m"]).arg(&path), &format!("run {name}"));
    }
}

#[test]
fn errors_name_what_is_wrong() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bad-gguf-msg");
    std::fs::create_dir_all(&dir).unwrap();
    let cases = corpus();
    let expect = [("bad-magic", "not a GGUF file"), ("unknown-tensor-type", "unknown tensor type id 5"), ("offset-past-end", "token_embd.weight"), ("missing-required-key", "llama.embedding_length"), ("missing-required-tensor", "output_norm.weight"), ("truncated-at-40", "truncated")];
    for (name, needle) in expect {
        let bytes = &cases.iter().find(|(n, _)| n == name).unwrap().1;
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, bytes).unwrap();
        let out = Command::new(keel()).args(["run", "-n", "1", "-p", "x", "-m"]).arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{name}: stderr should mention {needle:?}: {stderr}");
        assert!(stderr.contains(&path.display().to_string()), "{name}: stderr should name the file: {stderr}");
    }
}

#[test]
fn prompt_longer_than_context_says_both_lengths() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/synth/synth-llama-q8_0.gguf");
    let prompt = "word ".repeat(100);
    let out = Command::new(keel()).args(["run", "-n", "1", "-c", "16", "-p", &prompt, "-m"]).arg(&p).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the prompt has 101 tokens") && stderr.contains("context holds 16"), "should say both lengths: {stderr}");
}

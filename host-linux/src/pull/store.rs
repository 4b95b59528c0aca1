//! Verified, atomic storing of a fetched model file.
//!
//! Bytes stream into a temporary file beside the destination (a [`TempFile`]: a fresh,
//! randomly named file opened without following symlinks) while being hashed; the file is kept only if its size and sha256 match, and then it
//! is fsynced and renamed into place (and the directory fsynced), so a reader sees
//! either no file or the whole verified one. On any failure, a panic or a fatal signal,
//! the temporary file is deleted.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::PullError;
use crate::fsutil::TempFile;
use crate::progress::Progress;

const CHUNK: usize = 1 << 20;

/// The file being written: a temp file, the running hash, and the progress bar.
pub(crate) struct Sink {
    file: TempFile,
    hasher: Sha256,
    written: u64,
    progress: Progress,
    tmp: PathBuf,
    buf: Vec<u8>,
}

impl Sink {
    /// Lets other output through below the progress bar (see [`Progress::interrupt`]).
    pub(crate) fn interrupt_progress(&mut self) {
        self.progress.interrupt();
    }

    /// Appends everything `r` yields; returns the number of bytes copied.
    pub(crate) fn copy_from(&mut self, r: &mut dyn Read) -> Result<u64, PullError> {
        let mut n = 0u64;
        loop {
            let got = match r.read(&mut self.buf) {
                Ok(0) => return Ok(n),
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(PullError::io("read the extracted data for", &self.tmp, e)),
            };
            let chunk = &self.buf[..got];
            self.file
                .write_all(chunk)
                .map_err(|e| PullError::io("write", &self.tmp, e))?;
            self.hasher.update(chunk);
            self.written += got as u64;
            n += got as u64;
            self.progress.set(self.written);
        }
    }
}

/// What the stored file must be.
pub(crate) struct Expected<'a> {
    pub(crate) file_name: &'a str,
    pub(crate) size: u64,
    pub(crate) sha256: &'a str,
}

/// Creates a [`TempFile`] for `dir/FILE`, lets `fill` write the content into it, checks size
/// and sha256, and renames it to `dir/FILE`. Returns the final path.
pub(crate) fn store_verified(
    dir: &Path,
    want: &Expected<'_>,
    fill: impl FnOnce(&mut Sink) -> Result<(), PullError>,
) -> Result<PathBuf, PullError> {
    let dest = dir.join(want.file_name);
    let file = TempFile::create(&dest)
        .map_err(|e| PullError::io("create a temporary file for", &dest, e))?;
    let tmp = file.tmp_path().to_path_buf();
    let mut sink = Sink {
        file,
        hasher: Sha256::new(),
        written: 0,
        progress: Progress::bytes(&format!("keel: extracting {}", want.file_name), want.size),
        tmp: tmp.clone(),
        buf: vec![0; CHUNK],
    };
    fill(&mut sink)?;
    sink.progress.finish();
    if sink.written != want.size {
        return Err(PullError::Size {
            file: dest,
            expected: want.size,
            got: sink.written,
        });
    }
    let got = hex(&sink.hasher.finalize());
    if !got.eq_ignore_ascii_case(want.sha256) {
        return Err(PullError::Checksum {
            file: dest,
            expected: want.sha256.to_string(),
            got,
        });
    }
    sink.file
        .commit()
        .map_err(|e| PullError::io("fsync and rename into place", &tmp, e))?;
    write_stamp(&dest, want.sha256);
    Ok(dest)
}

/// The stamp beside a cached model saying its sha256 was checked: `dir/.FILE.keel-sha256`,
/// holding the hash, the size and the modification time it was checked at.
fn stamp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.keel-sha256"))
}

/// What the stamp of `path` says when its hash is `sha256` (`None` if it cannot be stat'ed).
fn stamp_line(path: &Path, sha256: &str) -> Option<String> {
    let m = fs::metadata(path).ok()?;
    let mtime = m.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    Some(format!("{sha256} {} {mtime}\n", m.len()))
}

/// True if `path` was checked to have `sha256` and has not changed size or mtime since.
pub(crate) fn stamp_matches(path: &Path, sha256: &str) -> bool {
    match (stamp_line(path, sha256), fs::read_to_string(stamp_path(path))) {
        (Some(want), Ok(got)) => want == got,
        _ => false,
    }
}

/// Records that `path` was just checked to have `sha256`. Best effort: without a stamp
/// the next use hashes the file again.
pub(crate) fn write_stamp(path: &Path, sha256: &str) {
    if let Some(line) = stamp_line(path, sha256) {
        let _ = crate::fsutil::write_atomic(&stamp_path(path), line.as_bytes());
    }
}

/// The sha256 of a file as lowercase hex, with a progress bar labelled `label`.
pub fn sha256_file(path: &Path, label: &str) -> Result<String, PullError> {
    let mut f = File::open(path).map_err(|e| PullError::io("open", path, e))?;
    let len = f
        .metadata()
        .map_err(|e| PullError::io("stat", path, e))?
        .len();
    let mut progress = Progress::bytes(label, len);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                done += n as u64;
                progress.set(done);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(PullError::io("read", path, e)),
        }
    }
    progress.finish();
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn scratch(tag: &str) -> PathBuf {
        crate::fsutil::test_dir(&format!("store-{tag}"))
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    const ABC_SHA: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn stores_when_hash_matches() {
        let dir = scratch("ok");
        let want = Expected {
            file_name: "m.gguf",
            size: 3,
            sha256: ABC_SHA,
        };
        let p = store_verified(&dir, &want, |s| {
            s.copy_from(&mut &b"ab"[..])?;
            s.copy_from(&mut &b"c"[..]).map(drop)
        })
        .unwrap();
        assert_eq!(p, dir.join("m.gguf"));
        assert_eq!(fs::read(&p).unwrap(), b"abc");
        assert_eq!(entries(&dir), [".m.gguf.keel-sha256", "m.gguf"], "the file and its checked-hash stamp");
        assert!(stamp_matches(&p, ABC_SHA));
        assert_eq!(sha256_file(&p, "hash").unwrap(), ABC_SHA);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mismatch_deletes_temp_file_and_reports_both_hashes() {
        let dir = scratch("bad");
        let want = Expected {
            file_name: "m.gguf",
            size: 3,
            sha256: ABC_SHA,
        };
        let e =
            store_verified(&dir, &want, |s| s.copy_from(&mut &b"abd"[..]).map(drop)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, PullError::Checksum { .. }), "{msg}");
        assert!(
            msg.contains(ABC_SHA) && msg.contains("expected") && msg.contains("got"),
            "{msg}"
        );
        assert!(entries(&dir).is_empty(), "left behind: {:?}", entries(&dir));

        let e =
            store_verified(&dir, &want, |s| s.copy_from(&mut &b"abcd"[..]).map(drop)).unwrap_err();
        assert!(
            matches!(
                e,
                PullError::Size {
                    expected: 3,
                    got: 4,
                    ..
                }
            ),
            "{e}"
        );
        assert!(entries(&dir).is_empty());

        let e = store_verified(&dir, &want, |_| Err(PullError::NoModelsDir)).unwrap_err();
        assert!(matches!(e, PullError::NoModelsDir));
        assert!(entries(&dir).is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}

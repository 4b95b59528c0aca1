//! Every file keel writes goes through here, so a failure, a signal or a hostile
//! directory never leaves a half-written file or overwrites another one.
//!
//! [`TempFile`] is the one writer: it creates `.NAME.keel-tmp-XXXXXXXXXXXXXXXX` (64
//! random bits from `getrandom(2)`) in the destination's folder with `O_CREAT|O_EXCL`
//! (`create_new`) and `O_NOFOLLOW`, so a file or symlink planted at that name makes the
//! open fail instead of redirecting the write; the caller writes, then
//! [`TempFile::commit`] fsyncs, renames over the destination and fsyncs the folder.
//! Dropping it uncommitted removes the temporary file, and while it exists its path sits
//! in a small registry that the SIGINT/SIGTERM/SIGHUP handler (installed on first use)
//! unlinks before the process dies of the same signal (exit status 128+signal).
//! A destination that exists as anything but a regular file (or a symlink, which the
//! rename replaces, not follows) is refused before anything is written.
//! [`refuse_own_input`] stops a writer from replacing the file it reads (same device and
//! inode, whatever path names it).

use anyhow::{bail, Context, Result};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Once;

/// A temporary file beside its destination, renamed into place by [`TempFile::commit`]
/// and removed if dropped before that.
pub struct TempFile {
    file: Option<File>,
    tmp: PathBuf,
    dest: PathBuf,
    slot: Option<usize>,
    done: bool,
}

/// 64 random bits as 16 hex digits (`getrandom(2)`; the clock and pid if it fails, which
/// costs only unpredictability: `O_EXCL` and `O_NOFOLLOW` keep the open safe anyway).
pub fn random_suffix() -> String {
    let mut b = [0u8; 8];
    // SAFETY: writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let v = if n == b.len() as isize {
        u64::from_le_bytes(b)
    } else {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        t ^ ((std::process::id() as u64) << 32)
    };
    format!("{v:016x}")
}

/// The folder a path's file lives in (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

impl TempFile {
    /// Creates a fresh temporary file in `dest`'s folder (mode 0644 before the umask).
    /// Refuses a destination that exists and is not a regular file (a device such as
    /// `/dev/null`, a folder, a FIFO, a socket): the rename would replace it.
    pub fn create(dest: &Path) -> io::Result<TempFile> {
        let name = dest.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{} has no file name", dest.display())))?;
        if let Ok(m) = std::fs::symlink_metadata(dest) {
            let t = m.file_type();
            if !(t.is_file() || t.is_symlink()) {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} exists and is not a regular file (a device, folder, FIFO or socket); name a file to write", dest.display())));
            }
        }
        let dir = parent_of(dest);
        let mut last = None;
        for _ in 0..16 {
            let mut tmp_name = std::ffi::OsString::from(".");
            tmp_name.push(name);
            tmp_name.push(format!(".keel-tmp-{}", random_suffix()));
            let tmp = dir.join(tmp_name);
            // Published before it exists, so a signal can never fall between the file
            // appearing and the handler knowing its name (unlinking a name not yet
            // created is harmless).
            let slot = register(&tmp);
            match OpenOptions::new().write(true).create_new(true).mode(0o644).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&tmp) {
                Ok(file) => return Ok(TempFile { file: Some(file), tmp, dest: dest.to_path_buf(), slot, done: false }),
                // Taken (by a file or a planted symlink): draw another name.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    unregister(slot);
                    last = Some(e)
                }
                Err(e) => {
                    unregister(slot);
                    return Err(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
    }

    /// The temporary file's path (for messages).
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// The destination.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// The open file.
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("the file is open until commit")
    }

    /// Syncs the file, renames it over the destination, and syncs the folder (a failure
    /// of that last step loses nothing already written and is ignored).
    pub fn commit(mut self) -> io::Result<()> {
        let file = self.file.take().expect("commit once");
        file.sync_all()?;
        drop(file);
        std::fs::rename(&self.tmp, &self.dest)?;
        self.done = true;
        unregister(self.slot.take());
        if let Ok(d) = File::open(parent_of(&self.dest)) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Write for TempFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file().flush()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.done {
            self.file = None;
            let _ = std::fs::remove_file(&self.tmp);
            unregister(self.slot.take());
        }
    }
}

/// Writes `bytes` to `path` through a [`TempFile`].
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut t = TempFile::create(path).with_context(|| format!("cannot create a temporary file for {} in {}", path.display(), parent_of(path).display()))?;
    t.write_all(bytes).with_context(|| format!("writing {}", t.tmp_path().display()))?;
    t.commit().with_context(|| format!("writing {}", path.display()))
}

/// Fails if `output` names the same file (device and inode) as `input`, by whatever path.
pub fn refuse_own_input(input: &Path, output: &Path, what: &str) -> Result<()> {
    if let (Ok(i), Ok(o)) = (std::fs::metadata(input), std::fs::metadata(output)) {
        if i.dev() == o.dev() && i.ino() == o.ino() {
            bail!("{what} {} is the input file {} itself; writing it would destroy the input: choose another output path", output.display(), input.display());
        }
    }
    Ok(())
}

// ---- the signal-time registry ----

/// Live temporary paths. A signal handler may only read these (no locks, no allocation),
/// so each path is a leaked C string published with an atomic store; unregistering
/// clears the slot and leaks the string (a few bytes per file written, and no handler
/// can read freed memory).
const SLOTS: usize = 16;
static LIVE: [AtomicPtr<libc::c_char>; SLOTS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];
static INSTALL: Once = Once::new();

/// The signals that remove live temporary files before the process dies.
pub const CLEANUP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn register(path: &Path) -> Option<usize> {
    INSTALL.call_once(install_handlers);
    let c = CString::new(path.as_os_str().as_bytes()).ok()?.into_raw();
    for (i, s) in LIVE.iter().enumerate() {
        if s.compare_exchange(std::ptr::null_mut(), c, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            return Some(i);
        }
    }
    // Sixteen files at once: this one is still removed on error, just not on a signal.
    // SAFETY: `c` came from `into_raw` above and was not published.
    drop(unsafe { CString::from_raw(c) });
    None
}

fn unregister(slot: Option<usize>) {
    if let Some(i) = slot {
        LIVE[i].store(std::ptr::null_mut(), Ordering::SeqCst);
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    for s in &LIVE {
        let p = s.load(Ordering::SeqCst);
        if !p.is_null() {
            // SAFETY: published strings are never freed; unlink is async-signal-safe.
            unsafe { libc::unlink(p) };
        }
    }
    // Die of the same signal, so the parent sees it (a shell reports 128+signal); if
    // re-raising returns, exit with that status ourselves.
    // SAFETY: signal, raise and _exit are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
        libc::_exit(128 + sig);
    }
}

fn install_handlers() {
    for sig in CLEANUP_SIGNALS {
        // SAFETY: a zeroed sigaction is valid; the handler only touches atomics and
        // async-signal-safe calls. A signal the parent ignored (nohup) stays ignored.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// A fresh, empty directory `keel-TAG-PID` under the system's temporary directory, for
/// the crate's unit tests.
#[cfg(test)]
pub(crate) fn test_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("keel-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        test_dir(&format!("fsutil-{tag}"))
    }

    #[test]
    fn names_are_random_and_files_land_whole() {
        let d = scratch("names");
        let dest = d.join("out.bin");
        let a = TempFile::create(&dest).unwrap();
        let b = TempFile::create(&dest).unwrap();
        assert_ne!(a.tmp_path(), b.tmp_path());
        let name = a.tmp_path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(".out.bin.keel-tmp-") && name.len() == ".out.bin.keel-tmp-".len() + 16, "{name}");
        drop(a);
        drop(b);
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "dropped temporaries are removed");
        write_atomic(&dest, b"hello").unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_same_file_by_another_path_is_refused() {
        let d = scratch("same");
        let f = d.join("in.gguf");
        std::fs::write(&f, b"x").unwrap();
        std::os::unix::fs::symlink(&f, d.join("link")).unwrap();
        std::fs::hard_link(&f, d.join("hard")).unwrap();
        for other in [f.clone(), d.join("link"), d.join("hard"), d.join(".").join("in.gguf")] {
            assert!(refuse_own_input(&f, &other, "OUT").is_err(), "{}", other.display());
        }
        refuse_own_input(&f, &d.join("new.gguf"), "OUT").unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}

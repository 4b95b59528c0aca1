//! The pipe to a device process: frames (`u32` little-endian length, then a
//! postcard message, as the firmware's `msgloop` expects) written to its stdin
//! with a deadline, and read from its stdout by the waiting caller with a
//! deadline (both pipes are non-blocking and waited on with `poll(2)`), so that
//! a dead or hung process never blocks it.
//!
//! Reading allocates nothing after [`Transport::spawn`]: bytes go into one
//! receive buffer sized for the largest frame plus its header; a frame is lent
//! out in place (the [`Incoming::Frame`] slice) and dropped from the buffer at
//! the next receive, which moves the bytes after it (the start of the next
//! frames) to the front. Writing sends the header and the message as they are.
//! The last few KiB of the process's stderr are kept for error messages.
//! This module owns the child process and kills it when dropped.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What the process sent.
#[derive(Debug)]
pub enum Incoming<'a> {
    /// One message's bytes (valid until the next receive).
    Frame(&'a [u8]),
    /// A frame header announcing more than `max` bytes: the stream cannot be trusted.
    Oversized(u32),
    /// The process closed its stdout (it exited or was killed).
    Closed,
}

/// Why nothing was received.
#[derive(Debug, PartialEq, Eq)]
pub enum Silence {
    /// Nothing arrived before the deadline.
    Timeout,
    /// Nothing is waiting now (`try_recv`).
    Empty,
}

/// A running device process and its pipes.
pub struct Transport {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    /// Received bytes: `inbox[..filled]`, whole frames first, then the start of the next.
    inbox: Box<[u8]>,
    filled: usize,
    /// Bytes of the frame lent out by the last receive (removed at the next one).
    lent: usize,
    /// Stdout reached its end (or failed): nothing more will arrive.
    ended: bool,
    max_frame: usize,
    stderr: Arc<Mutex<Vec<u8>>>,
}

const STDERR_KEEP: usize = 4096;
/// Bytes read from stderr at a time.
const STDERR_CHUNK: usize = 512;
/// Bytes of a frame header.
const HEADER: usize = 4;

impl Transport {
    /// Starts `cmd` with piped stdio; frames longer than `max_frame` are refused.
    pub fn spawn(mut cmd: Command, max_frame: usize) -> io::Result<Transport> {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let stdin = child.stdin.take().ok_or_else(|| io::Error::other("no stdin pipe"))?;
        set_nonblocking(stdin.as_raw_fd())?;
        let stdout = child.stdout.take().ok_or_else(|| io::Error::other("no stdout pipe"))?;
        set_nonblocking(stdout.as_raw_fd())?;
        let mut stderr_pipe = child.stderr.take().ok_or_else(|| io::Error::other("no stderr pipe"))?;
        // Room for the kept tail and one chunk: appending never reallocates.
        let stderr = Arc::new(Mutex::new(Vec::with_capacity(STDERR_KEEP + STDERR_CHUNK)));
        let keep = Arc::clone(&stderr);
        thread::Builder::new().name("hexagon-sim-err".into()).spawn(move || {
            let mut buf = [0u8; STDERR_CHUNK];
            while let Ok(n @ 1..) = stderr_pipe.read(&mut buf) {
                let mut k = keep.lock().unwrap_or_else(|e| e.into_inner());
                k.extend_from_slice(&buf[..n]);
                let excess = k.len().saturating_sub(STDERR_KEEP);
                k.drain(..excess);
            }
        })?;
        let inbox = vec![0u8; HEADER + max_frame].into_boxed_slice();
        Ok(Transport { child, stdin: Some(stdin), stdout, inbox, filled: 0, lent: 0, ended: false, max_frame, stderr })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes one frame, giving up at `deadline` (a hung reader fills the pipe).
    pub fn send(&mut self, msg: &[u8], deadline: Instant) -> io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| io::Error::from(io::ErrorKind::BrokenPipe))?;
        let len = u32::try_from(msg.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        write_all_before(stdin, &len.to_le_bytes(), deadline)?;
        write_all_before(stdin, msg, deadline)
    }

    /// The next incoming item, waiting until `deadline`.
    pub fn recv(&mut self, deadline: Instant) -> Result<Incoming<'_>, Silence> {
        self.next(Some(deadline))
    }

    /// The next incoming item if one is there.
    pub fn try_recv(&mut self) -> Result<Incoming<'_>, Silence> {
        self.next(None)
    }

    /// Drops the frame lent out last, then reads until a whole frame is buffered,
    /// stdout ends, or `deadline` passes (`None`: only what is there now).
    fn next(&mut self, deadline: Option<Instant>) -> Result<Incoming<'_>, Silence> {
        if self.lent > 0 {
            self.inbox.copy_within(self.lent..self.filled, 0);
            self.filled -= self.lent;
            self.lent = 0;
        }
        loop {
            if self.filled >= HEADER {
                let n = u32::from_le_bytes([self.inbox[0], self.inbox[1], self.inbox[2], self.inbox[3]]);
                if n as usize > self.max_frame {
                    return Ok(Incoming::Oversized(n));
                }
                // A frame no longer than `max_frame` fits the buffer: it is whole once that many bytes are in.
                let end = HEADER + n as usize;
                if self.filled >= end {
                    self.lent = end;
                    return Ok(Incoming::Frame(&self.inbox[HEADER..end]));
                }
            }
            if self.ended {
                return Ok(Incoming::Closed);
            }
            match self.stdout.read(&mut self.inbox[self.filled..]) {
                Ok(0) => self.ended = true,
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let Some(deadline) = deadline else { return Err(Silence::Empty) };
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Silence::Timeout);
                    }
                    wait_for(self.stdout.as_raw_fd(), libc::POLLIN, left);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.ended = true,
            }
        }
    }

    /// The exit status, waiting briefly for a process that is going away.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        let until = Instant::now() + Duration::from_millis(200);
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() < until => thread::sleep(Duration::from_millis(5)),
                _ => return None,
            }
        }
    }

    /// The tail of the process's stderr, trimmed.
    pub fn stderr_tail(&self) -> String {
        let k = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&k).trim().to_string()
    }

    /// Kills the process (if still running) and reaps it.
    pub fn kill(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.kill();
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL touch only its flags.
    let r = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            flags
        } else {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK)
        }
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Waits until `fd` is ready for `events`, at most `left` (and at most a second:
/// callers check their deadline and wait again).
fn wait_for(fd: RawFd, events: libc::c_short, left: Duration) {
    let mut pfd = libc::pollfd { fd, events, revents: 0 };
    // Rounded up, so that a wait never ends just before the deadline and spins.
    let ms = left.as_micros().div_ceil(1000).clamp(1, 1000) as libc::c_int;
    // SAFETY: one valid pollfd for a descriptor we own, for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}

fn write_all_before(p: &mut ChildStdin, mut buf: &[u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        match p.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                wait_for(p.as_raw_fd(), libc::POLLOUT, left);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

//! The pipe to a device process: frames (`u32` little-endian length, then a
//! postcard message, as the firmware's `msgloop` expects) written to its stdin
//! with a deadline, and read from its stdout by a reader thread, so that a
//! caller can wait with a timeout and a dead or hung process never blocks it.
//! The last few KiB of the process's stderr are kept for error messages.
//! This module owns the child process and kills it when dropped.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What the reader thread saw.
#[derive(Debug)]
pub enum Incoming {
    /// One message's bytes.
    Frame(Vec<u8>),
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
    rx: Receiver<Incoming>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

const STDERR_KEEP: usize = 4096;

impl Transport {
    /// Starts `cmd` with piped stdio; frames longer than `max_frame` are refused.
    pub fn spawn(mut cmd: Command, max_frame: usize) -> io::Result<Transport> {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let stdin = child.stdin.take().ok_or_else(|| io::Error::other("no stdin pipe"))?;
        set_nonblocking(&stdin)?;
        let mut stdout = child.stdout.take().ok_or_else(|| io::Error::other("no stdout pipe"))?;
        let mut stderr_pipe = child.stderr.take().ok_or_else(|| io::Error::other("no stderr pipe"))?;
        let (tx, rx) = mpsc::channel();
        thread::Builder::new().name("hexagon-sim-rx".into()).spawn(move || loop {
            let mut len = [0u8; 4];
            if stdout.read_exact(&mut len).is_err() {
                let _ = tx.send(Incoming::Closed);
                return;
            }
            let n = u32::from_le_bytes(len);
            if n as usize > max_frame {
                let _ = tx.send(Incoming::Oversized(n));
                return;
            }
            let mut buf = vec![0u8; n as usize];
            let msg = match stdout.read_exact(&mut buf) {
                Ok(()) => Incoming::Frame(buf),
                Err(_) => Incoming::Closed,
            };
            let last = matches!(msg, Incoming::Closed);
            if tx.send(msg).is_err() || last {
                return;
            }
        })?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&stderr);
        thread::Builder::new().name("hexagon-sim-err".into()).spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok(n @ 1..) = stderr_pipe.read(&mut buf) {
                let mut k = keep.lock().unwrap_or_else(|e| e.into_inner());
                k.extend_from_slice(&buf[..n]);
                let excess = k.len().saturating_sub(STDERR_KEEP);
                k.drain(..excess);
            }
        })?;
        Ok(Transport { child, stdin: Some(stdin), rx, stderr })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes one frame, giving up at `deadline` (a hung reader fills the pipe).
    pub fn send(&mut self, msg: &[u8], deadline: Instant) -> io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| io::Error::from(io::ErrorKind::BrokenPipe))?;
        let len = u32::try_from(msg.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut frame = Vec::with_capacity(4 + msg.len());
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(msg);
        write_all_before(stdin, &frame, deadline)
    }

    /// The next incoming item, waiting until `deadline`.
    pub fn recv(&mut self, deadline: Instant) -> Result<Incoming, Silence> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(wait) {
            Ok(m) => Ok(m),
            Err(RecvTimeoutError::Timeout) => Err(Silence::Timeout),
            Err(RecvTimeoutError::Disconnected) => Ok(Incoming::Closed),
        }
    }

    /// The next incoming item if one is there.
    pub fn try_recv(&mut self) -> Result<Incoming, Silence> {
        match self.rx.try_recv() {
            Ok(m) => Ok(m),
            Err(TryRecvError::Empty) => Err(Silence::Empty),
            Err(TryRecvError::Disconnected) => Ok(Incoming::Closed),
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

fn set_nonblocking(p: &ChildStdin) -> io::Result<()> {
    let fd = p.as_raw_fd();
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

fn write_all_before(p: &mut ChildStdin, mut buf: &[u8], deadline: Instant) -> io::Result<()> {
    use std::io::Write;
    while !buf.is_empty() {
        match p.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                let mut pfd = libc::pollfd { fd: p.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
                let ms = left.as_millis().clamp(1, 1000) as libc::c_int;
                // SAFETY: one valid pollfd for a descriptor we own, for the duration of the call.
                unsafe { libc::poll(&mut pfd, 1, ms) };
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

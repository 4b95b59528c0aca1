//! A conversation with a device process: wire messages over a [`Transport`],
//! every wait bounded by the device's timeout, every failure turned into a
//! [`DeviceError`] that names the device. A fatal failure (the process died,
//! hung past its timeout, or broke the protocol) kills the process and is
//! remembered: every later call returns it, until the device is reopened.
//!
//! Batch completions that arrive while a control request waits for its reply
//! are kept in [`Link::done`] for the queue to collect, never dropped.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use keel_npu_hal::device::{BatchStatus, Seq};
use keel_npu_hal::wire::{self, DeviceMsg, HostMsg, MAX_MESSAGE};
use keel_npu_hal::ErrorKind;

use super::error::DeviceError;
use super::transport::{Incoming, Silence, Transport};

/// One device process and the state of the conversation.
pub struct Link {
    /// The device's name in errors.
    pub name: String,
    /// How long any reply may take.
    pub timeout: Duration,
    t: Transport,
    broken: Option<DeviceError>,
    /// Completions received while waiting for something else, in arrival order.
    pub done: VecDeque<(Seq, BatchStatus)>,
}

impl Link {
    /// Wraps a started transport.
    pub fn new(name: String, timeout: Duration, t: Transport) -> Link {
        Link { name, timeout, t, broken: None, done: VecDeque::new() }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.t.pid()
    }

    /// A non-fatal error (the request failed, the device is fine).
    pub fn err(&self, kind: ErrorKind, what: impl Into<String>) -> DeviceError {
        DeviceError::new(&self.name, kind, what)
    }

    /// A fatal error: kills the process and remembers why.
    pub fn fail(&mut self, kind: ErrorKind, what: impl Into<String>) -> DeviceError {
        let e = self.err(kind, what);
        self.t.kill();
        self.broken.get_or_insert(e.clone());
        e
    }

    /// Whether an earlier fatal error ended this session.
    pub fn check(&self) -> Result<(), DeviceError> {
        match &self.broken {
            Some(e) => Err(DeviceError { what: format!("{} (earlier fault; reopen the device)", e.what), ..e.clone() }),
            None => Ok(()),
        }
    }

    fn lost(&mut self, while_: &str) -> DeviceError {
        let status = self.t.exit_status().map_or("still running".into(), |s| s.to_string());
        let tail = self.t.stderr_tail();
        let tail = if tail.is_empty() { String::new() } else { format!("; its stderr: {tail}") };
        self.fail(ErrorKind::DeviceLost, format!("the emulator process went away {while_} ({status}){tail}"))
    }

    /// Sends one message.
    pub fn send(&mut self, msg: &HostMsg) -> Result<(), DeviceError> {
        self.check()?;
        let mut buf = [0u8; MAX_MESSAGE];
        let bytes = wire::encode(msg, &mut buf).map_err(|k| self.err(k, "message does not fit the wire limit"))?;
        let deadline = Instant::now() + self.timeout;
        match self.t.send(bytes, deadline) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                let t = self.timeout;
                Err(self.fail(ErrorKind::Timeout, format!("the device did not take a request within {t:?} (hung); killed")))
            }
            Err(_) => Err(self.lost("while a request was being sent")),
        }
    }

    /// The next message, waiting until `deadline` (`None`: only if one is there now).
    /// `waiting_for` names what is awaited in the error if none comes; it is formatted
    /// only then (pass a `&str` or `format_args!`), so a successful receive allocates nothing.
    pub fn recv(&mut self, deadline: Option<Instant>, waiting_for: impl fmt::Display) -> Result<Option<DeviceMsg>, DeviceError> {
        self.check()?;
        let got = match deadline {
            Some(d) => self.t.recv(d),
            None => self.t.try_recv(),
        };
        match got {
            Ok(Incoming::Frame(bytes)) => match wire::decode::<DeviceMsg>(bytes) {
                Ok(m) => Ok(Some(m)),
                Err(_) => {
                    let head: Vec<String> = bytes.iter().take(16).map(|b| format!("{b:02x}")).collect();
                    let what = format!("malformed reply while waiting for {waiting_for}: {} bytes [{}]", bytes.len(), head.join(" "));
                    Err(self.fail(ErrorKind::Protocol, what))
                }
            },
            Ok(Incoming::Oversized(n)) => Err(self.fail(ErrorKind::Protocol, format!("reply frame of {n} bytes exceeds the {MAX_MESSAGE}-byte limit"))),
            Ok(Incoming::Closed) => Err(self.lost(&format!("while waiting for {waiting_for}"))),
            Err(Silence::Empty) => Ok(None),
            Err(Silence::Timeout) => {
                let t = self.timeout;
                Err(self.fail(ErrorKind::Timeout, format!("no {waiting_for} within {t:?}; the device is hung and was killed")))
            }
        }
    }

    /// Sends `msg` and returns its reply; completions that come first are kept in `done`.
    pub fn call(&mut self, msg: &HostMsg, what: &str) -> Result<DeviceMsg, DeviceError> {
        self.send(msg)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.recv(Some(deadline), what)? {
                Some(DeviceMsg::BatchDone { seq, status }) => self.done.push_back((seq, status)),
                Some(m) => return Ok(m),
                // `recv` with a deadline gives a message or an error; treat anything else as silence.
                None => return Err(self.fail(ErrorKind::Timeout, format!("no answer to {what}"))),
            }
        }
    }

    /// A reply that is not the one expected: a device `Error` is passed on
    /// (non-fatal), anything else breaks the protocol.
    pub fn unexpected(&mut self, got: DeviceMsg, what: &str) -> DeviceError {
        match got {
            DeviceMsg::Error { kind, detail } => self.err(kind, format!("the firmware refused {what} (detail {detail})")),
            other => self.fail(ErrorKind::Protocol, format!("expected the answer to {what}, got {other:?}")),
        }
    }
}

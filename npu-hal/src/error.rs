//! Errors in the embedded-hal 1.0 pattern: every device error type can say what
//! *kind* of failure it is, so generic code (the scheduler) can react without
//! knowing the device. This module owns [`ErrorKind`]; it knows nothing of transports.

/// A device error: any type, as long as it can be classified.
pub trait Error: core::fmt::Debug {
    /// The generic kind of this error.
    fn kind(&self) -> ErrorKind;
}

/// Ties a device type to its error type (as `embedded_hal::digital::ErrorType` does).
pub trait ErrorType {
    /// The error every fallible method of the device returns.
    type Error: Error;
}

/// Generic classes of device failure. New kinds may be added (the enum is
/// `#[non_exhaustive]`), and the wire protocol only ever appends to it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ErrorKind {
    /// A completion or reply did not arrive in time.
    Timeout,
    /// The device went away (DSP restart, session killed, fd closed).
    DeviceLost,
    /// The device or the shared-memory heap could not provide the memory.
    OutOfMemory,
    /// The op, type, shape or request is not supported by this device.
    Unsupported,
    /// The peer broke the protocol (bad version, unexpected message, malformed bytes).
    Protocol,
    /// A reply was well-formed but its content is wrong (for example a self-test
    /// returned a result different from the known answer).
    BadResponse,
    /// An argument was out of range (unknown buffer, misaligned size, bad index).
    InvalidArgument,
    /// The device is busy: too many batches in flight, or the buffer is in use.
    Busy,
    /// Anything else.
    Other,
}

impl Error for ErrorKind {
    fn kind(&self) -> ErrorKind {
        *self
    }
}

impl Error for core::convert::Infallible {
    fn kind(&self) -> ErrorKind {
        match *self {}
    }
}

impl core::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            ErrorKind::Timeout => "timed out waiting for the device",
            ErrorKind::DeviceLost => "device lost",
            ErrorKind::OutOfMemory => "device out of memory",
            ErrorKind::Unsupported => "not supported by the device",
            ErrorKind::Protocol => "protocol violation",
            ErrorKind::BadResponse => "device gave a wrong answer",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Busy => "device busy",
            ErrorKind::Other => "device error",
        };
        f.write_str(s)
    }
}

//! The error every device shim returns: which device, what kind of failure
//! (the HAL's [`ErrorKind`], so the scheduler can react without knowing the
//! device), and what happened, in words a user can act on.

use std::fmt;

use keel_npu_hal::ErrorKind;

/// A device failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceError {
    /// The device, e.g. `hexagon-sim (qemu-hexagon -cpu v68, pid 4242)`.
    pub device: String,
    /// The generic kind.
    pub kind: ErrorKind,
    /// What happened.
    pub what: String,
}

impl DeviceError {
    /// An error of `kind` on `device`.
    pub fn new(device: &str, kind: ErrorKind, what: impl Into<String>) -> Self {
        DeviceError { device: device.to_string(), kind, what: what.into() }
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.device, self.kind, self.what)
    }
}

impl std::error::Error for DeviceError {}

impl keel_npu_hal::Error for DeviceError {
    fn kind(&self) -> ErrorKind {
        self.kind
    }
}

//! The `hexagon` device: a real Hexagon CDSP driven through the system's
//! `libcdsprpc.so` (FastRPC), behind the same HAL traits as `hexagon-sim`. Only the
//! transport differs: the DSP side is keel's firmware loaded as a FastRPC skel in an
//! unsigned protection domain, messages are `keel_npu_hal::wire` messages over one
//! `dspqueue`, and buffers are rpcmem (dma-buf) allocations mapped with `fastrpc_mmap`.
//!
//! Open, step by step (every failure names the step and the library's code):
//! 1. dlopen the library ([`api`]: `KEEL_CDSPRPC` overrides the path; optional symbols);
//! 2. the DSP's capabilities through `remote_handle_control(DSPRPC_GET_DSP_INFO)`
//!    (arch, HVX contexts, HMX, VTCM; a refused query is noted, not fatal, as on some
//!    v68 Linux images);
//! 3. `remote_session_control(DSPRPC_CONTROL_UNSIGNED_MODULE)` for the domain, then
//!    `remote_handle64_open` of the skel's URI (`_dom=cdsp`, optional `_session=N`), then
//!    `DSPRPC_CONTROL_LATENCY` on the handle;
//! 4. `dspqueue_create` + `dspqueue_export`, and the skel's `start` method (2) told the
//!    queue id so it imports it;
//! 5. the versioned handshake, the capabilities the firmware measured, then a known-input
//!    self-test with a fresh seed: a DSP that accepts every call and computes nothing is
//!    refused here;
//! 6. the session's DSP address budget measured by mapping growing rpcmem buffers until
//!    the DSP refuses one ([`budget`]), all unmapped and freed again; that figure, not the
//!    skel's constant, is `caps.memory.va_budget`.
//!
//! Buffers: [`RpcBuf`] owns one rpcmem allocation and its mapping, unmapped and freed when
//! dropped. Batches: `dspqueue_write` with a buffer reference (REF + cache flags) per
//! buffer; completions come back by `dspqueue_read` and are matched to the batches in
//! flight by sequence number. After open and the buffers' allocation and mapping,
//! `submit`, `poll` and `host_view` allocate nothing when they succeed.

pub mod api;
pub mod budget;
pub mod probe;
#[allow(missing_docs, clippy::all)]
pub mod sys;

use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use keel_npu_hal::device::{BatchStatus, Completion, Device, Queue, Seq, SharedBuffers};
use keel_npu_hal::op::Batch;
use keel_npu_hal::wire::{self, BatchMsg, DeviceMsg, HostMsg, MAGIC, MAX_BUFFERS, MAX_MESSAGE, PROTOCOL_VERSION};
use keel_npu_hal::{selftest, Arch, BufferId, Caps, ErrorKind, ErrorType, Identity, UnitState};

use super::error::DeviceError;
use super::inflight::InFlight;
use super::hexagon_sim::{fresh_seed, SelfTestReport};
pub use api::{Api, LoadError};

/// The skel's methods past open/close (FastRPC numbers a handle's own methods from 2).
pub const METHOD_START: u32 = 2;
/// Queue sizes asked of `dspqueue_create`, bytes per direction.
pub const QUEUE_BYTES: u32 = 256 << 10;

/// How to open a `hexagon` device; defaults from the environment:
/// `KEEL_FASTRPC_SESSION` (a session id for the URI), `KEEL_DSP_TIMEOUT_MS` (10000).
#[derive(Clone, Debug)]
pub struct FastRpcConfig {
    /// FastRPC domain (3 = CDSP).
    pub domain: u32,
    /// `_session=N` in the URI, for a second session on the same DSP.
    pub session: Option<u32>,
    /// The skel's file name, found by the library on `DSP_LIBRARY_PATH`/`ADSP_LIBRARY_PATH`.
    pub skel: String,
    /// Longest wait for any reply, and for a batch from its submission.
    pub timeout: Duration,
    /// A variable of the environment that `from_env` could not read (what is wrong and
    /// the fix): [`Hexagon::open`] refuses to open with it.
    pub env_error: Option<String>,
}

impl FastRpcConfig {
    /// The defaults, overridden by the environment; a variable that is set but cannot
    /// be read is kept in `env_error`, not replaced by its default.
    pub fn from_env() -> FastRpcConfig {
        let v = std::env::var("KEEL_FASTRPC_SESSION").ok();
        let session = crate::device::config::env_number("KEEL_FASTRPC_SESSION", v.as_deref(), 0..=u32::MAX as u64, "a session id", "the first session");
        let timeout = crate::device::config::timeout_from_env(10_000);
        FastRpcConfig {
            domain: sys::CDSP_DOMAIN_ID,
            session: session.clone().ok().flatten().map(|s| s as u32),
            skel: "libkeel_skel.so".into(),
            timeout: timeout.clone().unwrap_or(Duration::from_millis(10_000)),
            env_error: session.err().or(timeout.err()),
        }
    }

    /// The URI `remote_handle64_open` is given.
    pub fn uri(&self) -> String {
        let stem = self.skel.trim_start_matches("lib").trim_end_matches(".so");
        let mut u = format!("file:///{}?{stem}_handle_invoke&_modver=1.0&_dom=cdsp", self.skel);
        if let Some(s) = self.session {
            u.push_str(&format!("&_session={s}"));
        }
        u
    }
}

/// `KEEL_FASTRPC_PROBE_CAP` (bytes): the most the budget probe maps; `Err`: not a number.
fn probe_cap() -> Result<Option<u64>, String> {
    match std::env::var("KEEL_FASTRPC_PROBE_CAP").ok().filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| format!("KEEL_FASTRPC_PROBE_CAP={v:?} is not a byte count (e.g. 1073741824): unset it or give bytes")),
    }
}

/// The name of a libcdsprpc return code (AEEStdErr), for messages.
pub fn code_name(code: i32) -> &'static str {
    match code as u32 {
        sys::AEE_SUCCESS => "AEE_SUCCESS",
        sys::AEE_EFAILED => "AEE_EFAILED",
        sys::AEE_ENOMEMORY => "AEE_ENOMEMORY",
        sys::AEE_EEXPIRED => "AEE_EEXPIRED, timed out",
        sys::AEE_EBADSTATE => "AEE_EBADSTATE",
        sys::AEE_EBADPARM => "AEE_EBADPARM",
        sys::AEE_EUNSUPPORTED => "AEE_EUNSUPPORTED",
        sys::AEE_ENOTALLOWED => "AEE_ENOTALLOWED",
        sys::AEE_EINVALIDFD => "AEE_EINVALIDFD",
        sys::AEE_ENOSUCHMOD => "AEE_ENOSUCHMOD, no such module",
        sys::AEE_ENOSUCHMAP => "AEE_ENOSUCHMAP",
        sys::AEE_ECONNREFUSED => "AEE_ECONNREFUSED, no DSP answered",
        sys::AEE_ERPC => "AEE_ERPC",
        sys::AEE_ECONNRESET => "AEE_ECONNRESET, the DSP process is gone",
        sys::AEE_EWOULDBLOCK => "AEE_EWOULDBLOCK",
        sys::AEE_EUNSIGNEDPD_REFUSED => "unsigned PD refused",
        _ => "unknown code",
    }
}

/// What `DSPRPC_GET_DSP_INFO` said (`None`: the query was refused or is absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DspInfo {
    /// Hexagon version from `ARCH_VER` (68 for v68).
    pub arch: Option<u8>,
    /// 128-byte HVX contexts.
    pub hvx_contexts: Option<u32>,
    /// HMX depth (0: no HMX).
    pub hmx_depth: Option<u32>,
    /// VTCM page size × page count, bytes.
    pub vtcm_bytes: Option<u64>,
    /// Whether the DSP runs unsigned PDs.
    pub unsigned_pd: Option<bool>,
    /// Steps that failed without ending the open (said by `keel probe`).
    pub notes: Vec<String>,
}

/// One rpcmem allocation, mapped to the DSP or not; unmapped and freed when dropped.
pub struct RpcBuf {
    api: Rc<Api>,
    domain: u32,
    ptr: *mut u8,
    fd: i32,
    size: u64,
    mapped: bool,
    busy: u32,
}

impl RpcBuf {
    /// `fastrpc_mmap` with `FASTRPC_MAP_FD`; the library's code.
    fn map(&mut self) -> i32 {
        if self.mapped {
            return 0;
        }
        let mmap = self.api.mmap.expect("checked at load");
        // SAFETY: a live rpcmem allocation of `size` bytes and its fd.
        let r = unsafe { mmap(self.domain as i32, self.fd, self.ptr.cast(), 0, self.size as usize, sys::FASTRPC_MAP_FD as i32) };
        self.mapped = r == 0;
        r
    }

    fn unmap(&mut self) -> i32 {
        if !self.mapped {
            return 0;
        }
        self.mapped = false;
        let munmap = self.api.munmap.expect("checked at load");
        // SAFETY: the fd, address and length of a mapping this buffer made.
        unsafe { munmap(self.domain as i32, self.fd, self.ptr.cast(), self.size as usize) }
    }
}

impl Drop for RpcBuf {
    fn drop(&mut self) {
        self.unmap();
        let free = self.api.rpcmem_free.expect("checked at load");
        // SAFETY: `ptr` came from rpcmem_alloc and is freed once.
        unsafe { free(self.ptr.cast()) }
    }
}

/// An opened `hexagon` device.
pub struct Hexagon {
    name: String,
    timeout: Duration,
    queue: sys::dspqueue_t,
    bufs: HashMap<u32, RpcBuf>,
    handle: u64,
    api: Rc<Api>,
    domain: u32,
    identity: Identity,
    caps: Caps,
    info: DspInfo,
    selftest: SelfTestReport,
    budget: budget::Probe,
    mapped_bytes: u64,
    next_seq: Seq,
    flight: InFlight,
    inbox: Box<[u8]>,
    broken: Option<DeviceError>,
    /// `Drop` deinitialises rpcmem only when the open initialised it.
    rpcmem_inited: bool,
}

impl ErrorType for Hexagon {
    type Error = DeviceError;
}

/// A step's failure with its code.
fn step_error(name: &str, kind: ErrorKind, step: &str, code: i32, advice: &str) -> DeviceError {
    DeviceError::new(name, kind, format!("{step} failed with {code:#x} ({}){}{advice}", code_name(code), if advice.is_empty() { "" } else { ": " }))
}

/// Everything opened so far, closed in reverse if the open fails.
struct Opening {
    api: Rc<Api>,
    handle: Option<u64>,
    queue: sys::dspqueue_t,
    inited: bool,
}

impl Drop for Opening {
    fn drop(&mut self) {
        close_all(&self.api, &mut self.queue, &mut self.handle, &mut self.inited);
    }
}

fn close_all(api: &Api, queue: &mut sys::dspqueue_t, handle: &mut Option<u64>, inited: &mut bool) {
    if !queue.is_null() {
        if let Some(close) = api.queue_close {
            // SAFETY: a queue dspqueue_create returned, closed once.
            unsafe { close(*queue) };
        }
        *queue = std::ptr::null_mut();
    }
    if let (Some(h), Some(close)) = (handle.take(), api.close) {
        // SAFETY: a handle remote_handle64_open returned, closed once.
        unsafe { close(h) };
    }
    if std::mem::take(inited) {
        if let Some(deinit) = api.rpcmem_deinit {
            // SAFETY: paired with the rpcmem_init of the open.
            unsafe { deinit() };
        }
    }
}

/// Queries the DSP's attributes; refusals are noted.
pub fn dsp_info(api: &Api, domain: u32) -> DspInfo {
    let mut info = DspInfo::default();
    let Some(control) = api.handle_control else {
        info.notes.push(format!("{} has no remote_handle_control: capabilities taken from the firmware alone", api.path));
        return info;
    };
    let mut query = |attr: u32, what: &str| -> Option<u32> {
        let mut c = sys::remote_dsp_capability { domain, attribute_ID: attr, capability: 0 };
        // SAFETY: the documented request with its documented argument struct.
        let r = unsafe { control(sys::DSPRPC_GET_DSP_INFO, (&mut c as *mut sys::remote_dsp_capability).cast(), 12) };
        if r != 0 {
            info.notes.push(format!("capability query {what} failed with {r:#x} ({})", code_name(r)));
            return None;
        }
        Some(c.capability)
    };
    let arch = query(sys::ARCH_VER, "ARCH_VER");
    let hvx = query(sys::HVX_SUPPORT_128B, "HVX_SUPPORT_128B");
    let hmx = query(sys::HMX_SUPPORT_DEPTH, "HMX_SUPPORT_DEPTH");
    let page = query(sys::VTCM_PAGE, "VTCM_PAGE");
    let count = query(sys::VTCM_COUNT, "VTCM_COUNT");
    let unsigned = query(sys::UNSIGNED_PD_SUPPORT, "UNSIGNED_PD_SUPPORT");
    // ARCH_VER's low byte is the version in BCD: 0x68 is v68.
    info.arch = arch.map(|a| ((a >> 4 & 0xf) * 10 + (a & 0xf)) as u8);
    info.hvx_contexts = hvx;
    info.hmx_depth = hmx;
    info.vtcm_bytes = page.zip(count).map(|(p, c)| u64::from(p) * u64::from(c.max(1)));
    info.unsigned_pd = unsigned.map(|u| u != 0);
    info
}

impl Hexagon {
    /// Opens a session (see the module doc for the steps).
    pub fn open(cfg: &FastRpcConfig) -> Result<Hexagon, DeviceError> {
        if let Some(e) = &cfg.env_error {
            return Err(DeviceError::new("hexagon", ErrorKind::InvalidArgument, e.clone()));
        }
        let api = Rc::new(Api::load().map_err(|e| DeviceError::new("hexagon", ErrorKind::Other, e.to_string()))?);
        let name = match cfg.session {
            Some(s) => format!("hexagon (cdsp session {s}, {})", api.path),
            None => format!("hexagon (cdsp, {})", api.path),
        };
        let d = cfg.domain;
        let info = dsp_info(&api, d);
        if info.unsigned_pd == Some(false) {
            return Err(DeviceError::new(&name, ErrorKind::Unsupported, "the DSP reports no unsigned-PD support (UNSIGNED_PD_SUPPORT = 0): keel's skel cannot be loaded without a signature"));
        }
        let mut o = Opening { api: Rc::clone(&api), handle: None, queue: std::ptr::null_mut(), inited: false };
        let Some(session_control) = api.session_control else {
            return Err(DeviceError::new(&name, ErrorKind::Unsupported, format!("{} has no remote_session_control, so it cannot enable an unsigned PD: use the board's system library", api.path)));
        };
        let mut un = sys::remote_rpc_control_unsigned_module { domain: d as i32, enable: 1 };
        // SAFETY: the documented request with its documented argument struct.
        let r = unsafe { session_control(sys::DSPRPC_CONTROL_UNSIGNED_MODULE, (&mut un as *mut sys::remote_rpc_control_unsigned_module).cast(), 8) };
        if r != 0 {
            return Err(step_error(&name, ErrorKind::Unsupported, "enabling an unsigned PD (remote_session_control DSPRPC_CONTROL_UNSIGNED_MODULE)", r, "the system library or the DSP image refuses unsigned modules"));
        }
        let uri = cfg.uri();
        let c_uri = std::ffi::CString::new(uri.clone()).map_err(|_| DeviceError::new(&name, ErrorKind::InvalidArgument, "URI contains a NUL byte"))?;
        let mut h = 0u64;
        // SAFETY: a NUL-terminated URI and a place for the handle.
        let r = unsafe { (api.open.expect("checked at load"))(c_uri.as_ptr(), &mut h) };
        if r != 0 {
            let (kind, advice) = match r as u32 {
                sys::AEE_ECONNREFUSED => (ErrorKind::DeviceLost, api::node_problem().unwrap_or_else(|| "the DSP did not answer (is the CDSP running? see dmesg)".into())),
                sys::AEE_EUNSIGNEDPD_REFUSED | sys::AEE_ENOTALLOWED => {
                    (ErrorKind::Unsupported, "the DSP refused to create an unsigned PD (unsigned modules are disabled on this image, or the library is an SDK copy that cannot request one: use the system's)".into())
                }
                sys::AEE_ENOSUCHMOD => (ErrorKind::Other, format!("{} was not found: put it in a directory on DSP_LIBRARY_PATH (or ADSP_LIBRARY_PATH)", cfg.skel)),
                _ => (ErrorKind::Other, format!("check that {} is on DSP_LIBRARY_PATH and built for this DSP", cfg.skel)),
            };
            return Err(step_error(&name, kind, &format!("remote_handle64_open({uri})"), r, &advice));
        }
        o.handle = Some(h);
        if let Some(hc) = api.handle64_control {
            let mut lat = sys::remote_rpc_control_latency { enable: sys::RPC_PM_QOS, latency: 100 };
            // SAFETY: the documented request with both fields filled.
            let r = unsafe { hc(h, sys::DSPRPC_CONTROL_LATENCY, (&mut lat as *mut sys::remote_rpc_control_latency).cast(), 8) };
            if r != 0 {
                return Err(step_error(&name, ErrorKind::Other, "setting the latency (remote_handle64_control DSPRPC_CONTROL_LATENCY)", r, ""));
            }
        }
        if let Some(init) = api.rpcmem_init {
            // SAFETY: no arguments; paired with rpcmem_deinit at close.
            unsafe { init() };
            o.inited = true;
        }
        if !api.has_queues() {
            return Err(DeviceError::new(&name, ErrorKind::Unsupported, format!("{} has no dspqueue_* functions (an image from before dspqueue): keel needs them", api.path)));
        }
        let mut q: sys::dspqueue_t = std::ptr::null_mut();
        // SAFETY: no callbacks (completions are read), a place for the queue.
        let r = unsafe { (api.queue_create.unwrap())(d as i32, 0, QUEUE_BYTES, QUEUE_BYTES, None, None, std::ptr::null_mut(), &mut q) };
        if r != 0 || q.is_null() {
            return Err(step_error(&name, ErrorKind::Other, "dspqueue_create", r, "the DSP could not create the message queue (reported on some v68 images; see the README's board section)"));
        }
        o.queue = q;
        let mut id = 0u64;
        // SAFETY: a live queue.
        let r = unsafe { (api.queue_export.unwrap())(q, &mut id) };
        if r != 0 {
            return Err(step_error(&name, ErrorKind::Other, "dspqueue_export", r, ""));
        }
        let mut arg = sys::remote_arg { buf: sys::remote_buf { pv: (&mut id as *mut u64).cast(), nLen: 8 } };
        let sc = METHOD_START << sys::REMOTE_SCALARS_METHOD_SHIFT | 1 << sys::REMOTE_SCALARS_INBUFS_SHIFT;
        // SAFETY: one input buffer of 8 bytes, as the skel's `start` method takes.
        let r = unsafe { (api.invoke.unwrap())(h, sc, &mut arg) };
        if r != 0 {
            let advice = if r as u32 == sys::AEE_ENOMEMORY {
                "the skel found less than 256 KiB of VTCM free (HAP_query_avail_VTCM) or was refused it: another client holds the DSP's VTCM; stop it, or place nothing on the DSP (--device cpu)"
            } else {
                ""
            };
            return Err(step_error(&name, ErrorKind::Protocol, "the skel's start method (VTCM, HVX self-test, dspqueue_import on the DSP)", r, advice));
        }
        let mut dev = Hexagon {
            name,
            timeout: cfg.timeout,
            queue: std::mem::replace(&mut o.queue, std::ptr::null_mut()),
            bufs: HashMap::new(),
            handle: o.handle.take().unwrap_or(0),
            api: Rc::clone(&api),
            domain: d,
            identity: Identity { arch: Arch::Software, firmware_version: 0, protocol_version: 0, emulated: false },
            caps: empty_caps(),
            info,
            selftest: SelfTestReport { at_start: UnitState::Absent, seed: 0, digest: 0, expected: 0, elapsed: Duration::ZERO },
            budget: budget::Probe::default(),
            mapped_bytes: 0,
            next_seq: 1,
            flight: InFlight::default(),
            inbox: vec![0u8; MAX_MESSAGE].into_boxed_slice(),
            broken: None,
            rpcmem_inited: std::mem::take(&mut o.inited),
        };
        dev.handshake()?;
        Ok(dev)
    }

    fn handshake(&mut self) -> Result<(), DeviceError> {
        let hello = HostMsg::Hello { magic: MAGIC, protocol_version: PROTOCOL_VERSION };
        let identity = match self.call(&hello, "the handshake (HelloAck)")? {
            DeviceMsg::HelloAck { identity } => identity,
            other => return Err(self.unexpected(other, "the handshake")),
        };
        if identity.protocol_version != PROTOCOL_VERSION {
            let v = identity.protocol_version;
            return Err(self.fail(ErrorKind::Protocol, format!("protocol version mismatch: the skel speaks version {v}, the host {PROTOCOL_VERSION}")));
        }
        let mut caps = match self.call(&HostMsg::QueryCaps, "the capabilities (Caps)")? {
            DeviceMsg::Caps(c) => c,
            other => return Err(self.unexpected(other, "QueryCaps")),
        };
        if caps.memory.buffers.rounded_size(1).is_err() || caps.memory.va_budget == 0 {
            return Err(self.fail(ErrorKind::Protocol, format!("nonsense capabilities: {caps:?}")));
        }
        if let (Some(lib), Arch::Hexagon { version }) = (self.info.arch, identity.arch) {
            if lib != version {
                return Err(self.fail(ErrorKind::Unsupported, format!("the DSP is v{lib} (ARCH_VER) but the skel was built for v{version}: copy the skel built for v{lib}")));
            }
        }
        // caps.units.hvx_contexts stays the skel's: the threads it runs the products on
        // (one per HVX context it found); the chip's count is `info.hvx_contexts`.
        if self.info.hmx_depth.is_some_and(|d| d > 0) && caps.units.hmx == UnitState::Absent {
            caps.units.hmx = UnitState::Present;
        }
        let seed = fresh_seed();
        let start = Instant::now();
        let digest = match self.call(&HostMsg::SelfTest { seed }, "the self-test result")? {
            DeviceMsg::SelfTestResult { seed: s, digest } if s == seed => digest,
            other => return Err(self.unexpected(other, "SelfTest")),
        };
        let report = SelfTestReport { at_start: caps.units.hvx, seed, digest, expected: selftest::expected_digest(seed), elapsed: start.elapsed() };
        if !report.passed() {
            let w = format!(
                "self-test failed, device refused: HVX int8 matvec (seed {seed:#010x}) gave digest {digest:#010x}, expected {:#010x}; \
                 the skel's own start-up check says HVX is {:?}. The DSP accepted every call but does not compute (it may return zeros).",
                report.expected, report.at_start
            );
            return Err(self.fail(ErrorKind::BadResponse, w));
        }
        self.flight = InFlight::with_capacity(usize::from(caps.max_in_flight));
        self.identity = identity;
        self.selftest = report;
        let cap = probe_cap().map_err(|w| self.fail(ErrorKind::InvalidArgument, w))?.unwrap_or(caps.memory.va_budget);
        self.caps = caps;
        let probe = self.probe_budget(cap)?;
        if probe.measured == 0 {
            let why = match probe.refused_code {
                Some(c) => format!("fastrpc_mmap (FASTRPC_MAP_FD) failed with {c:#x} ({})", code_name(c)),
                None => format!("the probe's cap is {cap} bytes (KEEL_FASTRPC_PROBE_CAP or the skel's figure)"),
            };
            return Err(self.fail(ErrorKind::OutOfMemory, format!("the DSP session could not map even {} bytes in the address-budget probe: {why}", budget::GRANULE)));
        }
        self.caps.memory.va_budget = probe.measured;
        self.budget = probe;
        Ok(())
    }

    /// Measures the session's address budget (see [`budget`]); every probe buffer is
    /// unmapped and freed before this returns, whatever happens.
    fn probe_budget(&mut self, cap: u64) -> Result<budget::Probe, DeviceError> {
        let mut held: Vec<RpcBuf> = Vec::with_capacity(budget::MAX_STEPS);
        let r = budget::run(cap, |size| {
            let mut b = match self.new_buf(size) {
                Ok(b) => b,
                Err(e) if e.kind == ErrorKind::OutOfMemory => return Ok(budget::Step::NoHostMemory),
                Err(e) => return Err(e),
            };
            match b.map() as u32 {
                0 => {
                    held.push(b);
                    Ok(budget::Step::Mapped)
                }
                c @ (sys::AEE_EFAILED | sys::AEE_ENOMEMORY) => Ok(budget::Step::Refused(c as i32)),
                c => Err(step_error(&self.name, ErrorKind::Other, &format!("probing the DSP address budget: fastrpc_mmap of {size} bytes (FASTRPC_MAP_FD)"), c as i32, "")),
            }
        });
        // Unmapped and freed, newest first, before anything else is allocated.
        while let Some(b) = held.pop() {
            drop(b);
        }
        r
    }

    /// How the address budget was found.
    pub fn budget_probe(&self) -> &budget::Probe {
        &self.budget
    }

    /// One rpcmem allocation of `size` bytes (already rounded), not mapped.
    fn new_buf(&self, size: u64) -> Result<RpcBuf, DeviceError> {
        let ptr: *mut u8 = match (self.api.rpcmem_alloc2, self.api.rpcmem_alloc) {
            // SAFETY: the system heap with default (cached) flags; NULL on failure.
            (Some(a2), _) => unsafe { a2(sys::RPCMEM_HEAP_ID_SYSTEM as i32, sys::RPCMEM_DEFAULT_FLAGS, size as usize) }.cast(),
            (None, Some(a)) if size < 1 << 31 => unsafe { a(sys::RPCMEM_HEAP_ID_SYSTEM as i32, sys::RPCMEM_DEFAULT_FLAGS, size as i32) }.cast(),
            _ => return Err(self.err(ErrorKind::OutOfMemory, format!("{size} bytes exceed rpcmem_alloc's 2 GiB limit and {} has no rpcmem_alloc2", self.api.path))),
        };
        if ptr.is_null() {
            return Err(self.err(ErrorKind::OutOfMemory, format!("rpcmem_alloc of {size} bytes returned NULL (the dma-buf heap /dev/dma_heap/system is absent, not accessible, or full)")));
        }
        // SAFETY: a live rpcmem allocation.
        let fd = unsafe { (self.api.rpcmem_to_fd.expect("checked at load"))(ptr.cast()) };
        let b = RpcBuf { api: Rc::clone(&self.api), domain: self.domain, ptr, fd, size, mapped: false, busy: 0 };
        if fd < 0 || self.bufs.contains_key(&(fd as u32)) {
            drop(b);
            return Err(self.err(ErrorKind::Protocol, format!("rpcmem_to_fd gave {fd} for a new allocation")));
        }
        Ok(b)
    }

    /// The device's name in errors.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the capability API said.
    pub fn dsp_info(&self) -> &DspInfo {
        &self.info
    }

    /// The open-time self-test.
    pub fn self_test(&self) -> &SelfTestReport {
        &self.selftest
    }

    /// Bytes allocated to buffers now.
    pub fn allocated_bytes(&self) -> u64 {
        self.bufs.values().map(|b| b.size).sum()
    }

    /// Batches submitted and not yet collected.
    pub fn in_flight(&self) -> usize {
        self.flight.len()
    }

    fn err(&self, kind: ErrorKind, what: impl Into<String>) -> DeviceError {
        DeviceError::new(&self.name, kind, what)
    }

    /// A fatal error: the session is over; every later call returns it.
    fn fail(&mut self, kind: ErrorKind, what: impl Into<String>) -> DeviceError {
        let e = self.err(kind, what);
        self.broken.get_or_insert(e.clone());
        e
    }

    fn check(&self) -> Result<(), DeviceError> {
        match &self.broken {
            Some(e) => Err(DeviceError { what: format!("{} (earlier fault; reopen the device)", e.what), ..e.clone() }),
            None => Ok(()),
        }
    }

    fn unexpected(&mut self, got: DeviceMsg, what: &str) -> DeviceError {
        match got {
            DeviceMsg::Error { kind, detail } => self.err(kind, format!("the skel refused {what} (detail {detail})")),
            other => self.fail(ErrorKind::Protocol, format!("expected the answer to {what}, got {other:?}")),
        }
    }

    fn timeout_us(&self) -> u32 {
        u32::try_from(self.timeout.as_micros()).unwrap_or(u32::MAX - 1)
    }

    /// Writes one message with its buffer references.
    fn send(&mut self, msg: &HostMsg, refs: &mut [sys::dspqueue_buffer]) -> Result<(), DeviceError> {
        self.check()?;
        let mut buf = [0u8; MAX_MESSAGE];
        let len = wire::encode(msg, &mut buf).map_err(|k| self.err(k, "message does not fit the wire limit"))?.len();
        let write = self.api.queue_write.expect("checked at open");
        let t = self.timeout_us();
        // SAFETY: a live queue, `refs` and `buf[..len]` valid for the call.
        let r = unsafe { write(self.queue, 0, refs.len() as u32, refs.as_mut_ptr(), len as u32, buf.as_ptr(), t) };
        match r as u32 {
            0 => Ok(()),
            sys::AEE_EEXPIRED => Err(self.fail(ErrorKind::Timeout, format!("dspqueue_write failed with {r:#x} ({}): the queue stayed full for {:?}; the DSP is hung", code_name(r), self.timeout))),
            _ => Err(self.fail(ErrorKind::DeviceLost, format!("dspqueue_write failed with {r:#x} ({}): the DSP process exited or the session was closed; reopen the device", code_name(r)))),
        }
    }

    /// Reads one message, waiting up to `timeout_us` (0: only if one is there);
    /// `Ok(None)` when none came in that time.
    fn recv(&mut self, timeout_us: u32, waiting_for: &str) -> Result<Option<DeviceMsg>, DeviceError> {
        self.check()?;
        let read = self.api.queue_read.expect("checked at open");
        let (mut flags, mut n_bufs, mut len) = (0u32, 0u32, 0u32);
        let mut refs = [sys::dspqueue_buffer::default(); MAX_BUFFERS];
        // SAFETY: a live queue; every out-pointer is valid and sized as passed.
        let r = unsafe {
            read(self.queue, &mut flags, MAX_BUFFERS as u32, &mut n_bufs, refs.as_mut_ptr(), MAX_MESSAGE as u32, &mut len, self.inbox.as_mut_ptr(), timeout_us)
        };
        match r as u32 {
            0 => {}
            sys::AEE_EEXPIRED | sys::AEE_EWOULDBLOCK => return Ok(None),
            _ => {
                let what = format!("dspqueue_read failed with {r:#x} ({}) while waiting for {waiting_for}: the DSP process exited or the session was killed; reopen the device", code_name(r));
                return Err(self.fail(ErrorKind::DeviceLost, what));
            }
        }
        let n = (len as usize).min(MAX_MESSAGE);
        match wire::decode::<DeviceMsg>(&self.inbox[..n]) {
            Ok(m) => Ok(Some(m)),
            Err(_) => Err(self.fail(ErrorKind::Protocol, format!("malformed {n}-byte message while waiting for {waiting_for}"))),
        }
    }

    /// A request and its reply (control messages: nothing is in flight).
    fn call(&mut self, msg: &HostMsg, what: &str) -> Result<DeviceMsg, DeviceError> {
        self.send(msg, &mut [])?;
        let t = self.timeout_us();
        match self.recv(t, what)? {
            Some(m) => Ok(m),
            None => {
                let t = self.timeout;
                Err(self.fail(ErrorKind::Timeout, format!("no {what} within {t:?} (dspqueue_read returned AEE_EEXPIRED); the DSP is hung")))
            }
        }
    }

    fn buf(&self, id: BufferId) -> Result<&RpcBuf, DeviceError> {
        self.bufs.get(&id.0).ok_or_else(|| self.err(ErrorKind::InvalidArgument, format!("unknown buffer {}", id.0)))
    }

    /// Marks a completion's buffers free and queues it; refuses a sequence number not in flight.
    fn complete(&mut self, seq: Seq, status: BatchStatus) -> Result<(), DeviceError> {
        let (held, n) = self.flight.finish(seq, status).map_err(|w| self.fail(ErrorKind::Protocol, w))?;
        for id in &held[..n] {
            if let Some(b) = self.bufs.get_mut(id) {
                b.busy -= 1;
            }
        }
        Ok(())
    }
}

fn empty_caps() -> Caps {
    use keel_npu_hal::caps::{MemoryLimits, OpSet, Units};
    use keel_npu_hal::BufferRules;
    Caps {
        units: Units { hvx_contexts: 0, hvx: UnitState::Absent, hmx: UnitState::Absent, npu_cores: 0, npu: UnitState::Absent },
        memory: MemoryLimits { va_budget: 0, scratch_bytes: 0, buffers: BufferRules { align: 4096, granule: 4096, max_size: 0 } },
        ops: OpSet(0),
        matmul_weights: Default::default(),
        max_in_flight: 0,
        max_batch_ops: 0,
    }
}

impl Drop for Hexagon {
    fn drop(&mut self) {
        // The queue first (nothing more arrives), then every mapping and allocation, then the session.
        let mut q = std::mem::replace(&mut self.queue, std::ptr::null_mut());
        let mut none = None;
        let mut no = false;
        close_all(&self.api, &mut q, &mut none, &mut no);
        self.bufs.clear();
        let mut h = Some(self.handle);
        let mut inited = self.rpcmem_inited;
        close_all(&self.api, &mut std::ptr::null_mut(), &mut h, &mut inited);
    }
}

impl Device for Hexagon {
    fn identity(&self) -> &Identity {
        &self.identity
    }
    fn caps(&self) -> &Caps {
        &self.caps
    }
}

impl SharedBuffers for Hexagon {
    fn alloc(&mut self, size: u64) -> Result<BufferId, DeviceError> {
        self.check()?;
        let size = self.buffer_rules().rounded_size(size).map_err(|k| self.err(k, format!("cannot allocate {size} bytes")))?;
        let b = self.new_buf(size)?;
        let fd = b.fd as u32;
        self.bufs.insert(fd, b);
        Ok(BufferId(fd))
    }

    fn map(&mut self, id: BufferId) -> Result<(), DeviceError> {
        self.check()?;
        let b = self.buf(id)?;
        if b.mapped {
            return Ok(());
        }
        let size = b.size;
        let budget = self.caps.memory.va_budget;
        if self.mapped_bytes + size > budget {
            return Err(self.err(
                ErrorKind::OutOfMemory,
                format!("mapping {size} more bytes would pass the session's DSP address budget of {budget} bytes ({} MiB, measured at open; {} mapped)", budget >> 20, self.mapped_bytes),
            ));
        }
        let r = self.bufs.get_mut(&id.0).map_or(0, RpcBuf::map);
        if r != 0 {
            return Err(step_error(&self.name, ErrorKind::OutOfMemory, &format!("fastrpc_mmap of buffer {} ({size} bytes, FASTRPC_MAP_FD)", id.0), r, "the DSP could not map it"));
        }
        self.mapped_bytes += size;
        Ok(())
    }

    fn host_view(&mut self, id: BufferId) -> Result<&mut [u8], DeviceError> {
        let _ = self.poll_all()?;
        let b = self.buf(id)?;
        if b.busy > 0 {
            return Err(self.err(ErrorKind::Busy, format!("buffer {} is named by a batch in flight", id.0)));
        }
        let (ptr, size) = (b.ptr, b.size as usize);
        // SAFETY: the allocation is live while `self` is borrowed and no batch names it.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, size) })
    }

    fn free(&mut self, id: BufferId) -> Result<(), DeviceError> {
        let _ = self.poll_all()?;
        let b = self.buf(id)?;
        if b.busy > 0 {
            return Err(self.err(ErrorKind::Busy, format!("buffer {} is named by a batch in flight", id.0)));
        }
        let mut b = self.bufs.remove(&id.0).expect("looked up above");
        if b.mapped {
            self.mapped_bytes -= b.size;
        }
        let r = b.unmap();
        drop(b);
        if r != 0 {
            return Err(step_error(&self.name, ErrorKind::Other, &format!("fastrpc_munmap of buffer {}", id.0), r, "the buffer was freed anyway"));
        }
        Ok(())
    }
}

impl Hexagon {
    /// Reads every completion that has arrived into `ready`; the count read.
    fn poll_all(&mut self) -> Result<usize, DeviceError> {
        if self.broken.is_some() || self.flight.pending.is_empty() {
            return self.check().map(|_| 0);
        }
        let mut n = 0;
        while !self.flight.pending.is_empty() {
            match self.recv(0, "a batch completion")? {
                Some(DeviceMsg::BatchDone { seq, status }) => {
                    self.complete(seq, status)?;
                    n += 1;
                }
                Some(other) => return Err(self.fail(ErrorKind::Protocol, format!("unsolicited message {other:?}"))),
                None => break,
            }
        }
        Ok(n)
    }
}

impl Queue for Hexagon {
    fn submit(&mut self, batch: &Batch<'_>) -> Result<Seq, DeviceError> {
        self.check()?;
        self.flight.admit(&self.caps, batch).map_err(|(k, w)| self.err(k, w))?;
        let mut refs = [sys::dspqueue_buffer::default(); MAX_BUFFERS];
        for (slot, r) in refs.iter_mut().zip(batch.buffers) {
            let b = self.buf(r.id)?;
            if !b.mapped || r.size > b.size {
                return Err(self.err(ErrorKind::InvalidArgument, format!("buffer {} is not mapped or is smaller than {} bytes", r.id.0, r.size)));
            }
            slot.fd = b.fd as u32;
            slot.size = b.size as u32;
            slot.flags = sys::DSPQUEUE_BUFFER_FLAG_REF | sys::DSPQUEUE_BUFFER_FLAG_FLUSH_SENDER | sys::DSPQUEUE_BUFFER_FLAG_INVALIDATE_RECIPIENT;
            slot.__bindgen_anon_1.ptr = b.ptr.cast();
        }
        let seq = self.next_seq;
        let msg = BatchMsg::new(seq, batch).map_err(|k| self.err(k, "batch tables exceed the wire limits"))?;
        let n = batch.buffers.len();
        self.send(&HostMsg::SubmitBatch(msg), &mut refs[..n])?;
        self.next_seq = self.next_seq.wrapping_add(1);
        for id in self.flight.add(seq, batch) {
            if let Some(b) = self.bufs.get_mut(id) {
                b.busy += 1;
            }
        }
        Ok(seq)
    }

    fn poll(&mut self) -> Result<Option<Completion>, DeviceError> {
        self.poll_all()?;
        if let Some(c) = self.flight.ready.pop_front() {
            return Ok(Some(c));
        }
        if let Some(seq) = self.flight.overdue(self.timeout) {
            let t = self.timeout;
            return Err(self.fail(ErrorKind::Timeout, format!("batch {seq} did not complete within {t:?} (dspqueue_read kept returning AEE_EEXPIRED); the DSP is hung")));
        }
        Ok(None)
    }
}

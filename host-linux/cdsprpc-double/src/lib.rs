//! A test double of `libcdsprpc.so`: the part of the FastRPC API keel's `hexagon` device
//! calls, with the library's documented return codes, and a "DSP" that is keel's own skel
//! (`libkeel_skel.so`, the firmware crate built as a shared object) running as Hexagon
//! code under `qemu-hexagon`, loaded by `keel-dsp-shell` (a stand-in for the FastRPC
//! shell: it maps the ELF, applies its relocations and resolves its dspqueue/HAP/QuRT
//! imports against its own stand-ins), one process per opened session. Built for tests
//! only (a cdylib named `libcdsprpc.so`; point `KEEL_CDSPRPC` at it).
//!
//! - The skel is found as the library finds it: the URI's file name on
//!   `DSP_LIBRARY_PATH` (then `ADSP_LIBRARY_PATH`); with neither set, the one
//!   `dsp-firmware/ci.sh` builds for `KEEL_QEMU_CPU` (`KEEL_DSP_SKEL` overrides).
//! - rpcmem: allocations come from one memfd-backed pool the emulated DSP maps too (its
//!   path `/proc/<pid>/fd/<n>` is the shell's `--shm`), so buffers are shared without
//!   copies as dma-bufs are; `rpcmem_to_fd` gives each allocation its own fd (a `dup`).
//!   An allocation the pool cannot place gets its own memfd (sparse: nothing is committed
//!   until its pages are touched); the emulated DSP cannot reach it, so a dspqueue
//!   reference to one is refused (`AEE_EBADPARM`, said on stderr). keel's open-time budget
//!   probe only maps such buffers, it never references them.
//! - `fastrpc_mmap(FASTRPC_MAP_FD)` checks and records the mapping (the kernel's part);
//!   dspqueue references to mapped buffers reach the skel as pool addresses. The domain's
//!   session has a finite DSP address budget (`KEEL_CDSPRPC_VA_BUDGET`, bytes; default
//!   3 GiB as a v73 CDSP; `keel_double_set_va_budget`): a
//!   mapping past it fails with `AEE_EFAILED`, the code the library gives when the
//!   driver's MEM_MAP is refused.
//! - The chip: `KEEL_CDSPRPC_HVX_UNITS` 128-byte HVX contexts (default 6 on v73, 4 before)
//!   and `KEEL_CDSPRPC_VTCM` bytes of free VTCM (default 8 MiB on v69+, 4 MiB before),
//!   answered to the capability queries and given to the shell (`--hvx-units`, `--vtcm`),
//!   whose QuRT/HAP stand-ins hold the skel to them.
//! - `remote_handle64_close` relays the skel's close (method 1) before ending the process.
//! - `remote_handle64_open` needs the unsigned PD enabled first (`remote_session_control`)
//!   and starts the emulator; the skel's method 2 (`start`) is relayed to the skel, which
//!   imports the exported queue.
//! - dspqueue packets are relayed to the skel's callback; every buffer reference is checked
//!   (mapped, REF flag, size), every buffer a batch names must be referenced, and every
//!   answer must release its references (DEREF).
//!
//! Every call is appended to the file `KEEL_CDSPRPC_LOG` names (one line: the function,
//! its main arguments, `-> code`), so tests can check the order and the balance of calls.
//! Faults (`KEEL_CDSPRPC_FAULT`, or `keel_double_set_fault`): `unsigned-refused`,
//! `caps-refused`, `mmap-fail`, `queue-timeout` (batches are never answered),
//! `dsp-exit` (the DSP process dies after the first batch), `dspqueue-create`, `zeros`
//! (the skel built with an HVX unit that writes zeros).

#![allow(clippy::missing_safety_doc)]

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use keel_npu_hal::wire::{self, HostMsg, MAX_MESSAGE};

#[allow(dead_code, missing_docs, clippy::all)]
#[path = "../../src/device/fastrpc/sys.rs"]
mod sys;

const OK: c_int = 0;
const POOL_BYTES: u64 = 256 << 20;
const PAGE: u64 = 4096;
const CONTROL_WAIT: Duration = Duration::from_secs(20);
/// Bytes of a frame to or from the shell: head, 16 references of 16 bytes, a message.
const FRAME_MAX: usize = 4 + 16 * 16 + MAX_MESSAGE;

struct Session {
    domain: u32,
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    rbuf: Vec<u8>,
    stash: VecDeque<Vec<u8>>,
    dead: bool,
}

struct Alloc {
    fd: RawFd,
    off: u64,
    len: u64,
    mapped: bool,
    /// Outside the pool: its own memfd, mapped here at this address (unreachable by the DSP).
    detached: Option<*mut u8>,
}

struct Queue {
    domain: u32,
    session: Option<u64>,
}

struct State {
    fault: Option<String>,
    log: Option<std::fs::File>,
    unsigned: [bool; 5],
    sessions: HashMap<u64, Session>,
    next_handle: u64,
    pool: Option<(RawFd, *mut u8)>,
    allocs: HashMap<usize, Alloc>,
    queues: HashMap<u64, Queue>,
    next_queue: u64,
    rpcmem_depth: i64,
    va_budget: u64,
}

// SAFETY: the raw pointers are the pool's and detached allocations' mappings, only used under the mutex.
unsafe impl Send for State {}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let st = g.get_or_insert_with(|| State {
        fault: std::env::var("KEEL_CDSPRPC_FAULT").ok().filter(|v| !v.is_empty()),
        log: std::env::var_os("KEEL_CDSPRPC_LOG").and_then(|p| std::fs::OpenOptions::new().create(true).append(true).open(p).ok()),
        unsigned: [false; 5],
        sessions: HashMap::new(),
        next_handle: 1,
        pool: None,
        allocs: HashMap::new(),
        queues: HashMap::new(),
        next_queue: 1,
        rpcmem_depth: 0,
        va_budget: env("KEEL_CDSPRPC_VA_BUDGET").and_then(|v| v.trim().parse().ok()).unwrap_or(3 << 30),
    });
    f(st)
}

impl State {
    fn log(&mut self, line: std::fmt::Arguments<'_>) {
        if let Some(f) = &mut self.log {
            let _ = writeln!(f, "{line}");
        }
    }

    fn fault(&self, name: &str) -> bool {
        self.fault.as_deref() == Some(name)
    }

    fn pool(&mut self) -> Option<(RawFd, *mut u8)> {
        if self.pool.is_none() {
            // SAFETY: plain syscalls on a fresh memfd.
            unsafe {
                let fd = libc::memfd_create(c"keel-cdsprpc-pool".as_ptr(), 0);
                if fd < 0 || libc::ftruncate(fd, POOL_BYTES as i64) != 0 {
                    return None;
                }
                let p = libc::mmap(std::ptr::null_mut(), POOL_BYTES as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
                if p == libc::MAP_FAILED {
                    libc::close(fd);
                    return None;
                }
                self.pool = Some((fd, p.cast()));
            }
        }
        self.pool
    }

    /// First fit in the pool, page granular.
    fn place(&self, len: u64) -> Option<u64> {
        let mut used: Vec<(u64, u64)> = self.allocs.values().filter(|a| a.detached.is_none()).map(|a| (a.off, a.len)).collect();
        used.sort_unstable();
        let mut at = 0;
        for (off, l) in used {
            if off >= at + len {
                break;
            }
            at = at.max(off + l);
        }
        (at + len <= POOL_BYTES).then_some(at)
    }
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// A memfd of `len` bytes mapped shared, untouched (so nothing is committed); its fd and address.
fn detached(len: u64) -> Option<(RawFd, *mut u8)> {
    // SAFETY: plain syscalls on a fresh memfd.
    unsafe {
        let fd = libc::memfd_create(c"keel-cdsprpc-buf".as_ptr(), 0);
        if fd < 0 {
            return None;
        }
        if libc::ftruncate(fd, len as i64) != 0 {
            libc::close(fd);
            return None;
        }
        let p = libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
        if p == libc::MAP_FAILED {
            libc::close(fd);
            return None;
        }
        Some((fd, p.cast()))
    }
}

fn cpu() -> String {
    env("KEEL_QEMU_CPU").unwrap_or_else(|| "v68".into())
}

/// The DSP's 128-byte HVX contexts: `KEEL_CDSPRPC_HVX_UNITS`, else 6 on v73+, 4 before.
fn hvx_units() -> u32 {
    env("KEEL_CDSPRPC_HVX_UNITS").and_then(|v| v.parse().ok()).unwrap_or(if arch_number(&cpu()) >= 73 { 6 } else { 4 })
}

/// VTCM free for the skel: `KEEL_CDSPRPC_VTCM` (bytes), else 8 MiB on v69+, 4 MiB before.
fn vtcm_bytes() -> u32 {
    env("KEEL_CDSPRPC_VTCM").and_then(|v| v.parse().ok()).unwrap_or(if arch_number(&cpu()) >= 69 { 8 << 20 } else { 4 << 20 })
}

fn arch_number(cpu: &str) -> u32 {
    cpu.trim_start_matches('v').parse().unwrap_or(68)
}

fn dsp_target(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../dsp-firmware/target").join(dir).join("hexagon-unknown-none-elf/release")
}

/// The skel file `name` (from the URI), found as the library finds it; `None`: not found.
fn find_skel(name: &str, zeros: bool) -> Option<PathBuf> {
    if let Some(p) = env("KEEL_DSP_SKEL") {
        return Some(p.into());
    }
    let dirs: Vec<String> = ["DSP_LIBRARY_PATH", "ADSP_LIBRARY_PATH"].iter().filter_map(|k| env(k)).collect();
    if dirs.is_empty() {
        let dir = if zeros { format!("skel-{}-broken", cpu()) } else { format!("skel-{}", cpu()) };
        return Some(dsp_target(&dir).join(name)).filter(|p| p.is_file());
    }
    dirs.iter().flat_map(|d| d.split([';', ':']).map(str::to_owned).collect::<Vec<_>>()).map(|d| PathBuf::from(d).join(name)).find(|p| p.is_file())
}

fn shell_elf() -> PathBuf {
    env("KEEL_DSP_SHELL").map(PathBuf::from).unwrap_or_else(|| dsp_target(&cpu()).join("keel-dsp-shell"))
}

fn qemu() -> PathBuf {
    let name = env("KEEL_QEMU").unwrap_or_else(|| "qemu-hexagon".into());
    if name.contains('/') {
        return name.into();
    }
    std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join(&name)).find(|p| p.is_file()))
        .unwrap_or_else(|| name.into())
}

impl Session {
    fn start(pool_fd: RawFd, skel: &std::path::Path) -> std::io::Result<Session> {
        let cpu = cpu();
        let mut cmd = Command::new(qemu());
        cmd.args(["-cpu", &cpu]).arg(shell_elf()).arg("--shm").arg(format!("/proc/{}/fd/{pool_fd}", std::process::id()));
        cmd.arg("--skel").arg(skel).args(["--vtcm", &vtcm_bytes().to_string()]);
        cmd.args(["--hvx-units", &hvx_units().to_string()]);
        // The shell's own complaints (a skel it cannot load) with KEEL_CDSPRPC_STDERR=1.
        let err = if env("KEEL_CDSPRPC_STDERR").is_some() { Stdio::inherit() } else { Stdio::null() };
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(err).spawn()?;
        let stdin = child.stdin.take().ok_or_else(|| std::io::Error::other("no stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout"))?;
        Ok(Session { domain: sys::CDSP_DOMAIN_ID, child, stdin, stdout, rbuf: Vec::new(), stash: VecDeque::new(), dead: false })
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.dead = true;
    }

    fn write(&mut self, msg: &[u8]) -> Result<(), c_int> {
        if self.dead {
            return Err(sys::AEE_ECONNRESET as c_int);
        }
        let mut f = Vec::with_capacity(msg.len() + 4);
        f.extend_from_slice(&(msg.len() as u32).to_le_bytes());
        f.extend_from_slice(msg);
        self.stdin.write_all(&f).and_then(|_| self.stdin.flush()).map_err(|_| {
            self.dead = true;
            sys::AEE_ECONNRESET as c_int
        })
    }

    /// The next frame: `Ok(None)` at the deadline, `Err` when the process is gone.
    fn frame(&mut self, deadline: Option<Instant>) -> Result<Option<Vec<u8>>, c_int> {
        if let Some(f) = self.stash.pop_front() {
            return Ok(Some(f));
        }
        loop {
            if self.rbuf.len() >= 4 {
                let n = u32::from_le_bytes(self.rbuf[..4].try_into().unwrap()) as usize;
                if n > FRAME_MAX {
                    self.kill();
                    return Err(sys::AEE_ERPC as c_int);
                }
                if self.rbuf.len() >= 4 + n {
                    let f = self.rbuf[4..4 + n].to_vec();
                    self.rbuf.drain(..4 + n);
                    return Ok(Some(f));
                }
            }
            if self.dead {
                return Err(sys::AEE_ECONNRESET as c_int);
            }
            let wait_ms = match deadline {
                None => -1,
                Some(d) => d.saturating_duration_since(Instant::now()).as_millis().min(i32::MAX as u128) as i32,
            };
            let mut p = libc::pollfd { fd: self.stdout.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, wait_ms) };
            if r == 0 {
                return Ok(None);
            }
            let mut buf = [0u8; 16384];
            match self.stdout.read(&mut buf) {
                Ok(0) | Err(_) => {
                    self.kill();
                    return Err(sys::AEE_ECONNRESET as c_int);
                }
                Ok(n) => self.rbuf.extend_from_slice(&buf[..n]),
            }
        }
    }

    /// Relays a skel method with one 8-byte argument; its result (packets that come first are kept).
    fn invoke(&mut self, method: u32, arg: u64) -> Result<c_int, c_int> {
        let mut f = vec![0u8; 4];
        f.extend_from_slice(&method.to_le_bytes());
        f.extend_from_slice(&arg.to_le_bytes());
        self.write(&f)?;
        let deadline = Instant::now() + CONTROL_WAIT;
        let mut kept = VecDeque::new();
        let r = loop {
            match self.frame(Some(deadline)) {
                Ok(Some(f)) if f.first() == Some(&0) && f.len() == 8 => break Ok(i32::from_le_bytes(f[4..8].try_into().unwrap())),
                Ok(Some(f)) => kept.push_back(f),
                Ok(None) => break Err(sys::AEE_EEXPIRED as c_int),
                Err(e) => break Err(e),
            }
        };
        kept.append(&mut self.stash);
        self.stash = kept;
        r
    }
}

// ---- sessions -------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn remote_session_control(req: u32, data: *mut c_void, len: u32) -> c_int {
    with(|st| {
        let rc = if req == sys::DSPRPC_CONTROL_UNSIGNED_MODULE {
            if data.is_null() || len < 8 {
                sys::AEE_EBADPARM as c_int
            } else {
                // SAFETY: the caller passes the documented struct of `len` bytes.
                let u = unsafe { *(data as *const sys::remote_rpc_control_unsigned_module) };
                match u.domain {
                    -1 => {
                        st.unsigned = [u.enable != 0; 5];
                        OK
                    }
                    d @ 0..=4 => {
                        st.unsigned[d as usize] = u.enable != 0;
                        OK
                    }
                    _ => sys::AEE_EBADPARM as c_int,
                }
            }
        } else {
            sys::AEE_EUNSUPPORTED as c_int
        };
        st.log(format_args!("remote_session_control req={req} -> {rc}"));
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn remote_handle_control(req: u32, data: *mut c_void, len: u32) -> c_int {
    with(|st| {
        let rc = if req != sys::DSPRPC_GET_DSP_INFO || data.is_null() || len < 12 {
            sys::AEE_EUNSUPPORTED as c_int
        } else if st.fault("caps-refused") {
            sys::AEE_EUNSIGNEDPD_REFUSED as c_int
        } else {
            // SAFETY: the documented struct of `len` bytes.
            let c = unsafe { &mut *(data as *mut sys::remote_dsp_capability) };
            let v = arch_number(&cpu());
            let value = match c.attribute_ID {
                sys::DOMAIN_SUPPORT | sys::UNSIGNED_PD_SUPPORT => Some(1),
                sys::HVX_SUPPORT_128B => Some(hvx_units()),
                sys::VTCM_PAGE => Some(vtcm_bytes()),
                sys::VTCM_COUNT => Some(1),
                sys::ARCH_VER => Some((v / 10) << 4 | v % 10),
                sys::HMX_SUPPORT_DEPTH | sys::HMX_SUPPORT_SPATIAL => Some(u32::from(v >= 73)),
                _ => None,
            };
            match (c.domain, value) {
                (sys::CDSP_DOMAIN_ID, Some(x)) => {
                    c.capability = x;
                    OK
                }
                _ => sys::AEE_EBADPARM as c_int,
            }
        };
        st.log(format_args!("remote_handle_control req={req} -> {rc}"));
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn remote_handle64_open(uri: *const c_char, h: *mut u64) -> c_int {
    with(|st| {
        // SAFETY: the caller passes a NUL-terminated URI.
        let uri = if uri.is_null() { String::new() } else { unsafe { CStr::from_ptr(uri) }.to_string_lossy().into_owned() };
        let rc = (|| {
            if h.is_null() || !uri.starts_with("file:///") || !uri.contains("_handle_invoke") {
                return sys::AEE_EBADPARM as c_int;
            }
            if !uri.contains("_dom=cdsp") {
                return sys::AEE_EUNSUPPORTED as c_int;
            }
            if !st.unsigned[sys::CDSP_DOMAIN_ID as usize] {
                // A signed PD was asked for, and keel's skel is not signed.
                return sys::AEE_ENOTALLOWED as c_int;
            }
            if st.fault("unsigned-refused") {
                return sys::AEE_EUNSIGNEDPD_REFUSED as c_int;
            }
            let name = uri.trim_start_matches("file:///").split('?').next().unwrap_or_default().to_string();
            let Some(skel) = find_skel(&name, st.fault("zeros")) else { return sys::AEE_ENOSUCHMOD as c_int };
            let Some((pool_fd, _)) = st.pool() else { return sys::AEE_ENOMEMORY as c_int };
            let Ok(s) = Session::start(pool_fd, &skel) else { return sys::AEE_ECONNREFUSED as c_int };
            let id = st.next_handle;
            st.next_handle += 1;
            st.sessions.insert(id, s);
            // SAFETY: checked non-null.
            unsafe { *h = id };
            OK
        })();
        st.log(format_args!("remote_handle64_open {uri} -> {rc}"));
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn remote_handle64_invoke(h: u64, sc: u32, args: *mut sys::remote_arg) -> c_int {
    with(|st| {
        let method = sc >> sys::REMOTE_SCALARS_METHOD_SHIFT & 0x1f;
        let ins = sc >> sys::REMOTE_SCALARS_INBUFS_SHIFT & 0xff;
        let rc = (|| {
            if !st.sessions.contains_key(&h) {
                return sys::AEE_EBADPARM as c_int;
            }
            if method != 2 || ins != 1 || args.is_null() {
                return sys::AEE_EUNSUPPORTED as c_int;
            }
            // SAFETY: one input buffer, as the scalars say.
            let b = unsafe { (*args).buf };
            if b.nLen != 8 || b.pv.is_null() {
                return sys::AEE_EBADPARM as c_int;
            }
            // SAFETY: 8 readable bytes.
            let qid = unsafe { *(b.pv as *const u64) };
            if !st.queues.get(&qid).is_some_and(|q| q.session.is_none()) {
                return sys::AEE_EBADPARM as c_int;
            }
            let r = match st.sessions.get_mut(&h).map(|s| s.invoke(2, qid)) {
                Some(Ok(r)) | Some(Err(r)) => r,
                None => sys::AEE_EBADPARM as c_int,
            };
            if r == OK {
                st.queues.get_mut(&qid).unwrap().session = Some(h);
            }
            r
        })();
        st.log(format_args!("remote_handle64_invoke h={h} method={method} -> {rc}"));
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn remote_handle64_close(h: u64) -> c_int {
    with(|st| {
        let rc = match st.sessions.remove(&h) {
            Some(mut s) => {
                // The skel's close (method 1) runs first, as on the DSP: it ends and joins
                // its worker threads and gives its VTCM back (the shell checks no thread is
                // left); then the process (the PD) ends.
                let r = if s.dead { OK } else { s.invoke(1, 0).unwrap_or_else(|e| e) };
                s.kill();
                st.queues.values_mut().filter(|q| q.session == Some(h)).for_each(|q| q.session = None);
                r
            }
            None => sys::AEE_EBADPARM as c_int,
        };
        st.log(format_args!("remote_handle64_close h={h} -> {rc}"));
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn remote_handle64_control(h: u64, req: u32, data: *mut c_void, len: u32) -> c_int {
    with(|st| {
        let rc = if !st.sessions.contains_key(&h) {
            sys::AEE_EBADPARM as c_int
        } else if req == sys::DSPRPC_CONTROL_LATENCY && !data.is_null() && len >= 8 {
            OK
        } else {
            sys::AEE_EUNSUPPORTED as c_int
        };
        st.log(format_args!("remote_handle64_control h={h} req={req} -> {rc}"));
        rc
    })
}

// ---- rpcmem and mappings ----------------------------------------------------------

#[no_mangle]
pub extern "C" fn rpcmem_init() {
    with(|st| {
        st.rpcmem_depth += 1;
        st.log(format_args!("rpcmem_init"));
    })
}

#[no_mangle]
pub extern "C" fn rpcmem_deinit() {
    with(|st| {
        st.rpcmem_depth -= 1;
        st.log(format_args!("rpcmem_deinit"));
    })
}

#[no_mangle]
pub extern "C" fn rpcmem_alloc(heap: c_int, flags: u32, size: c_int) -> *mut c_void {
    if size <= 0 {
        return std::ptr::null_mut();
    }
    rpcmem_alloc2(heap, flags, size as usize)
}

#[no_mangle]
pub extern "C" fn rpcmem_alloc2(heap: c_int, flags: u32, size: usize) -> *mut c_void {
    with(|st| {
        let p = (|| {
            if heap != sys::RPCMEM_HEAP_ID_SYSTEM as c_int || size == 0 {
                return std::ptr::null_mut();
            }
            let len = (size as u64).div_ceil(PAGE) * PAGE;
            let Some((pool_fd, base)) = st.pool() else { return std::ptr::null_mut() };
            let Some(off) = st.place(len) else {
                let Some((fd, p)) = detached(len) else { return std::ptr::null_mut() };
                st.allocs.insert(p as usize, Alloc { fd, off: u64::MAX, len, mapped: false, detached: Some(p) });
                return p.cast();
            };
            // SAFETY: a valid fd.
            let fd = unsafe { libc::dup(pool_fd) };
            if fd < 0 {
                return std::ptr::null_mut();
            }
            // SAFETY: `off + len` lies inside the pool mapping.
            let p = unsafe { base.add(off as usize) };
            st.allocs.insert(p as usize, Alloc { fd, off, len, mapped: false, detached: None });
            p.cast()
        })();
        let fd = st.allocs.get(&(p as usize)).map_or(-1, |a| a.fd);
        st.log(format_args!("rpcmem_alloc size={size} flags={flags} -> fd={fd}"));
        p
    })
}

#[no_mangle]
pub extern "C" fn rpcmem_free(p: *mut c_void) {
    with(|st| {
        let what = match st.allocs.remove(&(p as usize)) {
            Some(a) => {
                // SAFETY: the allocation's own fd, and its own mapping when detached.
                unsafe {
                    if let Some(p) = a.detached {
                        libc::munmap(p.cast(), a.len as usize);
                    }
                    libc::close(a.fd)
                };
                format!("fd={}{}", a.fd, if a.mapped { " STILL-MAPPED" } else { "" })
            }
            None => "UNKNOWN".into(),
        };
        st.log(format_args!("rpcmem_free {what}"));
    })
}

#[no_mangle]
pub extern "C" fn rpcmem_to_fd(p: *mut c_void) -> c_int {
    with(|st| st.allocs.get(&(p as usize)).map_or(-1, |a| a.fd))
}

#[no_mangle]
pub unsafe extern "C" fn fastrpc_mmap(domain: c_int, fd: c_int, addr: *mut c_void, offset: c_int, len: usize, flags: c_int) -> c_int {
    with(|st| {
        let rc = (|| {
            if st.fault("mmap-fail") {
                return sys::AEE_ENOMEMORY as c_int;
            }
            if flags != sys::FASTRPC_MAP_FD as c_int || offset != 0 || len == 0 || len as u64 % PAGE != 0 {
                return sys::AEE_EBADPARM as c_int;
            }
            let Some((&key, a)) = st.allocs.iter().find(|(_, a)| a.fd == fd) else { return sys::AEE_EINVALIDFD as c_int };
            if key != addr as usize || len as u64 > a.len || a.mapped {
                return sys::AEE_EBADPARM as c_int;
            }
            if !st.sessions.values().any(|s| s.domain == domain as u32 && !s.dead) {
                return sys::AEE_EBADSTATE as c_int;
            }
            // The session's DSP address space: the library reports a refused MEM_MAP as AEE_EFAILED.
            let mapped: u64 = st.allocs.values().filter(|a| a.mapped).map(|a| a.len).sum();
            if mapped + len as u64 > st.va_budget {
                return sys::AEE_EFAILED as c_int;
            }
            st.allocs.get_mut(&key).unwrap().mapped = true;
            OK
        })();
        st.log(format_args!("fastrpc_mmap fd={fd} len={len} flags={flags} -> {rc}"));
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn fastrpc_munmap(domain: c_int, fd: c_int, addr: *mut c_void, len: usize) -> c_int {
    with(|st| {
        let rc = (|| {
            let Some((&key, a)) = st.allocs.iter().find(|(_, a)| a.fd == fd) else { return sys::AEE_EINVALIDFD as c_int };
            if !a.mapped || key != addr as usize || len as u64 > a.len {
                return sys::AEE_ENOSUCHMAP as c_int;
            }
            let _ = domain;
            st.allocs.get_mut(&key).unwrap().mapped = false;
            OK
        })();
        st.log(format_args!("fastrpc_munmap fd={fd} len={len} -> {rc}"));
        rc
    })
}

// ---- dspqueue ---------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn dspqueue_create(
    domain: c_int,
    _flags: u32,
    _req: u32,
    _rsp: u32,
    packet_cb: sys::dspqueue_callback_t,
    error_cb: sys::dspqueue_callback_t,
    _ctx: *mut c_void,
    q: *mut sys::dspqueue_t,
) -> c_int {
    with(|st| {
        let rc = (|| {
            if st.fault("dspqueue-create") {
                return sys::AEE_EUNSUPPORTED as c_int;
            }
            if q.is_null() || domain as u32 != sys::CDSP_DOMAIN_ID {
                return sys::AEE_EBADPARM as c_int;
            }
            if packet_cb.is_some() || error_cb.is_some() {
                // This double reads completions only by dspqueue_read.
                return sys::AEE_EUNSUPPORTED as c_int;
            }
            if !st.sessions.values().any(|s| s.domain == domain as u32) {
                return sys::AEE_EBADSTATE as c_int;
            }
            let id = st.next_queue;
            st.next_queue += 1;
            st.queues.insert(id, Queue { domain: domain as u32, session: None });
            // SAFETY: checked non-null; the handle is the queue's number.
            unsafe { *q = (id << 4) as sys::dspqueue_t };
            OK
        })();
        st.log(format_args!("dspqueue_create -> {rc}"));
        rc
    })
}

fn queue_id(q: sys::dspqueue_t) -> u64 {
    q as u64 >> 4
}

#[no_mangle]
pub unsafe extern "C" fn dspqueue_export(q: sys::dspqueue_t, id: *mut u64) -> c_int {
    with(|st| {
        let rc = if st.queues.contains_key(&queue_id(q)) && !id.is_null() {
            // SAFETY: checked non-null.
            unsafe { *id = queue_id(q) };
            OK
        } else {
            sys::AEE_EBADPARM as c_int
        };
        st.log(format_args!("dspqueue_export q={} -> {rc}", queue_id(q)));
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn dspqueue_close(q: sys::dspqueue_t) -> c_int {
    with(|st| {
        let rc = if st.queues.remove(&queue_id(q)).is_some() { OK } else { sys::AEE_EBADPARM as c_int };
        st.log(format_args!("dspqueue_close q={} -> {rc}", queue_id(q)));
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn dspqueue_write(
    q: sys::dspqueue_t,
    _flags: u32,
    n_bufs: u32,
    bufs: *mut sys::dspqueue_buffer,
    len: u32,
    msg: *const u8,
    _timeout_us: u32,
) -> c_int {
    with(|st| {
        let mut batch = false;
        let rc = (|| {
            let Some(Queue { session: Some(h), domain }) = st.queues.get(&queue_id(q)) else { return sys::AEE_EBADSTATE as c_int };
            let (h, _domain) = (*h, *domain);
            if (n_bufs > 0 && bufs.is_null()) || msg.is_null() || len as usize > MAX_MESSAGE {
                return sys::AEE_EBADPARM as c_int;
            }
            // SAFETY: the caller passes `n_bufs` descriptors and `len` bytes.
            let refs = if n_bufs == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(bufs, n_bufs as usize) } };
            let bytes = unsafe { std::slice::from_raw_parts(msg, len as usize) };
            let mut frame = vec![1u8, refs.len() as u8, 0, 0];
            for r in refs {
                let Some(a) = st.allocs.values().find(|a| a.fd == r.fd as c_int && a.mapped && u64::from(r.size) <= a.len) else {
                    return sys::AEE_EBADPARM as c_int;
                };
                if a.detached.is_some() {
                    eprintln!("libcdsprpc double: buffer fd {} lies outside the {POOL_BYTES}-byte pool the emulated DSP maps", r.fd);
                    return sys::AEE_EBADPARM as c_int;
                }
                if r.flags & sys::DSPQUEUE_BUFFER_FLAG_REF == 0 {
                    return sys::AEE_EBADPARM as c_int;
                }
                for v in [r.fd, r.size, a.off as u32, r.flags] {
                    frame.extend_from_slice(&v.to_le_bytes());
                }
            }
            frame.extend_from_slice(bytes);
            if let Ok(HostMsg::SubmitBatch(m)) = wire::decode::<HostMsg>(bytes) {
                batch = true;
                if m.buffers.iter().any(|b| !refs.iter().any(|r| r.fd == b.id.0)) {
                    return sys::AEE_EBADPARM as c_int;
                }
            }
            let exit = batch && st.fault("dsp-exit");
            let swallow = batch && st.fault("queue-timeout");
            let Some(s) = st.sessions.get_mut(&h) else { return sys::AEE_ECONNRESET as c_int };
            if s.dead {
                return sys::AEE_ECONNRESET as c_int;
            }
            if swallow {
                return OK; // taken, never answered: the DSP hangs on it
            }
            if let Err(e) = s.write(&frame) {
                return e;
            }
            if exit {
                s.kill();
            }
            OK
        })();
        st.log(format_args!("dspqueue_write q={} bufs={n_bufs} len={len}{} -> {rc}", queue_id(q), if batch { " batch" } else { "" }));
        rc
    })
}

#[no_mangle]
pub unsafe extern "C" fn dspqueue_read(
    q: sys::dspqueue_t,
    flags: *mut u32,
    _max_bufs: u32,
    n_bufs: *mut u32,
    _bufs: *mut sys::dspqueue_buffer,
    max_len: u32,
    len: *mut u32,
    msg: *mut u8,
    timeout_us: u32,
) -> c_int {
    with(|st| {
        let rc = (|| {
            let Some(Queue { session: Some(h), .. }) = st.queues.get(&queue_id(q)) else { return sys::AEE_EBADSTATE as c_int };
            let h = *h;
            let Some(s) = st.sessions.get_mut(&h) else { return sys::AEE_ECONNRESET as c_int };
            let deadline = (timeout_us != sys::DSPQUEUE_TIMEOUT_NONE).then(|| Instant::now() + Duration::from_micros(u64::from(timeout_us)));
            match s.frame(deadline) {
                Ok(None) => sys::AEE_EEXPIRED as c_int,
                Err(e) => e,
                Ok(Some(f)) => {
                    let n = usize::from(f.get(1).copied().unwrap_or(0));
                    let body = 4 + 16 * n;
                    if f.first() != Some(&1) || f.len() < body {
                        eprintln!("libcdsprpc double: not a packet from the skel: {:02x?}", &f[..f.len().min(16)]);
                        return sys::AEE_ERPC as c_int;
                    }
                    // The skel must release every reference it was given.
                    if (0..n).any(|i| u32::from_le_bytes(f[4 + 16 * i + 12..][..4].try_into().unwrap()) & sys::DSPQUEUE_BUFFER_FLAG_DEREF == 0) {
                        eprintln!("libcdsprpc double: the skel's answer keeps a buffer reference (no DEREF)");
                        return sys::AEE_ERPC as c_int;
                    }
                    let m = &f[body..];
                    if m.len() > max_len as usize {
                        return sys::AEE_EBADPARM as c_int;
                    }
                    // SAFETY: the caller's buffers, `max_len` bytes and one word each.
                    unsafe {
                        std::ptr::copy_nonoverlapping(m.as_ptr(), msg, m.len());
                        *len = m.len() as u32;
                        *n_bufs = 0;
                        *flags = 0;
                    }
                    OK
                }
            }
        })();
        // Empty polls are not logged: a run makes thousands.
        if rc != sys::AEE_EEXPIRED as c_int || timeout_us != 0 {
            st.log(format_args!("dspqueue_read q={} timeout_us={timeout_us} -> {rc}", queue_id(q)));
        }
        rc
    })
}

// ---- test hooks -------------------------------------------------------------------

/// Sets (or, with NULL or "", clears) the fault mode for what follows.
#[no_mangle]
pub unsafe extern "C" fn keel_double_set_fault(name: *const c_char) {
    // SAFETY: NULL or a NUL-terminated string.
    let f = if name.is_null() { None } else { Some(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()) };
    with(|st| st.fault = f.filter(|s| !s.is_empty()));
}

/// Sets the session's DSP address budget, bytes (as `KEEL_CDSPRPC_VA_BUDGET`).
#[no_mangle]
pub extern "C" fn keel_double_set_va_budget(bytes: u64) {
    with(|st| st.va_budget = bytes);
}

/// What is alive now: sessions, queues, allocations, mappings, rpcmem_init depth.
#[no_mangle]
pub unsafe extern "C" fn keel_double_live(out: *mut u64) {
    with(|st| {
        let v = [
            st.sessions.len() as u64,
            st.queues.len() as u64,
            st.allocs.len() as u64,
            st.allocs.values().filter(|a| a.mapped).count() as u64,
            st.rpcmem_depth as u64,
        ];
        // SAFETY: the caller passes room for 5 words.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, 5) };
    })
}

/// Kills the DSP process of every session (as a DSP crash would).
#[no_mangle]
pub extern "C" fn keel_double_kill_dsp() {
    with(|st| st.sessions.values_mut().for_each(Session::kill));
}

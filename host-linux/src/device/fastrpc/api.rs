//! `libcdsprpc.so` opened at run time: the library found (`KEEL_CDSPRPC`, else the
//! loader's search for `libcdsprpc.so` then `libcdsprpc.so.1`), each function keel calls
//! resolved by name into the pointer types of [`super::sys`] (bindgen's output of
//! `cdsprpc.h`). Functions old images lack (`rpcmem_alloc2`, `rpcmem_init/deinit`,
//! `remote_session_control`, `remote_handle_control`, `remote_handle64_control`, the
//! `dspqueue_*` family) are optional: absent is `None`, and the step that needs one says
//! so. The library stays loaded as long as this value lives.

use std::path::PathBuf;

use super::sys;

/// What the library could not give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// dlopen failed for every name tried.
    NotFound {
        /// The names tried, in order.
        tried: Vec<String>,
        /// The loader's last message.
        why: String,
    },
    /// This keel is a static musl build: it cannot dlopen anything.
    StaticBuild,
    /// A required function is missing.
    Missing {
        /// The library.
        path: String,
        /// The function.
        symbol: &'static str,
    },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::NotFound { tried, why } => write!(
                f,
                "the FastRPC library libcdsprpc.so cannot be loaded (tried {}: {why}); install the board's FastRPC user \
                 library (Qualcomm Linux/Ubuntu images ship /usr/lib/libcdsprpc.so.1, Android has /vendor/lib64/libcdsprpc.so) \
                 or point KEEL_CDSPRPC at it",
                tried.join(", ")
            ),
            LoadError::StaticBuild => write!(
                f,
                "this keel is a static musl build, which cannot dlopen libcdsprpc.so: the `hexagon` device needs the \
                 dynamically linked build (x86_64- or aarch64-unknown-linux-gnu; see the README, \"Running on a Snapdragon or QCS6490 board\")"
            ),
            LoadError::Missing { path, symbol } => {
                write!(f, "{path} has no `{symbol}`: this is not a usable libcdsprpc (update the board's FastRPC library)")
            }
        }
    }
}

/// The library names tried: `KEEL_CDSPRPC` alone when set, else the system's.
pub fn candidates() -> Vec<String> {
    match std::env::var("KEEL_CDSPRPC").ok().filter(|v| !v.is_empty()) {
        Some(p) => vec![p],
        None => vec!["libcdsprpc.so".into(), "libcdsprpc.so.1".into()],
    }
}

/// The resolved functions, one field per C function of the same name (`None`: absent).
#[allow(missing_docs)]
pub struct Api {
    /// Where it was loaded from.
    pub path: String,
    pub session_control: sys::keel_remote_session_control_fn,
    pub handle_control: sys::keel_remote_handle_control_fn,
    pub open: sys::keel_remote_handle64_open_fn,
    pub invoke: sys::keel_remote_handle64_invoke_fn,
    pub close: sys::keel_remote_handle64_close_fn,
    pub handle64_control: sys::keel_remote_handle64_control_fn,
    pub rpcmem_init: sys::keel_rpcmem_init_fn,
    pub rpcmem_deinit: sys::keel_rpcmem_deinit_fn,
    pub rpcmem_alloc: sys::keel_rpcmem_alloc_fn,
    pub rpcmem_alloc2: sys::keel_rpcmem_alloc2_fn,
    pub rpcmem_free: sys::keel_rpcmem_free_fn,
    pub rpcmem_to_fd: sys::keel_rpcmem_to_fd_fn,
    pub mmap: sys::keel_fastrpc_mmap_fn,
    pub munmap: sys::keel_fastrpc_munmap_fn,
    pub queue_create: sys::keel_dspqueue_create_fn,
    pub queue_close: sys::keel_dspqueue_close_fn,
    pub queue_export: sys::keel_dspqueue_export_fn,
    pub queue_write: sys::keel_dspqueue_write_fn,
    pub queue_read: sys::keel_dspqueue_read_fn,
    // Last: the functions above point into it.
    _lib: Lib,
}

/// The loaded library. musl builds (static) cannot dlopen and do not link libdl: there it
/// is a type with no values, and [`Api::load`] says why.
#[cfg(not(target_env = "musl"))]
type Lib = libloading::Library;
#[cfg(target_env = "musl")]
enum Lib {}

/// Resolves `name` as pointer type `T` (an `Option<fn>`: `None` when absent).
#[cfg(not(target_env = "musl"))]
fn sym<T: Copy + Default>(lib: &Lib, name: &str) -> T {
    let mut z = Vec::with_capacity(name.len() + 1);
    z.extend_from_slice(name.as_bytes());
    z.push(0);
    // SAFETY: `T` is one of bindgen's `Option<unsafe extern "C" fn>` types, declared in
    // cdsprpc.h with the library's public prototype; a pointer-sized value.
    unsafe { lib.get::<T>(&z).map(|s| *s).unwrap_or_default() }
}

impl Api {
    /// Loads the library and resolves its functions.
    pub fn load() -> Result<Api, LoadError> {
        let tried = candidates();
        #[cfg(target_env = "musl")]
        {
            let _ = tried;
            Err(LoadError::StaticBuild)
        }
        #[cfg(not(target_env = "musl"))]
        {
        let mut why = String::new();
        for name in &tried {
            // SAFETY: loading runs the library's initialisers; libcdsprpc's only set up its state.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Api::resolve(lib, name.clone()),
                Err(e) => why = e.to_string(),
            }
        }
        Err(LoadError::NotFound { tried, why })
        }
    }

    #[cfg(not(target_env = "musl"))]
    fn resolve(lib: Lib, path: String) -> Result<Api, LoadError> {
        let api = Api {
            session_control: sym(&lib, "remote_session_control"),
            handle_control: sym(&lib, "remote_handle_control"),
            open: sym(&lib, "remote_handle64_open"),
            invoke: sym(&lib, "remote_handle64_invoke"),
            close: sym(&lib, "remote_handle64_close"),
            handle64_control: sym(&lib, "remote_handle64_control"),
            rpcmem_init: sym(&lib, "rpcmem_init"),
            rpcmem_deinit: sym(&lib, "rpcmem_deinit"),
            rpcmem_alloc: sym(&lib, "rpcmem_alloc"),
            rpcmem_alloc2: sym(&lib, "rpcmem_alloc2"),
            rpcmem_free: sym(&lib, "rpcmem_free"),
            rpcmem_to_fd: sym(&lib, "rpcmem_to_fd"),
            mmap: sym(&lib, "fastrpc_mmap"),
            munmap: sym(&lib, "fastrpc_munmap"),
            queue_create: sym(&lib, "dspqueue_create"),
            queue_close: sym(&lib, "dspqueue_close"),
            queue_export: sym(&lib, "dspqueue_export"),
            queue_write: sym(&lib, "dspqueue_write"),
            queue_read: sym(&lib, "dspqueue_read"),
            path,
            _lib: lib,
        };
        let required: [(&'static str, bool); 8] = [
            ("remote_handle64_open", api.open.is_some()),
            ("remote_handle64_invoke", api.invoke.is_some()),
            ("remote_handle64_close", api.close.is_some()),
            ("rpcmem_alloc", api.rpcmem_alloc.is_some() || api.rpcmem_alloc2.is_some()),
            ("rpcmem_free", api.rpcmem_free.is_some()),
            ("rpcmem_to_fd", api.rpcmem_to_fd.is_some()),
            ("fastrpc_mmap", api.mmap.is_some()),
            ("fastrpc_munmap", api.munmap.is_some()),
        ];
        if let Some((symbol, _)) = required.iter().find(|(_, ok)| !ok) {
            return Err(LoadError::Missing { path: api.path.clone(), symbol });
        }
        Ok(api)
    }

    /// Whether the whole dspqueue family is there (images before ~2021 lack it).
    pub fn has_queues(&self) -> bool {
        self.queue_create.is_some() && self.queue_close.is_some() && self.queue_export.is_some() && self.queue_write.is_some() && self.queue_read.is_some()
    }
}

/// Device nodes a CDSP session goes through, as a board has them.
pub const NODES: [&str; 2] = ["/dev/fastrpc-cdsp", "/dev/fastrpc-cdsp-secure"];

/// What is wrong with the device nodes, said so a user can act, or `None` when one can be opened.
pub fn node_problem() -> Option<String> {
    let present: Vec<PathBuf> = NODES.iter().map(PathBuf::from).filter(|p| p.exists()).collect();
    if present.is_empty() {
        return Some(format!(
            "no FastRPC device node ({}): this machine has no CDSP, or the kernel's fastrpc driver is not loaded \
             (`modprobe fastrpc`; the board's device tree must enable the CDSP)",
            NODES.join(", ")
        ));
    }
    let denied: Vec<String> = present.iter().filter(|p| std::fs::OpenOptions::new().read(true).write(true).open(p).is_err()).map(|p| p.display().to_string()).collect();
    if denied.len() == present.len() {
        return Some(format!(
            "{} exists but cannot be opened by this user: add the user to the group owning it (`ls -l {}`; often `fastrpc` or `render`) \
             or install a udev rule giving it mode 0660",
            denied.join(", "),
            denied[0]
        ));
    }
    None
}

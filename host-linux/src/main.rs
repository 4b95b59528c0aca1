//! The `keel` binary.

use std::io::Write;

fn main() {
    keel_host_linux::fault::install();
    let result = keel_host_linux::cli::main_os(std::env::args_os().skip(1));
    if let Err(e) = result {
        let _ = writeln!(std::io::stderr(), "error: {e:#}");
        // A device that is not there (keel probe --device rknpu off the board) exits 2.
        std::process::exit(if e.downcast_ref::<keel_host_linux::cli::rknpu::Unavailable>().is_some() { 2 } else { 1 });
    }
}

//! The `keel` binary.

use std::io::Write;

fn main() {
    keel_host_linux::fault::install();
    let result = keel_host_linux::cli::main_os(std::env::args_os().skip(1));
    if let Err(e) = result {
        let _ = writeln!(std::io::stderr(), "error: {e:#}");
        std::process::exit(1);
    }
}

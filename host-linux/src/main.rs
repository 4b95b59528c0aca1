//! The `keel` binary.

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = keel_host_linux::cli::main(argv) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

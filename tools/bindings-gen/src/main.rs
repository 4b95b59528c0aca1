//! `keel-bindings-gen [--write | --check] [NAME…]`: regenerate (or check) the committed
//! bindings listed in `keel_bindings_gen::BINDINGS`.
use keel_bindings_gen::{check, generate, repo_root, BINDINGS};

fn main() {
    let mut write = false;
    let mut names = Vec::new();
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--write" => write = true,
            "--check" => write = false,
            "-h" | "--help" => {
                println!("usage: keel-bindings-gen [--write | --check] [NAME...]\n\n\
                          --check (default): compare each committed binding with what its header gives now\n\
                          --write: regenerate the committed files\n\nbindings:");
                for b in BINDINGS {
                    println!("  {:<12} {} -> {}", b.name, b.header, b.output);
                }
                return;
            }
            s if s.starts_with('-') => {
                eprintln!("keel-bindings-gen: unknown flag {s} (see --help)");
                std::process::exit(1);
            }
            s => names.push(s.to_string()),
        }
    }
    let mut failed = false;
    for b in BINDINGS.iter().filter(|b| names.is_empty() || names.iter().any(|n| n == b.name)) {
        if !write {
            match check(b) {
                Ok(()) => println!("{}: up to date", b.output),
                Err(e) => {
                    eprintln!("keel-bindings-gen: {e}");
                    failed = true;
                }
            }
            continue;
        }
        let text = match generate(b) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("keel-bindings-gen: {e}");
                std::process::exit(1);
            }
        };
        let path = repo_root().join(b.output);
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("keel-bindings-gen: writing {}: {e}", path.display());
            std::process::exit(1);
        }
        println!("wrote {}", b.output);
    }
    if failed {
        std::process::exit(1);
    }
}

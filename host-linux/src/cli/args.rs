//! What keel checks of the raw arguments before `clap` parses them: UTF-8 (an error naming
//! the argument), llama.cpp's multi-letter single-dash spellings (`-ngl`, `-dev`), and a
//! flag given twice (an error naming the flag as it was typed).

use anyhow::{bail, Result};

/// The process arguments as UTF-8 strings; a byte sequence that is not UTF-8 (e.g. a
/// file name in another encoding) is an error naming the argument, not a panic.
pub fn from_os(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Vec<String>> {
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            a.into_string().map_err(|a| {
                anyhow::anyhow!("argument {} ({:?}) is not valid UTF-8; keel takes UTF-8 arguments: rename the file or pass the text in a file with -f", i + 1, a.to_string_lossy())
            })
        })
        .collect()
}

/// llama.cpp's single-dash spellings of long flags, which `clap` cannot declare (a short
/// flag is one letter): each is read as the long flag beside it. Help texts name them.
pub const LLAMA_SPELLINGS: &[(&str, &str)] = &[("-ngl", "--n-gpu-layers"), ("-dev", "--device"), ("-md", "--draft-model"), ("-devd", "--device-draft"), ("-ts", "--tensor-split")];

/// `argv` (after the program name) with [`LLAMA_SPELLINGS`] rewritten to their long flags.
pub fn llama_spellings(argv: Vec<String>) -> Vec<String> {
    argv.into_iter().map(|a| LLAMA_SPELLINGS.iter().find(|(s, _)| *s == a).map_or(a, |(_, l)| l.to_string())).collect()
}

/// Fails when a flag of the subcommand `argv[0]` that takes one value (or none) is given
/// twice, naming it as typed: `-n given twice; give it once` (clap would take the last
/// or say it "cannot be used multiple times"; keel's message names the fix).
pub fn refuse_repeats(cmd: &clap::Command, argv: &[String]) -> Result<()> {
    let Some(sub) = argv.first().and_then(|name| cmd.find_subcommand(name)) else { return Ok(()) };
    // (spelling, arg id, takes a value, may repeat)
    let mut spellings: Vec<(String, &str, bool, bool)> = Vec::new();
    for a in sub.get_arguments() {
        let takes = a.get_action().takes_values();
        let repeats = matches!(a.get_action(), clap::ArgAction::Append | clap::ArgAction::Count);
        let id = a.get_id().as_str();
        for s in a.get_short_and_visible_aliases().unwrap_or_default() {
            spellings.push((format!("-{s}"), id, takes, repeats));
        }
        for l in a.get_long_and_visible_aliases().unwrap_or_default() {
            spellings.push((format!("--{l}"), id, takes, repeats));
        }
    }
    let mut seen: Vec<&str> = Vec::new();
    let mut i = 1;
    while i < argv.len() {
        let tok = argv[i].as_str();
        if tok == "--" {
            break;
        }
        let (name, inline) = match tok.split_once('=') {
            Some((n, _)) if n.starts_with("--") => (n, true),
            _ => (tok, false),
        };
        if let Some((_, id, takes, repeats)) = spellings.iter().find(|(s, ..)| s == name) {
            if !repeats && seen.contains(id) {
                bail!("{name} given twice; give it once");
            }
            seen.push(id);
            if *takes && !inline {
                i += 1;
            }
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn repeats_are_named_as_typed() {
        let cmd = crate::cli::command();
        let e = refuse_repeats(&cmd, &argv("run -n 1 --json -n 2")).unwrap_err();
        assert_eq!(e.to_string(), "-n given twice; give it once");
        let e = refuse_repeats(&cmd, &argv("run --json -p x --json")).unwrap_err();
        assert_eq!(e.to_string(), "--json given twice; give it once");
        // -n and --n-predict are one flag; a value that looks like a flag is a value.
        assert!(refuse_repeats(&cmd, &argv("run -n 1 --n-predict=2")).is_err());
        refuse_repeats(&cmd, &argv("run -p -n -n 3")).unwrap();
        // -r (stop strings) may repeat.
        refuse_repeats(&cmd, &argv("run -r a -r b")).unwrap();
    }

    #[test]
    fn llama_cpp_spellings_become_long_flags() {
        assert_eq!(llama_spellings(argv("run -ngl 3 -dev hexagon-sim")), argv("run --n-gpu-layers 3 --device hexagon-sim"));
    }
}

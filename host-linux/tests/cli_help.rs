//! The help agrees with the parser (issue 20, acceptance 5): for every command in clap's
//! own command tree (so a command added later is covered without touching this test),
//! `keel CMD --help` succeeds and names every flag and alias the command accepts, `keel
//! help CMD` prints the same; the README's command table has one row per command, every
//! flag a row names is one the command accepts, and every flag the command accepts is in
//! its row. Also: completions for the common shells, and `--batches` where the issue puts it.

use std::collections::BTreeSet;

fn keel(args: &[&str]) -> std::process::Output {
    keel_test_support::keel_command(env!("CARGO_BIN_EXE_keel")).args(args).output().unwrap()
}

/// The commands of the tree, but clap's own `help`, with their subcommands (`rknpu gen`),
/// each under its path of names.
fn commands() -> Vec<(String, clap::Command)> {
    fn walk(prefix: &str, cmd: &clap::Command, out: &mut Vec<(String, clap::Command)>) {
        for c in cmd.get_subcommands().filter(|c| c.get_name() != "help") {
            let path = if prefix.is_empty() { c.get_name().to_string() } else { format!("{prefix} {}", c.get_name()) };
            out.push((path.clone(), c.clone()));
            walk(&path, c, out);
        }
    }
    let mut out = Vec::new();
    walk("", &keel_host_linux::cli::command(), &mut out);
    out
}

/// The spellings of the flags every command accepts (`global`: `--mmap`), which the
/// parser adds to each subcommand when it builds them.
fn global_flags() -> BTreeSet<String> {
    let root = keel_host_linux::cli::command();
    let mut out = BTreeSet::new();
    for a in root.get_arguments().filter(|a| a.is_global_set()) {
        out.extend(a.get_long_and_visible_aliases().unwrap_or_default().iter().map(|l| format!("--{l}")));
        out.extend(a.get_short_and_visible_aliases().unwrap_or_default().iter().map(|c| format!("-{c}")));
    }
    out
}

/// Every spelling of every flag `cmd` accepts (`-x`, `--long`, visible aliases), and the
/// llama.cpp spellings keel reads as one of them; plus the value names of positionals.
fn spellings(cmd: &clap::Command) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut flags, mut positionals) = (BTreeSet::new(), BTreeSet::new());
    for a in cmd.get_arguments() {
        assert!(!a.is_hide_set(), "{} --{:?}: hidden flags are not allowed (help must list every flag)", cmd.get_name(), a.get_long());
        if a.is_positional() {
            positionals.insert(a.get_value_names().map(|v| v[0].to_string()).unwrap_or_else(|| a.get_id().to_string().to_uppercase()));
            continue;
        }
        for s in a.get_short_and_visible_aliases().unwrap_or_default() {
            flags.insert(format!("-{s}"));
        }
        for l in a.get_long_and_visible_aliases().unwrap_or_default() {
            flags.insert(format!("--{l}"));
        }
    }
    for (short, long) in keel_host_linux::cli::args::LLAMA_SPELLINGS {
        if flags.contains(*long) {
            flags.insert(short.to_string());
        }
    }
    (flags, positionals)
}

/// The flags (`-x`, `--long`) named in a piece of text; `--offload-*` gives `--offload-`.
fn flags_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|t| t.starts_with('-') && t.trim_start_matches('-').starts_with(|c: char| c.is_ascii_alphabetic()) && !t.starts_with("---"))
        .map(String::from)
        .collect()
}

/// True if `f` is one of `flags`, clap's own help/version flags, or (ending in `-`, as
/// `--offload-*` is read) a prefix of one of `flags`.
fn accepted(flags: &BTreeSet<String>, f: &str) -> bool {
    ["-h", "--help", "-V", "--version"].contains(&f) || flags.contains(f) || (f.ends_with('-') && flags.iter().any(|x| x.starts_with(f)))
}

/// True if `text` names `flag` as a whole word.
fn names(text: &str, flag: &str) -> bool {
    flags_in(text).contains(flag)
}

#[test]
fn every_command_help_lists_every_flag_it_accepts() {
    let cmds = commands();
    assert!(cmds.len() >= 12, "{:?}", cmds.iter().map(|c| &c.0).collect::<Vec<_>>());
    for (name, cmd) in &cmds {
        let name = name.as_str();
        let path: Vec<&str> = name.split(' ').collect();
        let out = keel(&[&path[..], &["--help"]].concat());
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success() && out.stderr.is_empty(), "keel {name} --help: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
        assert!(help.contains(&format!("Usage: keel {name}")), "keel {name} --help:\n{help}");
        let (mut flags, positionals) = spellings(cmd);
        flags.extend(global_flags());
        for f in &flags {
            assert!(names(&help, f), "keel {name} --help does not mention {f}:\n{help}");
        }
        for p in &positionals {
            assert!(help.contains(&format!("<{p}>")) || help.contains(&format!("[{p}]")), "keel {name} --help does not show <{p}>:\n{help}");
        }
        // Every flag the help names is one the command accepts (or help/version, or a
        // flag quoted in prose that names another command's: none today).
        for f in flags_in(&help) {
            assert!(accepted(&flags, &f), "keel {name} --help names {f}, which it does not accept:\n{help}");
        }
        // Defaults are shown for the flags that have them.
        for a in cmd.get_arguments().filter(|a| !a.get_default_values().is_empty() && !a.is_positional()) {
            let d = a.get_default_values()[0].to_string_lossy().into_owned();
            let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(flat.contains(&format!("[default: {d}]")), "keel {name} --help does not show --{:?}'s default {d}:\n{help}", a.get_long());
        }
        let out = keel(&[&["help"], &path[..]].concat());
        assert_eq!(String::from_utf8_lossy(&out.stdout), help, "keel help {name} differs from keel {name} --help");
    }
}

#[test]
fn the_readme_command_table_matches_the_parser() {
    let readme = std::fs::read_to_string(keel_test_support::repo_root().join("README.md")).unwrap();
    let section = readme.split("## The command line").nth(1).expect("README has a command-line section");
    let section = section.split("\n## ").next().unwrap();
    // Rows: | `keel NAME [SUB] ...` | what it does |, one per command without subcommands,
    // keyed by the longest command path the row starts with.
    let cmds: Vec<(String, clap::Command)> = commands().into_iter().filter(|(_, c)| !c.has_subcommands()).collect();
    let rows: Vec<(&str, &str)> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `keel "))
        .map(|r| {
            let words: String = r.split('`').next().unwrap().to_string() + " ";
            let key = cmds.iter().map(|(p, _)| p.as_str()).filter(|p| words.starts_with(&format!("{p} "))).max_by_key(|p| p.len());
            (key.unwrap_or_else(|| r.split(|c: char| c == ' ' || c == '`').next().unwrap()), r)
        })
        .collect();
    let in_tree: BTreeSet<&str> = cmds.iter().map(|(p, _)| p.as_str()).collect();
    let in_readme: BTreeSet<&str> = rows.iter().map(|r| r.0).collect();
    assert_eq!(in_readme, in_tree, "README command table vs the parser's commands");
    // Each global flag has its own line under the table: "`--flag` (every command) ...".
    for g in global_flags() {
        assert!(readme.lines().any(|l| l.starts_with(&format!("`{g}` (every command)"))), "README does not describe the global flag {g}");
    }
    for (name, cmd) in &cmds {
        let name = name.as_str();
        let row = rows.iter().find(|r| r.0 == name).unwrap().1;
        let (mut flags, _) = spellings(cmd);
        let named = flags_in(row);
        // Global flags are described once, under the table (checked below), and may be
        // named in a row too.
        flags.extend(global_flags());
        // A family written `--offload-*` stands for every flag it prefixes.
        let prefixes: Vec<&String> = named.iter().filter(|f| f.ends_with('-')).collect();
        for f in &named {
            assert!(accepted(&flags, f), "README row of `keel {name}` names {f}, which keel {name} does not accept: {row}");
        }
        // Every flag is in the row by one of its spellings, or by a family (`--offload-*`).
        for a in cmd.get_arguments().filter(|a| !a.is_positional()) {
            let mut spelled: Vec<String> = a.get_short_and_visible_aliases().unwrap_or_default().iter().map(|s| format!("-{s}")).collect();
            spelled.extend(a.get_long_and_visible_aliases().unwrap_or_default().iter().map(|l| format!("--{l}")));
            let found = spelled.iter().any(|f| named.contains(f) || prefixes.iter().any(|p| f.starts_with(p.as_str())));
            assert!(found, "README row of `keel {name}` does not name any of {spelled:?}: {row}");
        }
    }
}

#[test]
fn completions_for_the_common_shells() {
    for shell in ["bash", "zsh", "fish"] {
        let out = keel(&["completions", shell]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "completions {shell}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("keel") && text.contains("batches") && text.contains("quantize"), "completions {shell}:\n{text}");
    }
    let out = keel(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("error:"));
}

#[test]
fn batches_on_every_command_that_evaluates() {
    let cmds = commands();
    for (name, default) in [("run", "invariant"), ("chat", "invariant"), ("eval", "invariant"), ("bench", "invariant"), ("perplexity", "llama-cpp"), ("serve", "invariant")] {
        let cmd = &cmds.iter().find(|c| c.0 == name).unwrap().1;
        let a = cmd.get_arguments().find(|a| a.get_long() == Some("batches")).unwrap_or_else(|| panic!("keel {name} has no --batches"));
        let values: Vec<String> = a.get_possible_values().iter().map(|v| v.get_name().to_string()).collect();
        assert_eq!(values, ["invariant", "llama-cpp"], "keel {name} --batches");
        assert_eq!(a.get_default_values(), [default], "keel {name} --batches default");
    }
}

#[test]
fn typos_get_a_suggestion_and_exit_1() {
    for (args, want) in [(&["rum"][..], "run"), (&["qunatize"][..], "quantize"), (&["run", "--tmep", "0"][..], "--temp")] {
        let out = keel(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.starts_with("error: ") && err.contains(&format!("'{want}'")), "{args:?} should suggest {want}: {err}");
    }
}

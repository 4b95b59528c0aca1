//! A small command-line parser: llama.cpp-style flags (`-m FILE`, `--temp 0.7`,
//! `--json`), with errors that name the flag and what it expects.

use std::fmt;
use std::str::FromStr;

/// A usage error: the message says which flag and what is wrong.
#[derive(Debug)]
pub struct ArgError(pub String);

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ArgError {}

/// The process arguments as UTF-8 strings; a byte sequence that is not UTF-8 (e.g. a
/// file name in another encoding) is an error naming the argument, not a panic.
pub fn from_os(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Vec<String>, ArgError> {
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            a.into_string().map_err(|a| {
                ArgError(format!("argument {} ({:?}) is not valid UTF-8; keel takes UTF-8 arguments: rename the file or pass the text in a file with -f", i + 1, a.to_string_lossy()))
            })
        })
        .collect()
}

/// The arguments after the subcommand, consumed flag by flag.
pub struct Args {
    items: Vec<Option<String>>,
    /// The flags consumed so far (a second occurrence left over is "given twice").
    taken: Vec<String>,
}

impl Args {
    /// Wraps the raw arguments.
    pub fn new(items: impl IntoIterator<Item = String>) -> Self {
        Args { items: items.into_iter().map(Some).collect(), taken: Vec::new() }
    }

    fn position(&self, names: &[&str]) -> Option<usize> {
        self.items.iter().position(|a| a.as_deref().is_some_and(|a| names.contains(&a)))
    }

    /// True if any of `names` is present (removes it).
    pub fn flag(&mut self, names: &[&str]) -> bool {
        match self.position(names) {
            Some(i) => {
                self.taken.extend(self.items[i].take());
                true
            }
            None => false,
        }
    }

    /// The value after any of `names`, parsed (removes both).
    pub fn value<T: FromStr>(&mut self, names: &[&str], what: &str) -> Result<Option<T>, ArgError> {
        let Some(i) = self.position(names) else { return Ok(None) };
        let flag = self.items[i].take().unwrap_or_default();
        self.taken.push(flag.clone());
        let raw = self.items.get_mut(i + 1).and_then(|v| v.take()).ok_or_else(|| ArgError(format!("{flag} needs a value ({what})")))?;
        raw.parse::<T>().map(Some).map_err(|_| ArgError(format!("{flag} {raw:?}: expected {what}")))
    }

    /// Like [`Args::value`] with a default.
    pub fn value_or<T: FromStr>(&mut self, names: &[&str], what: &str, default: T) -> Result<T, ArgError> {
        Ok(self.value(names, what)?.unwrap_or(default))
    }

    /// The remaining arguments that are not flags, in order (removes them).
    pub fn positionals(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for a in self.items.iter_mut() {
            if a.as_deref().is_some_and(|s| !s.starts_with('-') || s == "-") {
                out.push(a.take().unwrap_or_default());
            }
        }
        out
    }

    /// Fails on anything left unconsumed: a flag already taken is "given twice".
    pub fn finish(self) -> Result<(), ArgError> {
        let left: Vec<String> = self.items.into_iter().flatten().collect();
        if let Some(again) = left.iter().find(|a| self.taken.contains(a)) {
            return Err(ArgError(format!("{again} given twice; give it once")));
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(ArgError(format!("unknown argument(s): {}; see `keel help`", left.join(" "))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Args {
        Args::new(s.split_whitespace().map(String::from))
    }

    #[test]
    fn flags_values_and_leftovers() {
        let mut a = args("-m model.gguf --temp 0.5 --json extra");
        assert_eq!(a.value::<String>(&["-m", "--model"], "a file").unwrap().as_deref(), Some("model.gguf"));
        assert_eq!(a.value::<f32>(&["--temp"], "a number").unwrap(), Some(0.5));
        assert!(a.flag(&["--json"]));
        assert!(!a.flag(&["--json"]));
        assert_eq!(a.positionals(), vec!["extra".to_string()]);
        a.finish().unwrap();
    }

    #[test]
    fn errors_name_the_flag() {
        let mut a = args("-n lots");
        let e = a.value::<usize>(&["-n"], "a token count").unwrap_err();
        assert!(e.0.contains("-n") && e.0.contains("token count"), "{e}");
        let mut a = args("-n");
        assert!(a.value::<usize>(&["-n"], "a count").unwrap_err().0.contains("needs a value"));
        let a = args("--bogus");
        assert!(a.finish().unwrap_err().0.contains("--bogus"));
        let mut a = args("-n 1 --json -n 2 --json");
        assert_eq!(a.value::<usize>(&["-n"], "a count").unwrap(), Some(1));
        assert!(a.flag(&["--json"]));
        assert_eq!(a.finish().unwrap_err().0, "-n given twice; give it once");
    }
}

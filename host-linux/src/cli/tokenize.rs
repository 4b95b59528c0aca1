//! `keel tokenize`: text to token ids.

use super::args::Args;
use super::common::{read_text_limited, tokenize_all, MAX_TEXT_FILE};
use super::load::open;
use crate::json;
use anyhow::{bail, Result};

/// Runs the subcommand.
pub fn main(mut a: Args) -> Result<()> {
    let model = a.value::<String>(&["-m", "--model"], "a model file or name")?.unwrap_or_else(|| "smollm2-135m".into());
    let add_special = a.flag(&["--add-special"]);
    let parse_special = a.flag(&["--parse-special"]);
    let as_json = a.flag(&["--json"]);
    let file: Option<String> = a.value(&["-f", "--file"], "a text file")?;
    let pos = a.positionals();
    a.finish()?;
    let text = match (file, pos.as_slice()) {
        (Some(f), []) => read_text_limited(&f, "text file", MAX_TEXT_FILE, "the most keel tokenizes at once")?,
        (None, [t]) => t.clone(),
        _ => bail!("give the text as one argument or with -f FILE"),
    };
    let opened = open(&model)?;
    let g = opened.gguf()?;
    let mut mem = vec![0u8; keel_core::tokenizer::Tokenizer::memory_bytes(&g).map_err(|e| anyhow::anyhow!("{}: {e}", opened.path.display()))?];
    let tok = keel_core::tokenizer::Tokenizer::new(&g, &mut mem).map_err(|e| anyhow::anyhow!("{}: {e}", opened.path.display()))?;
    let ids = tokenize_all(&tok, &text, add_special, parse_special)?;
    if as_json {
        let mut o = json::Object::new();
        o.arr("tokens", |arr| {
            for &t in &ids {
                arr.u64(t as u64);
            }
        });
        o.print();
    } else {
        let mut buf = vec![0u8; tok.max_piece_len()];
        for &t in &ids {
            let n = tok.piece(t, true, &mut buf).unwrap_or(0);
            println!("{t:>7} {:?}", String::from_utf8_lossy(&buf[..n]));
        }
    }
    Ok(())
}

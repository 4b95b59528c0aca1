//! `keel tokenize`: text to token ids.

use super::common::{read_text_limited, tokenize_all, ModelFlag, MAX_TEXT_FILE};
use super::load::open;
use serde::Serialize;
use anyhow::{bail, Result};

/// `keel tokenize`.
#[derive(clap::Args, Debug)]
pub struct TokenizeArgs {
    /// The model (`-m`).
    #[command(flatten)]
    pub model: ModelFlag,
    /// Add the model's special tokens (BOS) as a prompt gets them
    #[arg(long = "add-special")]
    pub add_special: bool,
    /// Parse special-token text (e.g. <|im_start|>) as those tokens
    #[arg(long = "parse-special")]
    pub parse_special: bool,
    /// Print {"tokens":[..]} instead of one token per line
    #[arg(long = "json")]
    pub json: bool,
    /// Read the text from FILE (- reads standard input; at most 256 MiB)
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<String>,
    /// The text (or -f FILE)
    #[arg(value_name = "TEXT")]
    pub text: Vec<String>,
}

/// `keel tokenize --json`.
#[derive(Serialize)]
struct TokensJson<'a> {
    tokens: &'a [u32],
}

/// Runs the subcommand.
pub fn main(a: TokenizeArgs) -> Result<()> {
    let model = a.model.model.clone();
    let (add_special, parse_special, as_json) = (a.add_special, a.parse_special, a.json);
    let text = match (&a.file, a.text.as_slice()) {
        (Some(f), []) => read_text_limited(f, "text file", MAX_TEXT_FILE, "the most keel tokenizes at once")?,
        (None, [t]) => t.clone(),
        _ => bail!("give the text as one argument or with -f FILE"),
    };
    let opened = open(&model)?;
    let g = opened.gguf()?;
    let mut mem = vec![0u8; keel_core::tokenizer::Tokenizer::memory_bytes(&g).map_err(|e| anyhow::anyhow!("{}: {e}", opened.path.display()))?];
    let tok = keel_core::tokenizer::Tokenizer::new(&g, &mut mem).map_err(|e| anyhow::anyhow!("{}: {e}", opened.path.display()))?;
    let ids = tokenize_all(&tok, &text, add_special, parse_special)?;
    if as_json {
        crate::cli::print_json(&TokensJson { tokens: &ids });
    } else {
        let mut buf = vec![0u8; tok.max_piece_len()];
        for &t in &ids {
            let n = tok.piece(t, true, &mut buf).unwrap_or(0);
            println!("{t:>7} {:?}", String::from_utf8_lossy(&buf[..n]));
        }
    }
    Ok(())
}

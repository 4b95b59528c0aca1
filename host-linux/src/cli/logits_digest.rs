//! SHA-256 digests of logits rows, as `keel run --json` reports them (`logits_sha256`,
//! `row_sha256`), with the definition host-wasi's reference guest uses, so native
//! `keel run --reference` can be checked against the committed wasm digests.
//!
//! Rows: one per sampling choice, in order (the last prompt position's row, then the
//! row after each generated token, including the row that chose end-of-generation).
//! A row is its `n_vocab` f32 logits as IEEE-754 binary32 little-endian bytes in
//! token-id order. `row_sha256[i]` = SHA-256(row i); `logits_sha256` = SHA-256 of all
//! rows concatenated.

use sha2::{Digest, Sha256};

/// The running digests of one generation.
#[derive(Default)]
pub struct LogitsDigest {
    all: Sha256,
    rows: Vec<[u8; 32]>,
}

impl LogitsDigest {
    /// Adds the row a token is about to be chosen from.
    pub fn row(&mut self, logits: &[f32]) {
        let mut one = Sha256::new();
        let mut le = [0u8; 4096];
        for chunk in logits.chunks(1024) {
            for (b, v) in le.chunks_exact_mut(4).zip(chunk) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            one.update(&le[..4 * chunk.len()]);
            self.all.update(&le[..4 * chunk.len()]);
        }
        self.rows.push(one.finalize().into());
    }

    /// (`logits_sha256`, `row_sha256`) as lowercase hex.
    pub fn finish(self) -> (String, Vec<String>) {
        (hex(&self.all.finalize()), self.rows.iter().map(|r| hex(r)).collect())
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_hashed_as_little_endian_f32() {
        let mut d = LogitsDigest::default();
        d.row(&[1.0, -2.5]);
        let (all, rows) = d.finish();
        let bytes: Vec<u8> = [1.0f32, -2.5].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(rows, vec![hex(&Sha256::digest(&bytes))]);
        assert_eq!(all, rows[0]);
    }
}

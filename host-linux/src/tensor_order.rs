//! The order a forward pass reads a model's tensors in, by GGUF name.
//!
//! Owns [`rank`], the sort key [`crate::mmap::ModelFile::load_in_execution_order`] lays
//! a model's tensors out by: the token embedding, then block by block the tensors in the
//! order keel's layer runs its ops (norm, q, k, v, output; norm, gate, up, down; the
//! per-head and post norms where they run), then the rest (final norm, output).
//! Tensors it does not know keep their file order at the end of their block. GGUF
//! writers order a block's tensors otherwise (llama.cpp's converters and `keel
//! quantize`: attn_norm, ffn_down, ffn_gate, ffn_up, ffn_norm, attn_k, attn_output,
//! attn_q, attn_v), so decoding read the weights jumping back and forth, and the decode
//! kernels' hints past a matrix's end fetched bytes no op read next.

/// A block tensor's place among its block's, by the name's component after `blk.N.`.
fn component_rank(c: &[u8]) -> u8 {
    match c {
        b"attn_norm" => 0,
        b"attn_q" => 1,
        b"attn_q_norm" => 2,
        b"attn_k" => 3,
        b"attn_k_norm" => 4,
        b"attn_v" => 5,
        b"attn_output" => 6,
        b"attn_post_norm" | b"post_attention_norm" => 7,
        b"ffn_norm" => 8,
        b"ffn_gate_inp" => 9,
        b"ffn_gate" => 10,
        b"ffn_up" => 11,
        b"ffn_down" => 12,
        b"post_ffw_norm" | b"layer_output_norm" => 13,
        _ => 14,
    }
}

/// The sort key of the tensor called `name` (a stable sort by it keeps equal keys in
/// file order): `(0, ..)` the token embedding, `(1, block, component)` a block's
/// tensors, `(2, ..)` everything else.
pub fn rank(name: &[u8]) -> (u8, u64, u8) {
    if name.starts_with(b"token_embd.") {
        return (0, 0, 0);
    }
    let Some(rest) = name.strip_prefix(b"blk.") else { return (2, 0, 0) };
    let mut parts = rest.splitn(3, |&b| b == b'.');
    let (Some(n), Some(c)) = (parts.next(), parts.next()) else { return (2, 0, 0) };
    let Some(block) = std::str::from_utf8(n).ok().and_then(|n| n.parse::<u64>().ok()) else { return (2, 0, 0) };
    (1, block, component_rank(c))
}

#[cfg(test)]
mod tests {
    use super::rank;

    #[test]
    fn a_block_in_llama_cpp_file_order_sorts_into_execution_order() {
        let file = [
            "token_embd.weight", "blk.0.attn_norm.weight", "blk.0.ffn_down.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
            "blk.0.ffn_norm.weight", "blk.0.attn_k.weight", "blk.0.attn_output.weight", "blk.0.attn_q.weight", "blk.0.attn_v.weight",
            "blk.10.attn_q.weight", "blk.2.attn_q.weight", "blk.0.ssm_a", "output_norm.weight", "output.weight",
        ];
        let mut order: Vec<&str> = file.to_vec();
        order.sort_by_key(|n| rank(n.as_bytes()));
        assert_eq!(
            order,
            [
                "token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
                "blk.0.attn_output.weight", "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight",
                "blk.0.ssm_a", "blk.2.attn_q.weight", "blk.10.attn_q.weight", "output_norm.weight", "output.weight",
            ]
        );
        // Names without a block number stay with the rest, in file order.
        assert_eq!(rank(b"blk.x.attn_q.weight"), (2, 0, 0));
        assert_eq!(rank(b"blk.3"), (2, 0, 0));
    }
}

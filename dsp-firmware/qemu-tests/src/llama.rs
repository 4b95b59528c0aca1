//! A llama-style decoder layer (GQA attention over position-major F16 K/V caches,
//! SwiGLU feed-forward) on the host: the chain of keel-core calls ([`crate::expect`],
//! one per op of the firmware batch that runs the same layer), keeping every
//! intermediate so a test can say which op first differs. Only data movement here.

use half::f16;
use keel_npu_hal::op::DType;

use crate::expect::{self as e, Attn, Cache, Tiled};
use crate::{small_weights, Rng};

/// The layer's sizes, hyperparameters and weights (ggml rows).
pub struct Layer {
    /// Model width.
    pub dim: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Feed-forward width.
    pub ffn: usize,
    /// Embedding rows.
    pub vocab: usize,
    /// Cache positions.
    pub n_ctx: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE frequency base.
    pub base: f32,
    /// Q8_0 embedding table, `[vocab][dim]`.
    pub embd: Vec<u8>,
    /// Attention and feed-forward weights: type and ggml rows.
    pub wq: (DType, Vec<u8>),
    /// K projection.
    pub wk: (DType, Vec<u8>),
    /// V projection.
    pub wv: (DType, Vec<u8>),
    /// Output projection.
    pub wo: (DType, Vec<u8>),
    /// FFN gate.
    pub wg: (DType, Vec<u8>),
    /// FFN up.
    pub wu: (DType, Vec<u8>),
    /// FFN down.
    pub wd: (DType, Vec<u8>),
    /// Attention norm weight.
    pub norm1: Vec<f32>,
    /// FFN norm weight.
    pub norm2: Vec<f32>,
}

impl Layer {
    /// A random layer with mixed Q8_0 / Q4_0 / IQ4_NL weights.
    pub fn random(rng: &mut Rng) -> Layer {
        let (dim, n_head, n_head_kv, head_dim, ffn, vocab, n_ctx) = (128, 4, 2, 32, 256, 20, 16);
        let (qd, kd) = (n_head * head_dim, n_head_kv * head_dim);
        let mut w = |t: DType, rows: usize, k: usize| (t, small_weights(t, rows, k, rng));
        let embd = w(DType::Q8_0, vocab, dim).1;
        let wq = w(DType::Q4_0, qd, dim);
        let wk = w(DType::IQ4NL, kd, dim);
        let wv = w(DType::Q8_0, kd, dim);
        let wo = w(DType::Q4_0, dim, qd);
        let wg = w(DType::IQ4NL, ffn, dim);
        let wu = w(DType::Q8_0, ffn, dim);
        let wd = w(DType::Q4_0, dim, ffn);
        let norm1 = (0..dim).map(|_| 1.0 + 0.3 * rng.f32()).collect();
        let norm2 = (0..dim).map(|_| 1.0 + 0.3 * rng.f32()).collect();
        Layer { dim, n_head, n_head_kv, head_dim, ffn, vocab, n_ctx, eps: 1e-5, base: 10000.0, embd, wq, wk, wv, wo, wg, wu, wd, norm1, norm2 }
    }

    /// Width of the query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the KV heads together (one cache position's row).
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// The attention's score scale.
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// Every intermediate of one pass, in op order (row-major, `[token][…]`).
#[derive(Default)]
pub struct Trace {
    /// Embedding rows (GetRows).
    pub x: Vec<f32>,
    /// RMSNorm·w.
    pub h: Vec<f32>,
    /// h as Q8_0.
    pub hq: Vec<u8>,
    /// Q product.
    pub q: Vec<f32>,
    /// K product.
    pub k: Vec<f32>,
    /// V product.
    pub v: Vec<f32>,
    /// RoPE of Q.
    pub q_rope: Vec<f32>,
    /// RoPE of K.
    pub k_rope: Vec<f32>,
    /// Attention.
    pub att: Vec<f32>,
    /// Attention as Q8_0.
    pub attq: Vec<u8>,
    /// Output product.
    pub o: Vec<f32>,
    /// Residual.
    pub x1: Vec<f32>,
    /// RMSNorm·w.
    pub h2: Vec<f32>,
    /// h2 as Q8_0.
    pub h2q: Vec<u8>,
    /// Gate product.
    pub g: Vec<f32>,
    /// Up product.
    pub up: Vec<f32>,
    /// SwiGLU.
    pub s: Vec<f32>,
    /// SwiGLU as Q8_0.
    pub sq: Vec<u8>,
    /// Down product.
    pub f: Vec<f32>,
    /// Residual: the layer's output.
    pub out: Vec<f32>,
}

/// The layer for `tokens` at positions `pos0..`, on the host: keel-core calls only.
/// Writes the tokens' K (after RoPE) and V rows into the position-major F16 caches
/// (`[n_ctx][n_head_kv][head_dim]`, converted by `Kernels::f32_to_f16` as the `Copy`
/// op does) and attends over positions `0 .. pos0 + tokens.len()`.
pub fn run(l: &Layer, tokens: &[i32], pos0: usize, kcache: &mut [f16], vcache: &mut [f16]) -> Trace {
    let (qd, kd, hd, nt) = (l.q_dim(), l.kv_dim(), l.head_dim, tokens.len());
    let pos: Vec<i32> = (0..nt).map(|t| (pos0 + t) as i32).collect();
    let tiled = |w: &(DType, Vec<u8>), rows: usize, k: usize| Tiled::new(w.0, rows, k, &w.1);
    let mut r = Trace { x: e::get_rows(DType::Q8_0, &l.embd, l.dim, tokens), ..Default::default() };
    r.h = e::norm_rows(&r.x, l.dim, Some(&l.norm1), l.eps);
    r.hq = e::quantize_q8_0(&r.h);
    r.q = e::matmul(&tiled(&l.wq, qd, l.dim), &r.hq);
    r.k = e::matmul(&tiled(&l.wk, kd, l.dim), &r.hq);
    r.v = e::matmul(&tiled(&l.wv, kd, l.dim), &r.hq);
    r.q_rope = e::rope(&r.q, hd, l.n_head, &pos, hd, 0, l.base, None);
    r.k_rope = e::rope(&r.k, hd, l.n_head_kv, &pos, hd, 0, l.base, None);
    kcache[pos0 * kd..(pos0 + nt) * kd].copy_from_slice(&e::to_f16(&r.k_rope));
    vcache[pos0 * kd..(pos0 + nt) * kd].copy_from_slice(&e::to_f16(&r.v));
    let shape = Attn { head_dim: hd, n_head: l.n_head, n_head_kv: l.n_head_kv, n_tokens: nt, n_kv: pos0 + nt, scale: l.scale(), window: 0 };
    let cache = |data| Cache { data, pos_stride: kd, head_stride: hd };
    r.att = e::attention(&r.q_rope, shape, cache(kcache), cache(vcache));
    r.attq = e::quantize_q8_0(&r.att);
    r.o = e::matmul(&tiled(&l.wo, l.dim, qd), &r.attq);
    r.x1 = e::add(&r.x, &r.o);
    r.h2 = e::norm_rows(&r.x1, l.dim, Some(&l.norm2), l.eps);
    r.h2q = e::quantize_q8_0(&r.h2);
    r.g = e::matmul(&tiled(&l.wg, l.ffn, l.dim), &r.h2q);
    r.up = e::matmul(&tiled(&l.wu, l.ffn, l.dim), &r.h2q);
    r.s = e::swiglu(&r.g, &r.up);
    r.sq = e::quantize_q8_0(&r.s);
    r.f = e::matmul(&tiled(&l.wd, l.dim, l.ffn), &r.sq);
    r.out = e::add(&r.x1, &r.f);
    r
}

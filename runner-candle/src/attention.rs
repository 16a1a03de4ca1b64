//! Causal grouped-query attention, one (query row, head) at a time, in a fixed order.
//!
//! Why not candle's matmul: its CPU matmul (the `gemm` crate) picks its kernel by the shape of
//! the call, so the attention scores `q · kᵀ` of one query row come out with other last bits in a
//! call of 6 rows than in a call of 1 once the context passes a few dozen keys (measured with
//! candle 0.11.1 on this project's machine: 360 of the 432 scores of a row differ at 48 keys, none
//! below 40). A speculative step feeds 1 + drafts rows where plain decoding feeds 1, so with
//! candle's matmul the logits of a draft position would differ from plain decoding's and
//! speculative decoding would no longer emit exactly the plain tokens.
//!
//! Here every output element is computed by the same arithmetic whatever the number of rows in
//! the call: the scores of the query at position `p` over keys `0 ..= p` (the causal mask is the
//! loop bound, not a `-inf` fill), a softmax over them, and the weighted sum of values, each
//! reduction in one fixed order. A position's attention — so its hidden states and logits — are
//! the same bits alone, inside a step of several tokens, or in one pass over the whole prefix.

use rayon::prelude::*;

/// The shape of an attention call.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (each shared by `n_head / n_kv_head` query heads).
    pub n_kv_head: usize,
    /// Size of a head.
    pub head_dim: usize,
}

/// Attention of `m` query rows at positions `start .. start + m`.
///
/// `q` is `[m, n_head, head_dim]`; `keys` and `values` are `[start + m, n_kv_head, head_dim]`
/// (every position up to the last row's, the rows' own included); returns `[m, n_head,
/// head_dim]`. Scores are scaled by `1 / sqrt(head_dim)`.
pub fn attend(q: &[f32], keys: &[f32], values: &[f32], start: usize, heads: Heads) -> Vec<f32> {
    let Heads {
        n_head,
        n_kv_head,
        head_dim,
    } = heads;
    let group = n_head / n_kv_head;
    let kv_width = n_kv_head * head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(head_dim)
        .zip(q.par_chunks(head_dim))
        .enumerate()
        .for_each(|(index, (out, q))| {
            let (row, head) = (index / n_head, index % n_head);
            let kv_head = head / group;
            let visible = start + row + 1;
            let key = |j: usize| &keys[j * kv_width + kv_head * head_dim..][..head_dim];
            let value = |j: usize| &values[j * kv_width + kv_head * head_dim..][..head_dim];
            let mut weights: Vec<f32> = (0..visible).map(|j| dot(q, key(j)) * scale).collect();
            softmax(&mut weights);
            for (j, &w) in weights.iter().enumerate() {
                for (o, &v) in out.iter_mut().zip(value(j)) {
                    *o += w * v;
                }
            }
        });
    out
}

/// `a · b` in a fixed order: eight interleaved partial sums, then the tail, then a fixed tree.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for ((lane, x), y) in lanes.iter_mut().zip(x).zip(y) {
            *lane += x * y;
        }
    }
    let [l0, l1, l2, l3, l4, l5, l6, l7] = lanes;
    (((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))) + tail
}

/// In-place softmax: `exp(x − max) / Σ`, the sum taken in order.
fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random f32 in [-1, 1).
    fn noise(i: usize) -> f32 {
        let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        x as f32 / (1u64 << 23) as f32 - 1.0
    }

    const HEADS: Heads = Heads {
        n_head: 6,
        n_kv_head: 2,
        head_dim: 16,
    };

    #[test]
    fn a_row_is_the_same_bits_alone_or_among_others() {
        let width = HEADS.n_kv_head * HEADS.head_dim;
        let q_width = HEADS.n_head * HEADS.head_dim;
        let positions = 70;
        let keys: Vec<f32> = (0..positions * width).map(noise).collect();
        let values: Vec<f32> = (0..positions * width).map(|i| noise(i + 7_777)).collect();
        let q: Vec<f32> = (0..positions * q_width)
            .map(|i| noise(i + 99_999))
            .collect();
        // One pass over every position.
        let whole = attend(&q, &keys, &values, 0, HEADS);
        // Each position alone, over the keys up to it.
        for p in 0..positions {
            let row = &q[p * q_width..][..q_width];
            let alone = attend(
                row,
                &keys[..(p + 1) * width],
                &values[..(p + 1) * width],
                p,
                HEADS,
            );
            let bits = |s: &[f32]| s.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&alone),
                bits(&whole[p * q_width..][..q_width]),
                "position {p}"
            );
        }
    }

    #[test]
    fn attention_matches_the_textbook_formula() {
        // One head of size 2, two positions: the second row attends to both.
        let heads = Heads {
            n_head: 1,
            n_kv_head: 1,
            head_dim: 2,
        };
        let keys = [1.0, 0.0, 0.0, 1.0];
        let values = [10.0, 0.0, 0.0, 20.0];
        let q = [0.0, 0.0, 2.0, 0.0];
        let out = attend(&q, &keys, &values, 0, heads);
        assert_eq!(&out[..2], &[10.0, 0.0]);
        let (s0, s1) = (2.0 / 2f32.sqrt(), 0.0);
        let w0 = 1.0 / (1.0 + (s1 - s0).exp());
        assert!((out[2] - 10.0 * w0).abs() < 1e-5 && (out[3] - 20.0 * (1.0 - w0)).abs() < 1e-5);
    }
}

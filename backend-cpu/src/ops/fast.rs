//! The single-pass fast path of `top_k_top_p_sample` (exact; falls back to `select` when its
//! precondition does not hold).
//!
//! One streaming pass over the row computes, per block of [`BLOCK`] tokens, the exact block weight
//! and the largest rank key; only blocks whose largest key reaches a *floor* are scanned again
//! (while still in L1) to collect their candidate tokens. Every later decision works on the
//! candidates alone:
//!
//! - top-k: the floor rises during the pass to the k-th largest candidate key seen so far, so the
//!   candidates always hold the top k (ties at the floor included);
//! - top-p without top-k: the floor is `(1 − top_p) / (2V)`; after the pass, the exact mass of the
//!   candidates is checked against the top-p target. If they reach it, the kept prefix lies among
//!   them (it is a prefix of the rank order, and so are the candidates); if not (rows that are far
//!   from summing to 1), the histogram path runs instead;
//! - top_p = 1 without top-k keeps every positive-weight token: the draw locates its block from the
//!   block weights and rescans that block only.
//!
//! The decisions are the same integer decisions as the reference path; the test suite compares both
//! with a sort-based implementation of the contract.

use specula_backend_api::FloatElement;
use specula_backend_api::fixed_point::{rank_key, scale_draw, top_p_fixed, top_p_target_mass};

use super::select::{Metric, Prefix, shortest_prefix, with_scratch};

/// Tokens per block of the streaming pass.
pub(crate) const BLOCK: usize = 256;
/// The largest top-k the fast path handles (larger ones use the histogram path).
const MAX_FAST_K: usize = 2048;

/// The weight of a rank key, branch-free so the block loop vectorizes. Keys of sanitized values are
/// at most `1.0f32.to_bits()`, so the exponent is at most 127.
#[inline(always)]
fn weight_of_key(key: u32) -> u64 {
    let exp = key >> 23;
    let mantissa = u64::from((key & 0x7f_ffff) | 0x80_0000);
    let shift = 127 - exp;
    // value = mantissa · 2^(exp − 150); weight = floor(value · 2^40) = (mantissa << 17) >> (127 − exp).
    if shift < 64 {
        (mantissa << 17) >> shift
    } else {
        0
    }
}

#[inline(always)]
fn key_of<T: FloatElement>(v: T) -> u32 {
    rank_key(v.to_f32())
}

/// Exact weight and largest key of a block, in eight independent lanes so that the loop
/// vectorizes. Weights are computed as `floor(p · 2^40)` in f64, which is exact (a sanitized f32
/// times a power of two), and summed in f64, which is exact too: every term is an integer below
/// 2^40 and a block's sum stays below 2^53.
#[inline(always)]
fn block_stats_generic<T: FloatElement>(block: &[T]) -> (u64, u32) {
    const LANES: usize = 8;
    const SCALE: f64 = (1u64 << 40) as f64;
    let mut mass = [0f64; LANES];
    let mut max = [0u32; LANES];
    let mut chunks = block.chunks_exact(LANES);
    for chunk in &mut chunks {
        for lane in 0..LANES {
            let p = chunk[lane].to_f32();
            // sanitize: NaN, zeros and negatives to +0, above 1 to 1 (never -0: its bits rank high).
            let p = if p > 0.0 { p.min(1.0) } else { 0.0 };
            max[lane] = max[lane].max(p.to_bits());
            mass[lane] += (f64::from(p) * SCALE).floor();
        }
    }
    let mut total = mass.iter().sum::<f64>() as u64;
    let mut top = max.iter().copied().max().unwrap_or(0);
    for &v in chunks.remainder() {
        let key = key_of(v);
        top = top.max(key);
        total += weight_of_key(key);
    }
    (total, top)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn block_stats_avx2<T: FloatElement>(block: &[T]) -> (u64, u32) {
    block_stats_generic(block)
}

#[inline]
fn block_stats<T: FloatElement>(block: &[T]) -> (u64, u32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { block_stats_avx2(block) };
        }
    }
    block_stats_generic(block)
}

/// A candidate: rank key and token id.
type Candidate = (u32, u32);

/// Per-thread buffers of the fast path.
#[derive(Default)]
struct FastScratch {
    candidates: Vec<Candidate>,
    keys: Vec<u32>,
    block_mass: Vec<u64>,
    values: Vec<f32>,
}

thread_local! {
    static FAST: std::cell::RefCell<FastScratch> = std::cell::RefCell::new(FastScratch::default());
}

/// Raises the floor to the k-th largest candidate key and drops the candidates below it.
fn shrink_to_top_k(s: &mut FastScratch, k: usize) -> u32 {
    s.keys.clear();
    s.keys.extend(s.candidates.iter().map(|c| c.0));
    let (_, kth, _) = s.keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
    let floor = *kth;
    s.candidates.retain(|c| c.0 >= floor);
    floor
}

/// Samples a row on the fast path, or returns `None` when the histogram path must decide.
pub(crate) fn sample_row_fast<T: FloatElement>(
    row: &[T],
    top_k: i32,
    top_p: f32,
    draw: u64,
) -> Option<usize> {
    let vocab = row.len();
    let top_k = usize::try_from(top_k).ok().filter(|&k| k > 0 && k < vocab);
    if top_k.is_some_and(|k| k > MAX_FAST_K) {
        return None;
    }
    let p_fixed = top_p_fixed(top_p);
    let keep_all = top_k.is_none() && p_fixed == 1 << 24;
    let mut floor = match top_k {
        Some(_) => 0,
        None if keep_all => u32::MAX,
        None => {
            let tau = (1.0 - f64::from(top_p.clamp(0.0, 1.0))) / (2.0 * vocab as f64);
            rank_key(tau as f32).max(super::select::MIN_WEIGHT_KEY)
        }
    };
    FAST.with(|cell| {
        let s = &mut *cell.borrow_mut();
        s.candidates.clear();
        s.block_mass.clear();
        let cap = top_k.map_or(vocab / 4, |k| 4 * k + 4 * BLOCK);
        let mut total = 0u64;
        for (b, block) in row.chunks(BLOCK).enumerate() {
            let (mass, max) = block_stats(block);
            total += mass;
            s.block_mass.push(mass);
            if max >= floor {
                let base = b * BLOCK;
                for (i, &v) in block.iter().enumerate() {
                    let key = key_of(v);
                    if key >= floor {
                        s.candidates.push((key, (base + i) as u32));
                    }
                }
                if s.candidates.len() >= cap {
                    match top_k {
                        Some(k) => floor = shrink_to_top_k(s, k),
                        // A flat row: most of it is kept, and the histogram path is cheaper.
                        None => return None,
                    }
                }
            }
        }
        if total == 0 {
            return None; // degenerate rows: the reference path finds the first token in rank order
        }
        if keep_all {
            return draw_from_blocks(row, &s.block_mass, total, draw);
        }
        match top_k {
            Some(k) => sample_top_k(s, k, p_fixed, draw),
            None => sample_top_p(s, total, p_fixed, draw),
        }
    })
}

/// top_p = 1 and no top-k: the kept set is every positive-weight token, `C` the row's total.
fn draw_from_blocks<T: FloatElement>(
    row: &[T],
    block_mass: &[u64],
    total: u64,
    draw: u64,
) -> Option<usize> {
    let t = scale_draw(draw, total);
    let mut before = 0u64;
    for (b, &mass) in block_mass.iter().enumerate() {
        if before + mass > t {
            let mut cumulative = before;
            for (i, &v) in row[b * BLOCK..].iter().take(BLOCK).enumerate() {
                cumulative += weight_of_key(key_of(v));
                if cumulative > t {
                    return Some(b * BLOCK + i);
                }
            }
            return None;
        }
        before += mass;
    }
    None
}

/// top-k (then top-p): the candidates hold the top k in id order.
fn sample_top_k(s: &mut FastScratch, k: usize, p_fixed: u64, draw: u64) -> Option<usize> {
    if s.candidates.len() > k {
        shrink_to_top_k(s, k);
    }
    // Rank order of the few candidates: key descending, id ascending.
    s.candidates
        .sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let n = k.min(s.candidates.len());
    let survivors = &mut s.candidates[..n];
    let survivor_mass: u64 = survivors.iter().map(|c| weight_of_key(c.0)).sum();
    if survivor_mass == 0 {
        return Some(survivors[0].1 as usize);
    }
    let target = top_p_target_mass(p_fixed, survivor_mass);
    let mut mass = 0u64;
    let mut kept = survivors.len();
    for (i, c) in survivors.iter().enumerate() {
        mass += weight_of_key(c.0);
        if mass >= target {
            kept = i + 1;
            break;
        }
    }
    let kept = &mut survivors[..kept];
    kept.sort_unstable_by_key(|c| c.1);
    let t = scale_draw(draw, mass);
    let mut cumulative = 0u64;
    for c in kept.iter() {
        cumulative += weight_of_key(c.0);
        if cumulative > t {
            return Some(c.1 as usize);
        }
    }
    None
}

/// top-p only: the candidates are every token at or above the floor, in id order.
fn sample_top_p(s: &mut FastScratch, total: u64, p_fixed: u64, draw: u64) -> Option<usize> {
    let target = top_p_target_mass(p_fixed, total);
    let candidate_mass: u64 = s.candidates.iter().map(|c| weight_of_key(c.0)).sum();
    if candidate_mass < target {
        return None; // the kept prefix reaches below the floor
    }
    // The candidates as a row of their own (position order = id order), for the exact selection.
    s.values.clear();
    s.values
        .extend(s.candidates.iter().map(|c| f32::from_bits(c.0)));
    let prefix: Prefix = with_scratch(|scratch| {
        shortest_prefix(&s.values, &Prefix::ALL, Metric::Mass, target, scratch)
    });
    let t = scale_draw(draw, prefix.mass);
    let mut member = prefix.member();
    let mut cumulative = 0u64;
    for c in &s.candidates {
        if member.admit(c.0) {
            cumulative += weight_of_key(c.0);
            if cumulative > t {
                return Some(c.1 as usize);
            }
        }
    }
    None
}

/// `top_p_candidates` for one row on the fast path: the candidates are the first C tokens in rank
/// order with a positive weight, collected with a floor that rises to the C-th largest key.
/// Returns `lens`, or `None` for a row that weighs nothing (the reference path handles it).
pub(crate) fn candidates_row_fast<T: FloatElement>(
    row: &[T],
    top_p: f32,
    ids: &mut [i32],
    scores: &mut [f32],
) -> Option<i32> {
    let c = ids.len();
    FAST.with(|cell| {
        let s = &mut *cell.borrow_mut();
        s.candidates.clear();
        let mut floor = super::select::MIN_WEIGHT_KEY;
        let cap = 4 * c + 4 * BLOCK;
        let mut total = 0u64;
        for (b, block) in row.chunks(BLOCK).enumerate() {
            let (mass, max) = block_stats(block);
            total += mass;
            if max >= floor {
                let base = b * BLOCK;
                for (i, &v) in block.iter().enumerate() {
                    let key = key_of(v);
                    if key >= floor {
                        s.candidates.push((key, (base + i) as u32));
                    }
                }
                if s.candidates.len() >= cap {
                    floor = shrink_to_top_k(s, c);
                }
            }
        }
        if total == 0 {
            return None;
        }
        s.candidates
            .sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let chosen = &s.candidates[..c.min(s.candidates.len())];
        ids.fill(-1);
        scores.fill(0.0);
        let p_fixed = top_p_fixed(top_p);
        let mut lens = chosen.len() as i32;
        let mut mass = 0u64;
        let mut reached = false;
        for (i, &(key, id)) in chosen.iter().enumerate() {
            ids[i] = id as i32;
            scores[i] = f32::from_bits(key);
            mass += weight_of_key(key);
            if !reached && specula_backend_api::fixed_point::reaches_top_p(mass, p_fixed, total) {
                reached = true;
                lens = i as i32 + 1;
            }
        }
        Some(lens)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use specula_backend_api::fixed_point::key_weight;

    #[test]
    fn branch_free_weight_matches_the_reference() {
        let mut key = 0u32;
        while key <= 0x3f80_0000 {
            assert_eq!(weight_of_key(key), key_weight(key), "key {key:#x}");
            key += 0x1357;
        }
        for key in [
            0,
            1,
            0x2b80_0000,
            0x2b7f_ffff,
            0x3f00_0000,
            0x3f7f_ffff,
            0x3f80_0000,
        ] {
            assert_eq!(weight_of_key(key), key_weight(key), "key {key:#x}");
        }
    }

    /// Softmax-like rows that sum to about 1, with exact ties, in f32.
    fn normalized_rows(seed: u64, rows: usize, vocab: usize) -> Vec<Vec<f32>> {
        let mut x = seed;
        (0..rows)
            .map(|r| {
                let mut row: Vec<f32> = (0..vocab)
                    .map(|_| {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let u = (x >> 40) as f32 / (1u64 << 24) as f32;
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let u2 = ((x >> 40) as f32 + 0.5) / (1u64 << 24) as f32;
                        let gaussian =
                            (-2.0 * (u + 1e-7).ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
                        let logit = match r % 3 {
                            0 => (u * 16.0).floor(),
                            1 => 3.5 * gaussian, // LLM-like: Gaussian logits
                            _ => u * 14.0,
                        };
                        (logit - 14.0).exp()
                    })
                    .collect();
                let sum: f32 = row.iter().sum();
                row.iter_mut().for_each(|v| *v /= sum);
                row
            })
            .collect()
    }

    #[test]
    fn fast_path_agrees_with_the_reference_and_is_taken_on_normalized_rows() {
        use crate::ops::sample::sample_row_reference;
        let settings = [
            (0, 0.9f32),
            (50, 0.9),
            (0, 1.0),
            (1, 0.5),
            (7, 1.0),
            (2000, 0.95),
            (0, 0.3),
        ];
        let mut top_p_taken = 0;
        for (i, row) in normalized_rows(5, 30, 5003).iter().enumerate() {
            for (j, &(k, p)) in settings.iter().enumerate() {
                let draw = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul((i * 31 + j) as u64 + 1);
                let fast = sample_row_fast(row, k, p, draw);
                // Top-k and top_p = 1 always take the fast path; top-p alone may leave flat rows to
                // the histogram path, but must be taken on many rows (checked below).
                if k > 0 || p == 1.0 {
                    assert!(fast.is_some(), "row {i} (k {k}, p {p}) fell back");
                } else if fast.is_some() {
                    top_p_taken += 1;
                }
                if let Some(token) = fast {
                    assert_eq!(
                        token,
                        sample_row_reference(row, k, p, draw),
                        "row {i} k {k} p {p}"
                    );
                }
                let half: Vec<half::bf16> = row.iter().map(|&v| half::bf16::from_f32(v)).collect();
                if let Some(token) = sample_row_fast(&half, k, p, draw) {
                    let expected = sample_row_reference(&half, k, p, draw);
                    assert_eq!(token, expected, "bf16 row {i} k {k} p {p}");
                }
            }
        }
        assert!(
            top_p_taken >= 10,
            "the top-p fast path was taken on {top_p_taken} rows only"
        );
    }
    #[test]
    fn rows_far_from_a_distribution_fall_back() {
        // Total probability 0.01: the floor chosen for a distribution may cut into the kept prefix.
        let row: Vec<f32> = (0..1000).map(|i| 1e-5 * (1.0 + (i % 7) as f32)).collect();
        let draw = 12345;
        if let Some(token) = sample_row_fast(&row, 0, 0.9, draw) {
            assert_eq!(
                token,
                crate::ops::sample::sample_row_reference(&row, 0, 0.9, draw)
            );
        }
        // A row that weighs nothing is left to the reference path.
        assert_eq!(sample_row_fast(&[0.0f32; 8], 0, 0.9, draw), None);
    }

    #[test]
    fn fast_candidates_agree_with_the_reference() {
        use crate::ops::candidates::candidates_row_reference;
        for (i, row) in normalized_rows(9, 20, 3001).iter().enumerate() {
            for (c, p) in [(1usize, 0.9f32), (8, 0.9), (64, 0.5), (128, 1.0)] {
                let (mut ids, mut scores) = (vec![0; c], vec![0.0; c]);
                let lens = candidates_row_fast(row, p, &mut ids, &mut scores).expect("fast path");
                let (mut e_ids, mut e_scores) = (vec![0; c], vec![0.0; c]);
                let e_lens = candidates_row_reference(row, p, &mut e_ids, &mut e_scores);
                assert_eq!(
                    (lens, &ids, &scores),
                    (e_lens, &e_ids, &e_scores),
                    "row {i} c {c} p {p}"
                );
            }
        }
    }
}

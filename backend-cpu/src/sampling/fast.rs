//! The fast path of `top_k_top_p_sample` and `top_p_candidates` (exact; returns `None` when its
//! precondition does not hold, and the histogram path of `select` decides instead).
//!
//! One streaming pass over the row ([`scan::scan`]) gives the exact total weight, the exact
//! weight of each block of 256 tokens and the two largest rank keys of each *group* of 16 tokens
//! (the tokens of a block that share a vector lane): a sample of distinct tokens, two per group,
//! that holds the heaviest ones. That is enough to find, without sorting, a *floor* key that every
//! token of the kept set reaches:
//!
//! - top-k: the k-th largest sampled key. k distinct tokens are at or above it, so the k-th
//!   largest key of the row is at or above it too;
//! - top-p without top-k: the floor is where the sampled keys, largest first, reach the target
//!   mass. The sampled tokens at or above it are row tokens at or above it, so those tokens reach
//!   the target too and the kept prefix lies among them. A peaked row gets a floor at its top token;
//!   an LLM-like row about as many candidates as its kept set. A row whose kept set a sample
//!   predicts wider than the candidates can hold is decided in one pass of the band path
//!   (`band::one_pass`) before and instead of the scan;
//! - top_p = 1 without top-k keeps every positive-weight token: the draw locates its block from
//!   the block weights and scans that block only.
//!
//! A second pass ([`scan::collect`], reading the row from cache) gathers the tokens at or above
//! the floor, from the sub-blocks whose maximum reaches it. Every later decision works on those few
//! candidates: a selection for the k-th key, a three-digit radix selection for the shortest prefix
//! by mass, and a scan in id order for the draw. The decisions are the same integer decisions as
//! the histogram path; the tests compare both with a sort-based implementation of the contract.
//!
//! A row may be scanned by several threads at once (`parts > 1`) when there are fewer rows than
//! threads, so that a single row does not wait on one core.

use rayon::prelude::*;
use specula_backend_api::FloatElement;
use specula_backend_api::fixed_point::{scale_draw, top_p_fixed, top_p_target_mass};

use super::CandidateRow;
use super::histogram::{MIN_WEIGHT_KEY, Prefix};
use super::scan::{
    self, BLOCK, Candidate, Collect, GroupSample, Need, Want, block_counts, collect, floor_for,
    weight_of_key,
};

/// The largest top-k the fast path handles (larger ones use the histogram path).
const MAX_FAST_K: usize = 2048;
/// Top-p without top-k collects at most this many candidates; a larger kept set takes the band
/// path (`band`).
const BAND_FROM: usize = 4096;
/// Rows shorter than this are never split across threads.
const SPLIT_MIN: usize = 64 * BLOCK;

/// Per-thread buffers of the fast path, allocated on first use and reused for every row.
#[derive(Default)]
struct FastScratch {
    candidates: Vec<Candidate>,
    block: Vec<Candidate>,
    keys: Vec<u32>,
    block_mass: Vec<u64>,
    group_max: Vec<u32>,
    group_pos: Vec<u8>,
    /// The largest key of each block ([`block_maxima`]).
    block_max: Vec<u32>,
    bins: Vec<u64>,
}

impl FastScratch {
    /// Replaces `candidates` with the tokens of `row` whose key reaches `floor`, from the
    /// sample [`scan_row`] kept ([`collect`]); `false` as soon as there are more than `cap`.
    fn collect_above<T: FloatElement>(&mut self, row: &[T], floor: u32, cap: usize) -> bool {
        self.candidates.clear();
        let from = Collect {
            keys: &self.group_max,
            pos: &self.group_pos,
            floor,
            cap,
        };
        collect(row, from, &mut self.candidates)
    }
}

thread_local! {
    static FAST: std::cell::RefCell<FastScratch> = std::cell::RefCell::new(FastScratch::default());
}

/// Runs `f` with this thread's scratch. The buffers are moved out for the duration, so a nested
/// parallel section that runs another row on this thread finds fresh (empty) ones instead of a
/// borrowed cell.
fn with_fast<R>(f: impl FnOnce(&mut FastScratch) -> R) -> R {
    let mut scratch = FAST.with(|cell| cell.take());
    let result = f(&mut scratch);
    FAST.with(|cell| *cell.borrow_mut() = scratch);
    result
}

/// The first pass over a row, split into `parts` segments scanned in parallel when the row is long.
fn scan_row<T: FloatElement>(row: &[T], s: &mut FastScratch, parts: usize, need: Need) -> u64 {
    // Sized, not cleared: the pass writes every entry it is asked for.
    let (blocks, keys) = block_counts(row.len());
    s.block_mass.resize(blocks, 0);
    s.group_max.resize(keys, 0);
    s.group_pos.resize(keys, 0);
    if parts <= 1 || row.len() < SPLIT_MIN {
        let sample = GroupSample {
            keys: &mut s.group_max,
            pos: &mut s.group_pos,
        };
        return scan::scan(row, &mut s.block_mass, sample, need);
    }
    let blocks_per_part = blocks.div_ceil(parts);
    let keys_per_part = blocks_per_part * scan::GROUP_KEYS;
    row.par_chunks(blocks_per_part * BLOCK)
        .zip(s.block_mass.par_chunks_mut(blocks_per_part))
        .zip(s.group_max.par_chunks_mut(keys_per_part))
        .zip(s.group_pos.par_chunks_mut(keys_per_part))
        .map(|(((segment, block_mass), keys), pos)| {
            scan::scan(segment, block_mass, GroupSample { keys, pos }, need)
        })
        .sum()
}

/// A floor that at least k sampled keys (two per group) reach, so that the k-th largest key of the
/// row reaches it too; 0 when the sample does not say.
///
/// A top-k much smaller than the row's blocks is floored on the blocks' largest keys: k blocks
/// whose largest key reaches the floor are k distinct tokens that reach it, and a small top-k's
/// tokens lie mostly in distinct blocks, so that floor is about as high. It searches 593 keys
/// instead of the 18,992 of the whole sample (a row of 151936: 0.3 µs instead of 5.5–11 µs warm,
/// the most of top-k 50 after the scan).
fn count_floor(s: &mut FastScratch, k: usize) -> u32 {
    let blocks = s.group_max.len() / scan::GROUP_KEYS;
    if k * BLOCK_MAXIMA_PER_K <= blocks {
        block_maxima(&s.group_max, &mut s.block_max);
        if let Some(floor) = floor_for(&s.block_max, Want::Count(k), &mut s.keys) {
            return floor;
        }
    }
    floor_for(&s.group_max, Want::Count(k), &mut s.keys).unwrap_or(0)
}

/// A top-k is floored on the blocks' largest keys when the row has at least this many blocks per
/// kept token ([`count_floor`]).
const BLOCK_MAXIMA_PER_K: usize = 4;

/// The largest key of each block: of its groups' largest keys (the first [`scan::GROUPS`] of its
/// [`scan::GROUP_KEYS`]).
fn block_maxima(group_keys: &[u32], maxima: &mut Vec<u32>) {
    maxima.clear();
    maxima.extend(
        group_keys
            .chunks_exact(scan::GROUP_KEYS)
            .map(|keys| keys[..scan::GROUPS].iter().copied().max().unwrap_or(0)),
    );
}

/// A [`Prefix`] over candidates that are grouped by block but not in id order within a block: the
/// tokens with a key above `key`, and those with `key` itself up to id `last_id`.
#[derive(Clone, Copy, Debug)]
struct Boundary {
    key: u32,
    last_id: u32,
}

impl Boundary {
    /// The boundary of `prefix` among `candidates` (which hold every token at its key).
    fn of(prefix: &Prefix, candidates: &[Candidate], ids: &mut Vec<u32>) -> Boundary {
        ids.clear();
        ids.extend(
            candidates
                .iter()
                .filter(|c| c.key == prefix.key)
                .map(|c| c.id),
        );
        let last_id = match prefix.take {
            0 => {
                return Boundary {
                    key: prefix.key.saturating_add(1),
                    last_id: 0,
                };
            }
            take if take > ids.len() => u32::MAX,
            take => *ids.select_nth_unstable(take - 1).1,
        };
        Boundary {
            key: prefix.key,
            last_id,
        }
    }

    #[inline(always)]
    fn contains(&self, c: &Candidate) -> bool {
        c.key > self.key || (c.key == self.key && c.id <= self.last_id)
    }
}

/// Keeps the first `k` candidates in rank order (key descending, id ascending).
fn keep_top_k(s: &mut FastScratch, k: usize) {
    if s.candidates.len() <= k {
        return;
    }
    s.keys.clear();
    s.keys.extend(s.candidates.iter().map(|c| c.key));
    let kth = *s.keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a)).1;
    let above = s.candidates.iter().filter(|c| c.key > kth).count();
    let prefix = Prefix {
        key: kth,
        take: k - above,
        count: k,
        mass: u64::MAX,
    };
    let boundary = Boundary::of(&prefix, &s.candidates, &mut s.keys);
    s.candidates.retain(|c| boundary.contains(c));
}

/// The shortest prefix (in rank order) of `candidates` whose mass reaches `target` > 0, by a radix
/// selection on their keys in three digits of 11, 11 and 10 bits; `None` when all of them do not
/// reach it.
fn prefix_by_mass(
    candidates: &[Candidate],
    target: u64,
    keys: &mut Vec<u32>,
    bins: &mut Vec<u64>,
) -> Option<Prefix> {
    const DIGITS: [(u32, u32); 3] = [(21, 11), (10, 11), (0, 10)];
    keys.clear();
    keys.extend(candidates.iter().map(|c| c.key));
    let mut before = 0u64;
    let mut key = 0u32;
    for (shift, bits) in DIGITS {
        let mask = (1u32 << bits) - 1;
        // Bins only over the digits present (candidates above a floor span a narrow range).
        let (low, high) = keys.iter().fold((mask, 0), |(low, high), &k| {
            let d = (k >> shift) & mask;
            (low.min(d), high.max(d))
        });
        if low > high {
            return None; // no keys
        }
        bins.clear();
        bins.resize((high - low + 1) as usize, 0);
        for &k in keys.iter() {
            bins[(((k >> shift) & mask) - low) as usize] += weight_of_key(k);
        }
        let mut crossing = None;
        for (bin, &mass) in bins.iter().enumerate().rev() {
            if before + mass >= target {
                crossing = Some(low + bin as u32);
                break;
            }
            before += mass;
        }
        let digit = crossing?;
        key |= digit << shift;
        keys.retain(|&k| (k >> shift) & mask == digit);
    }
    let weight = weight_of_key(key);
    if weight == 0 {
        return None; // unreachable for a positive target: zero weights never cross it
    }
    let take = (target - before).div_ceil(weight);
    Some(Prefix {
        key,
        take: take as usize,
        count: usize::MAX,
        mass: before + take * weight,
    })
}

/// Draws among the candidates that are members of `prefix` (of mass `prefix.mass`), in ascending
/// id order. The candidates are grouped by block: the block where the draw falls is found from
/// the blocks' kept masses, and only its few candidates are put in id order.
fn draw_among(
    candidates: &[Candidate],
    prefix: &Prefix,
    draw: u64,
    ids: &mut Vec<u32>,
    block: &mut Vec<Candidate>,
) -> Option<usize> {
    let boundary = Boundary::of(prefix, candidates, ids);
    let t = scale_draw(draw, prefix.mass);
    let mut cumulative = 0u64;
    let mut rest = candidates;
    while let Some(first) = rest.first() {
        let b = first.id / BLOCK as u32;
        let run = rest
            .iter()
            .position(|c| c.id / BLOCK as u32 != b)
            .unwrap_or(rest.len());
        let (here, next) = rest.split_at(run);
        let mass: u64 = here
            .iter()
            .filter(|c| boundary.contains(c))
            .map(|c| weight_of_key(c.key))
            .sum();
        if cumulative + mass > t {
            block.clear();
            block.extend(here.iter().filter(|c| boundary.contains(c)));
            block.sort_unstable_by_key(|c| c.id);
            for c in block.iter() {
                cumulative += weight_of_key(c.key);
                if cumulative > t {
                    return Some(c.id as usize);
                }
            }
            return None;
        }
        cumulative += mass;
        rest = next;
    }
    None
}

/// Samples a row on the fast path, or returns `None` when the histogram path must decide.
/// `parts > 1` lets the first pass use that many threads.
pub(crate) fn sample_prob_row_fast<T: FloatElement>(
    row: &[T],
    top_k: i32,
    top_p: f32,
    draw: u64,
    parts: usize,
) -> Option<usize> {
    let vocab = row.len();
    let top_k = usize::try_from(top_k).ok().filter(|&k| k > 0 && k < vocab);
    if top_k.is_some_and(|k| k > MAX_FAST_K) {
        return None;
    }
    let p_fixed = top_p_fixed(top_p);
    let keep_all = top_k.is_none() && p_fixed == 1 << 24;
    with_fast(|s| {
        if let Some(k) = top_k {
            // Top-k decides on its candidates' weights alone: no row total needed.
            scan_row(row, s, parts, Need::Sample);
            return sample_top_k(row, s, k, p_fixed, draw);
        }
        if !keep_all {
            // A band the sample places: one pass of the band path, no scan.
            let one_pass = super::band::sample_top_p_one_pass(row, p_fixed, draw);
            if one_pass != super::band::OnePass::Unplaced {
                return one_pass.token();
            }
        }
        let need = if keep_all { Need::Weights } else { Need::Both };
        let total = scan_row(row, s, parts, need);
        if total == 0 {
            return None; // degenerate rows: the reference path finds the first token in rank order
        }
        if keep_all {
            draw_from_blocks(row, &s.block_mass, total, draw)
        } else {
            sample_top_p(row, s, total, p_fixed, draw)
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
                cumulative += weight_of_key(scan::key_of(v));
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

/// top-k (then top-p): the candidates are the tokens at or above the k-th sampled key.
fn sample_top_k<T: FloatElement>(
    row: &[T],
    s: &mut FastScratch,
    k: usize,
    p_fixed: u64,
    draw: u64,
) -> Option<usize> {
    let floor = count_floor(s, k);
    if !s.collect_above(row, floor, 4 * k + 4096) {
        return None; // many ties at the floor: the histogram path decides
    }
    keep_top_k(s, k);
    let survivors = &s.candidates;
    let mass: u64 = survivors.iter().map(|c| weight_of_key(c.key)).sum();
    if mass == 0 {
        // Every survivor weighs nothing: the first in rank order (largest key, then lowest id).
        let first = survivors.iter().copied().reduce(|best, c| {
            if (c.key, std::cmp::Reverse(c.id)) > (best.key, std::cmp::Reverse(best.id)) {
                c
            } else {
                best
            }
        })?;
        return Some(first.id as usize);
    }
    let target = top_p_target_mass(p_fixed, mass);
    let prefix = prefix_by_mass(survivors, target, &mut s.keys, &mut s.bins)?;
    draw_among(survivors, &prefix, draw, &mut s.keys, &mut s.block)
}

/// top-p only. The floor is a key at which the *sampled keys* (two per group) at or above it reach
/// the target mass: the tokens at or above it include those sampled tokens, so their mass reaches
/// the target too, and the kept prefix lies among them. The sample's mass is an f32/f64 estimate,
/// so the exact mass of the collected tokens is checked before it is relied on.
fn sample_top_p<T: FloatElement>(
    row: &[T],
    s: &mut FastScratch,
    total: u64,
    p_fixed: u64,
    draw: u64,
) -> Option<usize> {
    let target = top_p_target_mass(p_fixed, total);
    // A little above the target, for the rounding of the estimate.
    let wanted = target as f64 / (1u64 << 40) as f64 * (1.0 + 1e-5);
    // When the sample falls short, every positive weight is needed.
    let floor = floor_for(&s.group_max, Want::Mass(wanted), &mut s.keys)
        .map_or(MIN_WEIGHT_KEY, |key| key.max(MIN_WEIGHT_KEY));
    // The sampled keys at or above the floor are a lower bound on the tokens there: when they
    // alone pass the cap, the collect would fail (after reading most of the row), so skip it.
    let sampled = s.group_max.iter().filter(|&&key| key >= floor).count();
    if sampled > BAND_FROM || !s.collect_above(row, floor, BAND_FROM) {
        // A large kept set: the band path weighs it without collecting it.
        return super::band::sample_top_p(row, total, p_fixed, draw);
    }
    // `None` when the estimate was wrong (rows far from a distribution): the band path decides.
    match prefix_by_mass(&s.candidates, target, &mut s.keys, &mut s.bins) {
        Some(prefix) => draw_among(&s.candidates, &prefix, draw, &mut s.keys, &mut s.block),
        None => super::band::sample_top_p(row, total, p_fixed, draw),
    }
}

/// `top_p_candidates` for one row on the fast path: the candidates are the first C tokens in rank
/// order with a positive weight, collected above the C-th sampled key.
/// Returns `lens`, or `None` for a row the histogram path must handle.
pub(crate) fn candidates_row_fast<T: FloatElement>(
    row: &[T],
    top_p: f32,
    out: &mut CandidateRow<'_>,
    parts: usize,
) -> Option<i32> {
    let c = out.capacity();
    with_fast(|s| {
        let total = scan_row(row, s, parts, Need::Both);
        if total == 0 || c == 0 {
            return None;
        }
        let floor = count_floor(s, c).max(MIN_WEIGHT_KEY);
        let cap = 4 * c + 4096;
        if !s.collect_above(row, floor, cap) {
            return None;
        }
        keep_top_k(s, c);
        s.candidates
            .sort_unstable_by(|a, b| b.key.cmp(&a.key).then(a.id.cmp(&b.id)));
        let members = s
            .candidates
            .iter()
            .map(|&Candidate { key, id }| (id, f32::from_bits(key), weight_of_key(key)));
        Some(out.fill(members, top_p, total))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::lcg::Lcg;

    /// Softmax-like rows that sum to about 1, with exact ties, in f32.
    fn normalized_rows(seed: u64, rows: usize, vocab: usize) -> Vec<Vec<f32>> {
        let mut lcg = Lcg(seed);
        (0..rows)
            .map(|r| {
                let mut row: Vec<f32> = (0..vocab)
                    .map(|_| {
                        let u = lcg.unit();
                        let u2 = ((lcg.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32;
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
        use crate::ops::top_k_top_p_sample::sample_prob_row_histogram;
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
                let fast = sample_prob_row_fast(row, k, p, draw, 1);
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
                        sample_prob_row_histogram(row, k, p, draw),
                        "row {i} k {k} p {p}"
                    );
                }
                let half: Vec<half::bf16> = row.iter().map(|&v| half::bf16::from_f32(v)).collect();
                if let Some(token) = sample_prob_row_fast(&half, k, p, draw, 1) {
                    let expected = sample_prob_row_histogram(&half, k, p, draw);
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
        if let Some(token) = sample_prob_row_fast(&row, 0, 0.9, draw, 1) {
            assert_eq!(
                token,
                crate::ops::top_k_top_p_sample::sample_prob_row_histogram(&row, 0, 0.9, draw)
            );
        }
        // A row that weighs nothing is left to the reference path.
        assert_eq!(sample_prob_row_fast(&[0.0f32; 8], 0, 0.9, draw, 1), None);
    }

    #[test]
    fn fast_candidates_agree_with_the_reference() {
        use crate::ops::top_p_candidates::candidates_row_histogram;
        for (i, row) in normalized_rows(9, 20, 3001).iter().enumerate() {
            for (c, p) in [(1usize, 0.9f32), (8, 0.9), (64, 0.5), (128, 1.0)] {
                let (mut ids, mut scores) = (vec![0; c], vec![0.0; c]);
                let mut out = CandidateRow {
                    ids: &mut ids,
                    scores: &mut scores,
                };
                let lens = candidates_row_fast(row, p, &mut out, 1).expect("fast path");
                let (mut e_ids, mut e_scores) = (vec![0; c], vec![0.0; c]);
                let mut expected = CandidateRow {
                    ids: &mut e_ids,
                    scores: &mut e_scores,
                };
                let e_lens = candidates_row_histogram(row, p, &mut expected);
                assert_eq!(
                    (lens, &ids, &scores),
                    (e_lens, &e_ids, &e_scores),
                    "row {i} c {c} p {p}"
                );
            }
        }
    }

    /// Rows of every shape the fast path meets: LLM-like, peaked (one token holds 95 %), flat,
    /// with long runs of ties, and far from a distribution (total 0.01).
    fn shaped_rows(vocab: usize) -> Vec<Vec<f32>> {
        let mut rows = normalized_rows(17, 3, vocab);
        // A tail of distinct small values under one token of 0.95.
        let tail = 0.05 / (vocab - 1) as f32;
        let mut peaked: Vec<f32> = (0..vocab)
            .map(|i| tail * (0.5 + (i * 7919 % 1000) as f32 / 1000.0))
            .collect();
        peaked[vocab / 3] = 0.95;
        rows.push(peaked);
        rows.push(vec![1.0 / vocab as f32; vocab]);
        let ties: Vec<f32> = (0..vocab).map(|i| [0.0, 1e-6, 2e-5, 4e-5][i % 4]).collect();
        rows.push(ties);
        let small: Vec<f32> = rows[1].iter().map(|v| v * 0.01).collect();
        rows.push(small);
        rows
    }

    #[test]
    fn split_rows_and_every_row_shape_agree_with_the_reference() {
        use crate::ops::top_k_top_p_sample::sample_prob_row_histogram;
        use crate::ops::top_p_candidates::candidates_row_histogram;
        // Long enough to be split across threads.
        let vocab = SPLIT_MIN * 2 + 77;
        for (i, row) in shaped_rows(vocab).iter().enumerate() {
            let half: Vec<half::f16> = row.iter().map(|&v| half::f16::from_f32(v)).collect();
            for (j, &(k, p)) in [
                (0, 0.9f32),
                (0, 0.5),
                (0, 0.99),
                (50, 0.9),
                (1, 1.0),
                (0, 1.0),
            ]
            .iter()
            .enumerate()
            {
                let draw = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul((i * 7 + j) as u64 + 3);
                let expected = sample_prob_row_histogram(row, k, p, draw);
                for parts in [1, 2, 3] {
                    if let Some(token) = sample_prob_row_fast(row, k, p, draw, parts) {
                        assert_eq!(token, expected, "row {i} k {k} p {p} parts {parts}");
                    }
                }
                let expected = sample_prob_row_histogram(&half, k, p, draw);
                if let Some(token) = sample_prob_row_fast(&half, k, p, draw, 2) {
                    assert_eq!(token, expected, "f16 row {i} k {k} p {p}");
                }
            }
            // LLM-like (Gaussian logits) and peaked rows must take the fast path; rows whose kept
            // set holds more than two tokens of most groups (long runs of ties) may not.
            if i == 1 || i == 3 {
                assert!(
                    sample_prob_row_fast(row, 0, 0.9, 12345, 2).is_some(),
                    "row {i}"
                );
                assert!(
                    sample_prob_row_fast(row, 50, 0.9, 12345, 1).is_some(),
                    "row {i}"
                );
            }
            for (c, p) in [(1usize, 0.9f32), (8, 0.9), (64, 0.5)] {
                let (mut ids, mut scores) = (vec![0; c], vec![0.0; c]);
                let (mut e_ids, mut e_scores) = (vec![0; c], vec![0.0; c]);
                let mut expected = CandidateRow {
                    ids: &mut e_ids,
                    scores: &mut e_scores,
                };
                let e_lens = candidates_row_histogram(row, p, &mut expected);
                let mut out = CandidateRow {
                    ids: &mut ids,
                    scores: &mut scores,
                };
                if let Some(lens) = candidates_row_fast(row, p, &mut out, 2) {
                    assert_eq!(
                        (lens, &ids, &scores),
                        (e_lens, &e_ids, &e_scores),
                        "row {i} c {c} p {p}"
                    );
                }
            }
        }
    }

    /// A top-k small against the row's blocks is floored on the blocks' largest keys
    /// (`count_floor`): on rows whose top tokens lie in distinct blocks, in a few blocks, in one
    /// block, and on long runs of ties, every top-k on either side of the switch decides as the
    /// histogram path, on the fast path unless thousands of tokens tie at the top.
    #[test]
    fn small_top_k_on_block_maxima_agrees_with_the_reference() {
        use crate::ops::top_k_top_p_sample::sample_prob_row_histogram;
        let vocab = 151_936;
        let blocks = vocab / BLOCK;
        let mut rows = normalized_rows(23, 3, vocab);
        // The 200 largest values in the first block and the next (clustered), then in one block.
        for width in [2 * BLOCK, BLOCK] {
            let mut clustered = rows[1].clone();
            let top = clustered.iter().copied().fold(0.0f32, f32::max);
            for (i, v) in clustered[..width.min(200)].iter_mut().enumerate() {
                *v = top * (2.0 + i as f32 / 200.0);
            }
            rows.push(clustered);
        }
        // Ties: three values, the largest held by 300 tokens spread over the row.
        rows.push(
            (0..vocab)
                .map(|i| match i % 509 {
                    0 => 4e-4,
                    1..=7 => 1e-5,
                    _ => 5e-6,
                })
                .collect(),
        );
        let switch = blocks / BLOCK_MAXIMA_PER_K;
        for (i, row) in rows.iter().enumerate() {
            for (j, k) in [1, 8, 50, switch - 1, switch, switch + 1, 300]
                .into_iter()
                .enumerate()
            {
                for p in [0.9f32, 1.0] {
                    let draw = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul((i * 17 + j) as u64 + 5);
                    let fast = sample_prob_row_fast(row, k as i32, p, draw, 1);
                    let expected = sample_prob_row_histogram(row, k as i32, p, draw);
                    // Rows whose top value thousands of tokens share fall back (more candidates
                    // than the fast path collects); the others do not.
                    let many_ties = i == 0 || i == 5;
                    assert!(fast.is_some() || many_ties, "row {i} k {k} p {p} fell back");
                    if let Some(token) = fast {
                        assert_eq!(token, expected, "row {i} k {k} p {p}");
                    }
                }
            }
        }
    }
}

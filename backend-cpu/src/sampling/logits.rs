//! Sampling from logits rows (`docs/semantics.md` §4b): exact, without a softmax.
//!
//! A token's weight depends on its logit, the row maximum and the temperature only, and weights
//! never increase down the rank order, so the tokens of positive weight are a prefix of the rank
//! order and every decision (top-k, top-p, the draw) works on them alone:
//!
//! - **top-k** (`0 < k < V`, `k ≤ MAX_FAST_K`): one streaming pass keeps the k best-ranked tokens
//!   with an adaptive floor (a chunk of 64 logits is looked at only when one of them beats the
//!   current k-th key; on an f32 row a vector loop walks from such chunk to such chunk,
//!   [`floor_scan`]), so the pass runs at memory speed; only those k tokens are weighed.
//! - **otherwise**: one pass for the row maximum, then a pass that weighs every token a float
//!   bound cannot rule out (a logit more than `40 / c` below the maximum weighs 0).
//!
//! The weights are the integer steps of `specula_backend_api::logit_weights`, applied token by
//! token; the kept set and the draw are the contract's integer decisions. The tests compare every
//! path with the plain reference device.

use std::cmp::Ordering;

mod floor_scan;
pub(crate) mod lanes;
mod unranked;

pub(crate) use unranked::RowHints;

use super::CandidateRow;
use super::scan::{compiled_for, dispatch};
#[cfg(target_arch = "x86_64")]
use super::scan::{has_avx2, has_avx512};

use specula_backend_api::FloatElement;
use specula_backend_api::abi::{TOP_P_BITS, WEIGHT_BITS};
use specula_backend_api::fixed_point::{reaches_top_p, scale_draw, top_p_fixed};
use specula_backend_api::logit_weights::{
    EXP2_COEFFICIENTS, GAP_FRACTION_BITS, GAP_LIMIT, RowScale, logit_rank_key, row_scale,
    sanitize_logit,
};

/// The weight of a logit equal to the row maximum: `2^40`.
const FULL: u64 = 1 << WEIGHT_BITS;
/// The largest top-k the streaming top-k pass handles (larger ones weigh the whole row).
const MAX_FAST_K: usize = 4096;
/// Logits per chunk of the streaming passes.
pub(crate) const CHUNK: usize = 64;
/// The bins of the top-p selection: the members' key range in at most `2^BIN_BITS` bins.
const BIN_BITS: u32 = 12;
/// `2^BIN_BITS`.
const BINS: usize = 1 << BIN_BITS;
/// Sets at most this large find their top-p boundary by sorting, without bins.
const SMALL_SET: usize = 256;

/// A token of positive weight: its rank key, id and weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Weighted {
    /// `logit_rank_key` of the logit.
    pub key: u32,
    /// The token id.
    pub id: u32,
    /// Its §4b weight (positive).
    pub weight: u64,
}

/// Rank order: key descending, then id ascending (`Less` = ranks first).
fn rank_cmp(a: &(u32, u32), b: &(u32, u32)) -> Ordering {
    b.0.cmp(&a.0).then(a.1.cmp(&b.1))
}

/// How the tokens of a logits row weigh (`docs/semantics.md` §4b steps 2 and 3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Weighing {
    /// Every logit is −inf or NaN: every weight is 0.
    Zero,
    /// Some logit is +inf: those weigh `2^40`, every other token 0.
    PosInf,
    /// `T == 0`: the first token of the row maximum weighs `2^40`, every other token 0.
    Argmax {
        /// The id of that token.
        first: usize,
    },
    /// `T == +inf` (every finite logit weighs `2^40`) or a finite `T > 0`.
    Scaled {
        /// The sanitized row maximum (finite).
        max: f32,
        /// The row's scale.
        scale: RowScale,
        /// The constants of the vector kernels, when they apply to the row.
        lanes: Option<lanes::RowLanes>,
    },
}

impl Weighing {
    /// The weighing of `row` at (device) temperature `t`: one pass for the maximum (a second,
    /// short one for the first maximum at `T == 0`: the first token in rank order, ranked by the
    /// logit itself).
    pub(crate) fn of<T: FloatElement>(row: &[T], t: f32) -> Self {
        let raw = raw_max(row);
        Self::with_max(sanitize_logit(raw), t, || {
            row.iter().position(|&l| l.to_f32() == raw).unwrap_or(0)
        })
    }

    /// The weighing of a row whose sanitized maximum is `max`; `first` finds the first token in
    /// rank order (asked only at `T == 0`).
    pub(crate) fn with_max(max: f32, t: f32, first: impl FnOnce() -> usize) -> Self {
        if max == f32::INFINITY {
            return Weighing::PosInf;
        }
        if max == f32::NEG_INFINITY {
            return Weighing::Zero;
        }
        match row_scale(t) {
            RowScale::ArgmaxOnly => Weighing::Argmax { first: first() },
            scale => Weighing::Scaled {
                max,
                scale,
                lanes: lanes::RowLanes::new(max, scale, false),
            },
        }
    }

    /// The weight of token `id` whose logit is `l`.
    #[inline(always)]
    pub(crate) fn weight(&self, id: usize, l: f32) -> u64 {
        match *self {
            Weighing::Zero => 0,
            Weighing::PosInf => {
                if l == f32::INFINITY {
                    FULL
                } else {
                    0
                }
            }
            Weighing::Argmax { first } => {
                if id == first {
                    FULL
                } else {
                    0
                }
            }
            Weighing::Scaled { max, scale, .. } => weight_below(l, max, scale),
        }
    }

    /// A sanitized logit below which every token weighs 0 (NaN weighs 0 too): tokens with a
    /// smaller sanitized logit need not be weighed.
    fn zero_below(&self) -> f32 {
        match *self {
            Weighing::Zero | Weighing::PosInf => f32::INFINITY,
            // Only `first` weighs; its logit is the maximum.
            Weighing::Argmax { .. } => f32::INFINITY,
            Weighing::Scaled { max, scale, .. } => zero_bound(max, scale),
        }
    }
}

/// The weight of the finite-or-not logit `l` in a row of finite sanitized maximum `max`.
#[inline(always)]
fn weight_below(l: f32, max: f32, scale: RowScale) -> u64 {
    specula_backend_api::logit_weights::scaled_weight(l, max, scale)
}

/// A bound `b` such that a sanitized logit `s < b` weighs 0 at `scale` below `max`: the gap
/// reaches `40 · 2^F` once `d · c ≥ 40`, and `d = max ⊖ s` is within a relative `2^-24` of
/// `max − s`; the bound keeps a 1 % margin and is rounded down to an f32.
fn zero_bound(max: f32, scale: RowScale) -> f32 {
    let RowScale::Scaled { c32, e } = scale else {
        // T == +inf: every finite logit weighs 2^40.
        return f32::NEG_INFINITY;
    };
    let c = c32 as f64 * f64::powi(2.0, e);
    let bound = f64::from(max) - 1.01 * 40.0 / c;
    round_down(bound)
}

/// The largest f32 at or below `x` (−inf below the f32 range).
fn round_down(x: f64) -> f32 {
    if x.is_nan() || x < f64::from(f32::MIN) {
        return f32::NEG_INFINITY;
    }
    let y = x as f32;
    if f64::from(y) > x { y.next_down() } else { y }
}

/// The largest logit of the row, NaN ignored (−inf for an empty or all-NaN row). Lane-parallel,
/// so that the compiler vectorizes it.
fn raw_max<T: FloatElement>(row: &[T]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = row.chunks_exact(16);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            let x = x.to_f32();
            *lane = if x > *lane { x } else { *lane };
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .map(|x| x.to_f32())
        .fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m });
    lanes
        .into_iter()
        .fold(tail, |m, x| if x > m { x } else { m })
}

/// Whether some raw logit of `chunk` is not below `lo` (NaN counts: it is not below anything).
/// A plain compare, so the loop vectorises; the exact test follows for the chunks it keeps.
#[inline(always)]
fn any_not_below<T: FloatElement>(chunk: &[T], lo: f32) -> bool {
    chunk.iter().fold(false, |any, &x| {
        // `!(x < lo)`: at or above `lo`, or NaN — one unordered compare a lane.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        let not_below = !(x.to_f32() < lo);
        any | not_below
    })
}

/// The rank key of a logit that is not NaN (`logit_rank_key`), branch-free.
#[inline(always)]
pub(crate) fn key_select(l: f32) -> u32 {
    let bits = (l + 0.0).to_bits();
    let sign = ((bits as i32) >> 31) as u32;
    bits ^ (sign | 0x8000_0000)
}

/// `logit_rank_key` of any logit, branch-free: NaN reads as −inf.
#[inline(always)]
pub(crate) fn logit_key_select(l: f32) -> u32 {
    key_select(if l.is_nan() { f32::NEG_INFINITY } else { l })
}

/// The logit of a rank key (the inverse of `logit_rank_key`; never NaN, −0 as +0). Its weight
/// is that of its sanitized value.
pub(crate) fn value_of_key(key: u32) -> f32 {
    if key >> 31 == 1 {
        f32::from_bits(key & 0x7fff_ffff)
    } else {
        f32::from_bits(!key)
    }
}

/// The `k` best-ranked tokens of `row` as `(key, id)`, in rank order (`0 < k < row.len()`): one
/// streaming pass with an adaptive floor, the k-th key among the tokens kept so far.
/// Runs the loop compiled for the widest vector unit of the CPU, as the fused processed pass does.
pub(crate) fn top_ranked<T: FloatElement>(row: &[T], k: usize, out: &mut Vec<(u32, u32)>) {
    let ranked = TopRanked::new(k, std::mem::take(out));
    *out = dispatch!(top_ranked_generic::<T>(row, ranked)
        via top_ranked_avx512, top_ranked_avx2);
}

compiled_for!(avx512, fn top_ranked_avx512 [T: FloatElement]
    (row: &[T], ranked: TopRanked) -> Vec<(u32, u32)> = top_ranked_generic [T]);
compiled_for!(avx2, fn top_ranked_avx2 [T: FloatElement]
    (row: &[T], ranked: TopRanked) -> Vec<(u32, u32)> = top_ranked_generic [T]);

/// [`top_ranked`] as written: an f32 row walks from chunk to chunk with a logit not below the
/// floor ([`top_ranked_f32`]), any other row looks at each chunk.
#[inline(always)]
fn top_ranked_generic<T: FloatElement>(row: &[T], mut ranked: TopRanked) -> Vec<(u32, u32)> {
    if T::DTYPE == specula_backend_api::DType::F32
        && let Ok(values) = bytemuck::try_cast_slice::<T, f32>(row)
    {
        return top_ranked_f32(values, ranked);
    }
    for (c, chunk) in row.chunks(CHUNK).enumerate() {
        if !ranked.skips(chunk) {
            ranked.push(c * CHUNK, chunk);
        }
    }
    ranked.finish()
}

/// [`top_ranked`] of an f32 row: the vector walk ([`floor_scan`]) finds the next chunk with a
/// logit not below the floor, and only that chunk's such logits are offered (one compare of
/// their keys each); before there is a floor every logit is. The logits past the last whole
/// chunk go through [`TopRanked::push`].
#[inline(always)]
fn top_ranked_f32(row: &[f32], mut ranked: TopRanked) -> Vec<(u32, u32)> {
    let walk = floor_scan::floor_loop();
    let whole = row.len() / CHUNK;
    let mut c = 0;
    while c < whole {
        let mask = match ranked.floor {
            None => u64::MAX,
            Some((_, lo)) => {
                // SAFETY: `floor_loop` returns a loop whose features the CPU has.
                let (at, mask) = unsafe { walk(row, c, lo) };
                c = at;
                mask
            }
        };
        let mut rest = mask;
        while rest != 0 {
            let id = c * CHUNK + rest.trailing_zeros() as usize;
            ranked.offer(id, logit_key_select(row[id]));
            rest &= rest - 1;
        }
        ranked.settle();
        c += 1;
    }
    let tail = &row[(whole * CHUNK).min(row.len())..];
    if !tail.is_empty() && !ranked.skips(tail) {
        ranked.push(whole * CHUNK, tail);
    }
    ranked.finish()
}

/// The state of [`top_ranked`]'s streaming pass, fed chunk by chunk (the fused processing feeds
/// it processed chunks it makes on the fly).
pub(crate) struct TopRanked {
    k: usize,
    capacity: usize,
    /// The k-th key so far and a raw bound below every logit that could beat it.
    floor: Option<(u32, f32)>,
    out: Vec<(u32, u32)>,
}

impl TopRanked {
    /// An empty pass keeping `k > 0` tokens, reusing `out`'s memory.
    pub(crate) fn new(k: usize, mut out: Vec<(u32, u32)>) -> Self {
        out.clear();
        TopRanked {
            k,
            capacity: (2 * k).max(k + 256),
            floor: None,
            out,
        }
    }

    /// Whether no logit of `chunk` can enter the kept set (a vectorised compare).
    #[inline(always)]
    pub(crate) fn skips<T: FloatElement>(&self, chunk: &[T]) -> bool {
        self.floor.is_some_and(|(_, lo)| !any_not_below(chunk, lo))
    }

    /// Whether the pass has a floor yet (before it, every token offered is kept).
    #[inline(always)]
    pub(crate) fn has_floor(&self) -> bool {
        self.floor.is_some()
    }

    /// The tokens of `chunk` (bit `j`: token `j`, 1 to 64 of them) whose raw logit is not below
    /// the floor's raw bound (NaN included), every token before there is a floor: when values
    /// are only ever lowered, no other token of the chunk can enter.
    #[inline(always)]
    pub(crate) fn candidates<T: FloatElement>(&self, chunk: &[T]) -> u64 {
        match self.floor {
            None => u64::MAX >> (64 - chunk.len().clamp(1, 64)),
            Some((_, lo)) => chunk.iter().enumerate().fold(0u64, |mask, (j, &x)| {
                #[allow(clippy::neg_cmp_op_on_partial_ord)]
                let not_below = !(x.to_f32() < lo);
                mask | u64::from(not_below) << j
            }),
        }
    }

    /// Offers token `id` by its rank key, without raising the floor: a caller offering tokens
    /// one at a time calls [`settle`](Self::settle) after each batch of them.
    #[inline(always)]
    pub(crate) fn offer(&mut self, id: usize, key: u32) {
        // A token tied with the floor key comes later in id order than the kept one: out.
        if self.floor.is_none_or(|(f, _)| key > f) {
            self.out.push((key, id as u32));
        }
    }

    /// Raises the floor once enough tokens were offered (after [`offer`](Self::offer)s).
    #[inline(always)]
    pub(crate) fn settle(&mut self) {
        self.refloor();
    }

    /// Offers the tokens of `chunk` (ids from `first`).
    #[inline(always)]
    pub(crate) fn push<T: FloatElement>(&mut self, first: usize, chunk: &[T]) {
        let mut keys = [0u32; CHUNK];
        for (key, &x) in keys.iter_mut().zip(chunk) {
            *key = logit_key_select(x.to_f32());
        }
        self.push_keys(first, &keys[..chunk.len().min(CHUNK)]);
    }

    /// Offers tokens by their rank keys, `keys[j]` that of token `first + j` (1 to 64 of them),
    /// for a caller that has the keys already: one vectorised compare with the floor
    /// key, then a push per token above it.
    #[inline(always)]
    pub(crate) fn push_keys(&mut self, first: usize, keys: &[u32]) {
        if keys.is_empty() {
            return;
        }
        let above = match self.floor {
            None => u64::MAX >> (64 - keys.len()),
            Some((f, _)) => keys
                .iter()
                .enumerate()
                .fold(0u64, |above, (j, &key)| above | u64::from(key > f) << j),
        };
        let mut rest = above;
        // A token tied with the floor key comes later in id order than the kept one: out.
        while rest != 0 {
            let j = rest.trailing_zeros() as usize;
            self.out.push((keys[j], (first + j) as u32));
            rest &= rest - 1;
        }
        self.refloor();
    }

    /// Once the buffer is full, keeps its `k` best and raises the floor to the k-th key.
    #[inline(always)]
    fn refloor(&mut self) {
        if self.out.len() >= self.capacity {
            keep_best(&mut self.out, self.k);
            let f = self.out[self.k - 1].0;
            // A logit beats the key `f` only if it is above `f`'s logit.
            self.floor = Some((f, value_of_key(f).next_up()));
        }
    }

    /// The `k` best-ranked tokens offered, in rank order.
    pub(crate) fn finish(mut self) -> Vec<(u32, u32)> {
        keep_best(&mut self.out, self.k);
        self.out.sort_unstable_by(rank_cmp);
        self.out
    }
}

/// Keeps the `k` best-ranked entries of `out` (in no particular order).
fn keep_best(out: &mut Vec<(u32, u32)>, k: usize) {
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, rank_cmp);
        out.truncate(k);
    }
}

/// Every token of positive weight, in id order, and their total weight.
pub(crate) fn positive_tokens<T: FloatElement>(
    row: &[T],
    weighing: &Weighing,
    out: &mut Vec<Weighted>,
) -> u64 {
    out.clear();
    match *weighing {
        Weighing::Zero => return 0,
        Weighing::Argmax { first } => {
            let key = logit_rank_key(row[first].to_f32());
            out.push(Weighted {
                key,
                id: first as u32,
                weight: FULL,
            });
            return FULL;
        }
        _ => {}
    }
    let below = weighing.zero_below();
    let mut total = 0u64;
    let mut weights = [0u64; CHUNK];
    for (c, chunk) in row.chunks(CHUNK).enumerate() {
        // `>= below` on sanitized values: a NaN never passes, −inf only when the bound is −inf.
        if below > f32::NEG_INFINITY
            && !chunk
                .iter()
                .fold(false, |any, &x| any | (sanitize_logit(x.to_f32()) >= below))
        {
            continue;
        }
        weigh_chunk(weighing, c * CHUNK, chunk, &mut weights[..chunk.len()]);
        for (j, (&x, &weight)) in chunk.iter().zip(&weights).enumerate() {
            if weight > 0 {
                total += weight;
                out.push(Weighted {
                    key: logit_rank_key(x.to_f32()),
                    id: (c * CHUNK + j) as u32,
                    weight,
                });
            }
        }
    }
    total
}

/// The weights of the tokens of `chunk` (ids from `first`), into `weights`.
fn weigh_chunk<T: FloatElement>(
    weighing: &Weighing,
    first: usize,
    chunk: &[T],
    weights: &mut [u64],
) {
    if let Weighing::Scaled {
        lanes: Some(lanes), ..
    } = weighing
        && T::DTYPE == specula_backend_api::DType::F32
        && let Ok(values) = bytemuck::try_cast_slice::<T, f32>(chunk)
    {
        lanes::exact_weights(values, lanes, weights);
        return;
    }
    match *weighing {
        Weighing::Scaled {
            max,
            scale: RowScale::Scaled { c32, e },
            ..
        } => dispatch!(weigh_scaled::<T>(chunk, max, c32, e, weights)
            via weigh_scaled_avx512, weigh_scaled_avx2),
        _ => {
            for (j, (&x, w)) in chunk.iter().zip(weights.iter_mut()).enumerate() {
                *w = weighing.weight(first + j, x.to_f32());
            }
        }
    }
}

compiled_for!(avx512, fn weigh_scaled_avx512 [T: FloatElement]
    (chunk: &[T], max: f32, c32: u64, e: i32, weights: &mut [u64]) -> ()
    = weigh_scaled [T]);
compiled_for!(avx2, fn weigh_scaled_avx2 [T: FloatElement]
    (chunk: &[T], max: f32, c32: u64, e: i32, weights: &mut [u64]) -> ()
    = weigh_scaled [T]);

/// [`weigh_chunk`] for a finite temperature: the steps of `logit_weights::scaled_weight`,
/// written without branches so that the compiler vectorizes them (a 32-bit significand times a
/// 32-bit factor is one widening multiply; every shift is a per-lane shift).
#[inline(always)]
fn weigh_scaled<T: FloatElement>(chunk: &[T], max: f32, c32: u64, e: i32, weights: &mut [u64]) {
    for (&x, w) in chunk.iter().zip(weights.iter_mut()) {
        *w = scaled_lane(x.to_f32(), max, c32, e);
    }
}

/// One token's weight at a finite temperature, branch-free (equal to `scaled_weight`).
#[inline(always)]
fn scaled_lane(l: f32, max: f32, c32: u64, e: i32) -> u64 {
    let s = sanitize_logit(l);
    let finite = s > f32::NEG_INFINITY;
    let d = max - s;
    let bits = d.to_bits();
    let exp = (bits >> 23) & 0xff;
    let mantissa = bits & 0x7f_ffff;
    let m_d = if exp == 0 {
        mantissa
    } else {
        mantissa | 0x80_0000
    };
    let e_d = if exp == 0 { -149 } else { exp as i32 - 150 };
    let shift = e_d + e + GAP_FRACTION_BITS as i32;
    let product = u64::from(m_d) * (c32 & 0xffff_ffff);
    let left = product << shift.clamp(0, 7) as u32;
    let right = product >> (-shift).clamp(0, 63) as u32;
    let x = if shift >= 8 {
        GAP_LIMIT
    } else if shift >= 0 {
        left
    } else if shift > -64 {
        right
    } else {
        0
    };
    let x = if d == 0.0 { 0 } else { x.min(GAP_LIMIT) };
    // Step 5, `exp2_weight`: p stays below 2^32, so each product is a 32 × 32-bit multiply.
    let n = (x >> GAP_FRACTION_BITS) as u32;
    // g ≤ 2^24 and p < 2^32 held as u32, so that each product is one 32 × 32 → 64-bit multiply.
    let g = (1u32 << GAP_FRACTION_BITS) - (x as u32 & ((1u32 << GAP_FRACTION_BITS) - 1));
    let mut p = EXP2_COEFFICIENTS[6] as u32;
    for k in (1..6).rev() {
        p = (EXP2_COEFFICIENTS[k] + ((u64::from(p) * u64::from(g)) >> GAP_FRACTION_BITS)) as u32;
    }
    let p = EXP2_COEFFICIENTS[0] + ((u64::from(p) * u64::from(g)) >> GAP_FRACTION_BITS);
    let up = p << 9u32.saturating_sub(n).min(9);
    let down = p >> n.saturating_sub(9).min(63);
    let weight = if n <= 9 { up } else { down };
    if finite && x < GAP_LIMIT { weight } else { 0 }
}

/// The survivors of top-k among the tokens of positive weight, in id order, and their mass.
/// Empty (mass 0) only for a row of weight 0.
pub(crate) fn survivors<T: FloatElement>(
    row: &[T],
    weighing: &Weighing,
    top_k: i32,
    out: &mut Vec<Weighted>,
) -> u64 {
    let k = usize::try_from(top_k).unwrap_or(0);
    let needs_top_k = k > 0 && k < row.len();
    if !needs_top_k {
        return positive_tokens(row, weighing, out);
    }
    if k > MAX_FAST_K || matches!(weighing, Weighing::Zero | Weighing::Argmax { .. }) {
        // The positive tokens are a prefix of the rank order: the survivors are their first k.
        let total = positive_tokens(row, weighing, out);
        if out.len() <= k {
            return total;
        }
        out.select_nth_unstable_by(k - 1, |a, b| rank_cmp(&(a.key, a.id), &(b.key, b.id)));
        out.truncate(k);
        out.sort_unstable_by_key(|w| w.id);
        return out.iter().map(|w| w.weight).sum();
    }
    let mut best = Vec::with_capacity(k);
    top_ranked(row, k, &mut best);
    weigh_ranked(row, weighing, &best, out)
}

/// The tokens of positive weight among `best` (in rank order) into `out`, in id order, and their
/// mass.
fn weigh_ranked<T: FloatElement>(
    row: &[T],
    weighing: &Weighing,
    best: &[(u32, u32)],
    out: &mut Vec<Weighted>,
) -> u64 {
    weigh_ranked_by(weighing, best, out, |_, id| row[id as usize].to_f32())
}

/// [`weigh_ranked`] with the logit of each `(key, id)` of `best` from `logit`.
fn weigh_ranked_by(
    weighing: &Weighing,
    best: &[(u32, u32)],
    out: &mut Vec<Weighted>,
    logit: impl Fn(u32, u32) -> f32,
) -> u64 {
    out.clear();
    let mut total = 0u64;
    for &(key, id) in best {
        let weight = weighing.weight(id as usize, logit(key, id));
        if weight == 0 {
            // Weights never increase down the rank order: the rest weigh 0 too.
            break;
        }
        total += weight;
        out.push(Weighted { key, id, weight });
    }
    out.sort_unstable_by_key(|w| w.id);
    total
}

/// The last kept token of a top-p prefix, `(key, id)`: the kept set is every survivor ranked at
/// or before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Boundary {
    key: u32,
    id: u32,
}

impl Boundary {
    /// Whether `w` is kept.
    #[inline]
    pub(crate) fn keeps(&self, w: &Weighted) -> bool {
        w.key > self.key || (w.key == self.key && w.id <= self.id)
    }
}

/// The top-p boundary among `survivors` (mass `total > 0`) and the kept mass: the shortest prefix
/// in rank order whose mass `c` satisfies `c · 2^24 ≥ P · total`.
pub(crate) fn top_p_boundary(survivors: &[Weighted], top_p: f32, total: u64) -> (Boundary, u64) {
    let p = top_p_fixed(top_p);
    if p < 1 << TOP_P_BITS
        && let Some(found) = prefix_boundary(survivors, p, total)
    {
        return found;
    }
    // Every survivor is needed to reach the whole mass (each weighs something).
    let last = survivors
        .iter()
        .max_by(|a, b| rank_cmp(&(a.key, a.id), &(b.key, b.id)))
        .map_or(Boundary { key: 0, id: 0 }, |w| Boundary {
            key: w.key,
            id: w.id,
        });
    (last, total)
}

/// The shortest rank-order prefix of `members` whose mass reaches top-p `p` (fixed point) of
/// `total`, and its mass; `None` when all of `members` fall short. `members` must hold every
/// token ranked above any of them (a rank-order prefix of the row's positive tokens, in any order).
///
/// Mass per bin of the key (at most [`BINS`] bins spanning the members' keys), walked from the top
/// bin to the one that crosses; only that bin's members are sorted.
pub(crate) fn prefix_boundary(members: &[Weighted], p: u64, total: u64) -> Option<(Boundary, u64)> {
    if members.len() <= SMALL_SET {
        let mut ranked: Vec<&Weighted> = members.iter().collect();
        return walk_to_boundary(&mut ranked, 0, p, total);
    }
    let low = members.iter().map(|w| w.key).min()?;
    let high = members.iter().map(|w| w.key).max()?;
    let shift = (32 - (high - low).leading_zeros()).saturating_sub(BIN_BITS);
    let bin = |w: &Weighted| ((w.key - low) >> shift) as usize;
    let mut bins = [0u64; BINS];
    for w in members {
        bins[bin(w)] += w.weight;
    }
    let mut above = 0u64;
    let crossing = (0..BINS).rev().find(|&b| {
        let crosses = bins[b] > 0 && reaches_top_p(above + bins[b], p, total);
        above += if crosses { 0 } else { bins[b] };
        crosses
    })?;
    let mut band: Vec<&Weighted> = members.iter().filter(|w| bin(w) == crossing).collect();
    walk_to_boundary(&mut band, above, p, total)
}

/// Sorts `band` into rank order and walks it from the mass `above` (of the tokens ranked before
/// it) to the first prefix reaching top-p of `total`.
fn walk_to_boundary(
    band: &mut [&Weighted],
    above: u64,
    p: u64,
    total: u64,
) -> Option<(Boundary, u64)> {
    band.sort_unstable_by(|a, b| rank_cmp(&(a.key, a.id), &(b.key, b.id)));
    let mut mass = above;
    band.iter().find_map(|w| {
        mass += w.weight;
        let boundary = Boundary {
            key: w.key,
            id: w.id,
        };
        reaches_top_p(mass, p, total).then_some((boundary, mass))
    })
}

/// The first token of the row in rank order (the answer for a row of weight 0).
pub(crate) fn first_logit_in_rank<T: FloatElement>(row: &[T]) -> usize {
    let mut best = (0u32, 0u32);
    for (id, &x) in row.iter().enumerate() {
        let key = logit_rank_key(x.to_f32());
        if id == 0 || key > best.0 {
            best = (key, id as u32);
        }
    }
    best.1 as usize
}

/// What top-k and top-p keep of a logits row.
pub(crate) enum KeptLogits {
    /// The row weighs nothing: the answer is this token (the first in rank order).
    Degenerate(usize),
    /// The kept tokens, in id order, and their mass (positive).
    Kept(Vec<Weighted>, u64),
}

/// Top-k, then top-p, of a logits row (`docs/semantics.md` §5.6 steps 1 and 2); `kept` is a buffer to reuse.
pub(crate) fn logit_kept_set<T: FloatElement>(
    row: &[T],
    weighing: &Weighing,
    top_k: i32,
    top_p: f32,
    mut kept: Vec<Weighted>,
) -> KeptLogits {
    let total = survivors(row, weighing, top_k, &mut kept);
    kept_of_survivors(row, total, top_p, kept)
}

/// Top-p of `kept`, the survivors of top-k (mass `total`).
fn kept_of_survivors<T: FloatElement>(
    row: &[T],
    total: u64,
    top_p: f32,
    kept: Vec<Weighted>,
) -> KeptLogits {
    if total == 0 {
        return KeptLogits::Degenerate(first_logit_in_rank(row));
    }
    let (kept, mass) = top_p_kept(total, top_p, kept);
    KeptLogits::Kept(kept, mass)
}

/// The top-p prefix of `kept` (the survivors, of mass `total > 0`) and its mass.
fn top_p_kept(total: u64, top_p: f32, mut kept: Vec<Weighted>) -> (Vec<Weighted>, u64) {
    if top_p_fixed(top_p) >= 1 << TOP_P_BITS {
        // Every survivor weighs something, so reaching the whole mass keeps them all.
        return (kept, total);
    }
    let (boundary, mass) = top_p_boundary(&kept, top_p, total);
    kept.retain(|w| boundary.keeps(w));
    (kept, mass)
}

/// Draws by weight among `members` (in id order, total `mass > 0`) at the draw `r`.
pub(crate) fn draw_in(members: &[Weighted], mass: u64, r: u64) -> Option<usize> {
    let t = scale_draw(r, mass);
    let mut running = 0u64;
    members.iter().find_map(|w| {
        running += w.weight;
        (running > t).then_some(w.id as usize)
    })
}

/// Whether top-k `k` of a row of `len` tokens takes the streaming top-k pass ([`TopRanked`]).
pub(crate) fn streams_top_k(k: usize, len: usize) -> bool {
    k > 0 && k < len && k <= MAX_FAST_K
}

/// Top-p of the tokens of positive weight among `best` (a row's top-k in rank order, weighed by
/// `weighing` with each token's logit from `logit`), then the SAMPLE draw `r`; `None` for a
/// set of weight 0.
pub(crate) fn draw_among_ranked(
    weighing: &Weighing,
    best: &[(u32, u32)],
    top_p: f32,
    r: u64,
    logit: impl Fn(u32, u32) -> f32,
) -> Option<usize> {
    let mut kept = KEPT.with(|cell| cell.take());
    let total = weigh_ranked_by(weighing, best, &mut kept, logit);
    if total == 0 {
        KEPT.with(|cell| *cell.borrow_mut() = kept);
        return None;
    }
    let (kept, mass) = top_p_kept(total, top_p, kept);
    // The kept mass is positive, so the draw always lands on a member.
    let token = draw_in(&kept, mass, r).unwrap_or(kept[0].id as usize);
    KEPT.with(|cell| *cell.borrow_mut() = kept);
    Some(token)
}

thread_local! {
    /// Per-thread buffer of the kept tokens, reused from row to row.
    static KEPT: std::cell::RefCell<Vec<Weighted>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Samples one logits row at temperature `t` with the SAMPLE draw `r`.
pub(crate) fn sample_logit_row<T: FloatElement>(
    row: &[T],
    t: f32,
    top_k: i32,
    top_p: f32,
    r: u64,
) -> usize {
    sample_logit_row_hinted(row, t, (top_k, top_p, r), RowHints::default())
}

/// [`sample_logit_row`] of `(top_k, top_p, r)`, with `hints` on how the row's passes may run.
pub(crate) fn sample_logit_row_hinted<T: FloatElement>(
    row: &[T],
    t: f32,
    (top_k, top_p, r): (i32, f32, u64),
    hints: RowHints<'_>,
) -> usize {
    let k = usize::try_from(top_k).unwrap_or(0);
    let buffer = KEPT.with(|cell| cell.take());
    let top_k_applies = k > 0 && k < row.len();
    let kept = if top_k_applies && k <= MAX_FAST_K {
        top_k_kept(row, t, k, top_p, buffer)
    } else {
        if !top_k_applies && let Some(token) = unranked::sample(row, t, top_p, r, hints) {
            KEPT.with(|cell| *cell.borrow_mut() = buffer);
            return token;
        }
        let weighing = Weighing::of(row, t);
        logit_kept_set(row, &weighing, top_k, top_p, buffer)
    };
    match kept {
        KeptLogits::Degenerate(first) => first,
        KeptLogits::Kept(kept, mass) => {
            // The kept mass is positive, so the draw always lands on a member.
            let token = draw_in(&kept, mass, r).unwrap_or(kept[0].id as usize);
            KEPT.with(|cell| *cell.borrow_mut() = kept);
            token
        }
    }
}

/// Top-k (`0 < k < V`, `k ≤ MAX_FAST_K`), then top-p, of a logits row in one streaming pass:
/// the best-ranked token is the row's maximum, so no separate pass looks for it.
fn top_k_kept<T: FloatElement>(
    row: &[T],
    t: f32,
    k: usize,
    top_p: f32,
    mut kept: Vec<Weighted>,
) -> KeptLogits {
    let mut best = Vec::with_capacity(k);
    top_ranked(row, k, &mut best);
    let Some(&(key, id)) = best.first() else {
        return KeptLogits::Degenerate(0);
    };
    let weighing = Weighing::with_max(sanitize_logit(value_of_key(key)), t, || id as usize);
    let total = weigh_ranked(row, &weighing, &best, &mut kept);
    kept_of_survivors(row, total, top_p, kept)
}

/// The score `top_p_candidates` reports for a token of weight `w` in a row of total `total`: its
/// exact share `q · 2^-40`, `q = floor(w · 2^40 / total)` cut to its 24 most significant bits.
pub(crate) fn share(w: u64, total: u64) -> f32 {
    if total == 0 {
        return 0.0;
    }
    let q = ((u128::from(w) << WEIGHT_BITS) / u128::from(total)) as u64;
    let low_bits = (64 - q.leading_zeros()).saturating_sub(24);
    let q = q >> low_bits << low_bits;
    (q as f64 / FULL as f64) as f32
}

/// `top_p_candidates` of one logits row: the first C tokens of positive weight in rank order with
/// their shares, and the shortest prefix of them reaching `top_p` of the row's weight (all of them
/// when they fall short). A row of weight 0 yields its first token in rank order, share 0, lens 1.
/// `out` is cleared first.
pub(crate) fn candidates_row<T: FloatElement>(
    row: &[T],
    t: f32,
    top_p: f32,
    out: &mut CandidateRow<'_>,
) -> i32 {
    let weighing = Weighing::of(row, t);
    let mut positive = Vec::new();
    let total = positive_tokens(row, &weighing, &mut positive);
    if total == 0 {
        return out.only(first_logit_in_rank(row));
    }
    let c = out.capacity().min(positive.len());
    let by_rank = |a: &Weighted, b: &Weighted| rank_cmp(&(a.key, a.id), &(b.key, b.id));
    if positive.len() > c {
        positive.select_nth_unstable_by(c - 1, by_rank);
        positive.truncate(c);
    }
    positive.sort_unstable_by(by_rank);
    let members = positive
        .iter()
        .map(|w| (w.id, share(w.weight, total), w.weight));
    out.fill(members, top_p, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use specula_backend_api::logit_weights::row_weights;

    /// The plain definition: weights of the whole row, sort, prefix, draw.
    fn plain_sample(row: &[f32], t: f32, top_k: i32, top_p: f32, r: u64) -> usize {
        let w = row_weights(row, t);
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(logit_rank_key(row[i])), i));
        let survivors = match usize::try_from(top_k) {
            Ok(k) if k > 0 && k < row.len() => &order[..k],
            _ => &order[..],
        };
        let total: u64 = survivors.iter().map(|&i| w[i]).sum();
        if total == 0 {
            return order[0];
        }
        let p = top_p_fixed(top_p);
        let mut mass = 0;
        let mut n = survivors.len();
        for (j, &i) in survivors.iter().enumerate() {
            mass += w[i];
            if reaches_top_p(mass, p, total) {
                n = j + 1;
                break;
            }
        }
        let mut kept = survivors[..n].to_vec();
        kept.sort_unstable();
        let mass: u64 = kept.iter().map(|&i| w[i]).sum();
        let t = scale_draw(r, mass);
        let mut running = 0;
        for &i in &kept {
            running += w[i];
            if running > t {
                return i;
            }
        }
        kept[0]
    }

    /// A deterministic pseudo-random stream (splitmix64).
    fn stream(mut s: u64) -> impl FnMut() -> u64 {
        move || {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }

    fn llm_row(next: &mut impl FnMut() -> u64, v: usize, spread: f32) -> Vec<f32> {
        (0..v)
            .map(|_| {
                let u = (next() >> 40) as f32 / (1u64 << 24) as f32;
                // Coarse values make ties frequent.
                ((u * spread * 8.0).round() / 8.0) - spread / 2.0
            })
            .collect()
    }

    #[test]
    fn sampling_equals_the_plain_definition() {
        let mut next = stream(7);
        for case in 0..400 {
            let v = [1, 3, 50, 300, 5000][case % 5];
            let mut row = llm_row(&mut next, v, [4.0, 30.0, 120.0][case % 3]);
            if case % 7 == 0 {
                row[(next() % v as u64) as usize] = f32::NAN;
            }
            if case % 11 == 0 {
                row[(next() % v as u64) as usize] = f32::INFINITY;
            }
            if case % 13 == 0 {
                row[(next() % v as u64) as usize] = f32::NEG_INFINITY;
            }
            let t = [0.0, 0.05, 0.7, 1.0, 2.5, f32::INFINITY, f32::NAN][case % 7];
            let top_k = [0, 1, 5, 40, -3, 5000][(case / 3) % 6];
            let top_p = [1.0, 0.9, 0.5, 0.01, 0.0][(case / 5) % 5];
            let r = next();
            assert_eq!(
                sample_logit_row(&row, t, top_k, top_p, r),
                plain_sample(&row, t, top_k, top_p, r),
                "case {case}: v {v}, t {t}, top_k {top_k}, top_p {top_p}"
            );
        }
    }

    /// Rows long enough for the one-pass path without top-k (`unranked`) and the streaming top-k
    /// pass, which must decide as the plain definition does (and fall back when the floor leaves
    /// too little mass), with top-k both within and beyond the streaming limit.
    #[test]
    fn sampling_long_rows_equals_the_plain_definition() {
        let mut next = stream(17);
        for case in 0..200 {
            let v = [8192, 9001, 40_000][case % 3];
            let spread = [6.0, 40.0, 400.0, 0.5][case % 4];
            let mut row = llm_row(&mut next, v, spread);
            for special in [f32::NAN, f32::NEG_INFINITY, 3e38, -3e38] {
                if next().is_multiple_of(3) {
                    row[(next() % v as u64) as usize] = special;
                }
            }
            let t = [0.05, 0.7, 1.0, 2.5, f32::INFINITY][case % 5];
            // Also top-k on long rows: streaming (50) and beyond the streaming limit (5000).
            let top_k = [0, -1, v as i32, 50, 5000][(case / 5) % 5];
            let top_p = [1.0, 0.9, 0.5, 0.01, 0.999][(case / 7) % 5];
            let r = next();
            assert_eq!(
                sample_logit_row(&row, t, top_k, top_p, r),
                plain_sample(&row, t, top_k, top_p, r),
                "case {case}: v {v}, spread {spread}, t {t}, top_k {top_k}, top_p {top_p}"
            );
        }
    }

    /// Normal logits N(0, σ²), the shape of LLM rows; the sweep of σ below makes top-p 0.9 keep
    /// from one token to most of the row.
    fn normal_row(next: &mut impl FnMut() -> u64, v: usize, sigma: f64) -> Vec<f32> {
        (0..v)
            .map(|_| {
                let u = ((next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                let w = (next() >> 11) as f64 / (1u64 << 53) as f64;
                (sigma * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * w).cos()) as f32
            })
            .collect()
    }

    /// The size of the top-p set of a row (no top-k), by the plain definition.
    fn kept_size(row: &[f32], t: f32, top_p: f32) -> usize {
        let mut w = row_weights(row, t);
        w.sort_unstable_by(|a, b| b.cmp(a));
        let total: u64 = w.iter().sum();
        let p = top_p_fixed(top_p);
        let mut mass = 0;
        w.iter()
            .position(|&x| {
                mass += x;
                reaches_top_p(mass, p, total)
            })
            .map_or(w.len(), |n| n + 1)
    }

    /// Long rows whose logits read alike — flushed to +0 (`|l| < 2^-76`, both signs, ±0) or
    /// clamped to `±2^64` — and so weigh alike: the rank order is that of the logits themselves
    /// (§4b step 1), so top-p keeps the largest logits, not the lowest ids. The path without
    /// top-k and `sample_logit_row` give the plain definition's token, and the path decides some of
    /// them itself.
    #[test]
    fn the_unranked_path_ranks_logits_that_read_alike_by_the_logit() {
        let mut next = stream(29);
        let mut unit = move || (next() >> 11) as f32 / (1u64 << 53) as f32;
        let v = 8192;
        let tiny: Vec<f32> = (0..v)
            .map(|i| match i % 7 {
                0 => 0.0,
                1 => -0.0,
                _ => (unit() - 0.5) * 2e-30,
            })
            .collect();
        let mut huge: Vec<f32> = (0..v).map(|_| unit() * 4.0 - 2.0).collect();
        for i in (0..v).step_by(13) {
            huge[i] = 1e20 * 10f32.powf(unit() * 18.0);
        }
        let low: Vec<f32> = (0..v)
            .map(|i| {
                if i % 11 == 0 {
                    f32::NEG_INFINITY
                } else {
                    -1e20 * 10f32.powf(unit() * 18.0)
                }
            })
            .collect();
        let mut mixed: Vec<f32> = (0..v).map(|_| -(unit() * 3.0)).collect();
        for i in (0..v).step_by(3) {
            mixed[i] = (unit() - 0.5) * 1e-30;
        }
        let (mut decided, mut cases) = (0, 0);
        for (name, row) in [
            ("tiny", &tiny),
            ("huge", &huge),
            ("low", &low),
            ("mixed", &mixed),
        ] {
            for t in [1.0f32, 0.7] {
                for top_p in [1.0f32, 0.9, 0.5, 0.1, 1e-4] {
                    let r = (cases as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let expected = plain_sample(row, t, 0, top_p, r);
                    if let Some(token) = unranked::sample(row, t, top_p, r, RowHints::default()) {
                        assert_eq!(token, expected, "{name}, t {t}, top_p {top_p}");
                        decided += 1;
                    }
                    assert_eq!(
                        sample_logit_row(row, t, 0, top_p, r),
                        expected,
                        "{name}, t {t}, top_p {top_p}"
                    );
                    cases += 1;
                }
            }
        }
        // A tiny top-p keeps the first token in rank order: the largest logit, as argmax.
        let first = |row: &[f32]| plain_sample(row, 1.0, 0, 1e-6, 1);
        assert_eq!(tiny[first(&tiny)], tiny.iter().copied().fold(0.0, f32::max));
        assert_eq!(huge[first(&huge)], huge.iter().copied().fold(0.0, f32::max));
        assert!(decided * 2 >= cases, "decided {decided} of {cases}");
    }

    /// The path without top-k (`unranked`) on rows whose top-p sets hold from one token to most
    /// of the row, across the sizes its band, bins, sample and chunks are cut at: every token it
    /// returns is the plain definition's, and it decides nearly every row itself.
    #[test]
    fn the_unranked_path_decides_rows_of_every_shape() {
        let mut next = stream(19);
        let (mut decided, mut cases) = (0, 0);
        let mut sizes = Vec::new();
        for (case, &sigma) in [9.0, 6.0, 5.1, 4.5, 3.8, 3.0, 2.8, 2.0, 1.2, 0.87, 0.3, 0.0]
            .iter()
            .enumerate()
        {
            let v = [151_936, 32_000, 4096, 9001, 65_536][case % 5];
            let row = normal_row(&mut next, v, sigma);
            let t = [1.0, 0.8, 0.55, 1.7][case % 4];
            for top_p in [1.0, 0.9, 0.5, 0.99, 0.999, 0.1] {
                let r = next();
                let expected = plain_sample(&row, t, 0, top_p, r);
                if let Some(token) = unranked::sample(&row, t, top_p, r, RowHints::default()) {
                    assert_eq!(token, expected, "σ {sigma}, v {v}, t {t}, top_p {top_p}");
                    decided += 1;
                }
                // Split across threads, asking for another row: the same token.
                for parts in [2, 3] {
                    let hints = RowHints {
                        parts,
                        next: bytemuck::cast_slice(&row[..v / 2]),
                    };
                    let token = sample_logit_row_hinted(&row, t, (0, top_p, r), hints);
                    assert_eq!(
                        token, expected,
                        "parts {parts}, σ {sigma}, v {v}, top_p {top_p}"
                    );
                }
                assert_eq!(sample_logit_row(&row, t, 0, top_p, r), expected);
                cases += 1;
            }
            sizes.push(kept_size(&row, t, 0.9));
        }
        // The rows' top-p 0.9 sets span the sizes of interest.
        assert!(sizes.iter().any(|&n| n <= 10), "{sizes:?}");
        assert!(sizes.iter().any(|&n| n >= 50_000), "{sizes:?}");
        assert!(decided * 10 >= cases * 9, "decided {decided} of {cases}");
    }

    /// The path without top-k on long rows whose top is hostile — values above 2^64 (read as
    /// 2^64), +inf, a tiny largest value (read as +0), ties at the maximum — with thresholds in
    /// the band's top bins (small top-p): the band's histogram spans up to the row's largest
    /// value, and every token returned is the plain definition's (the path leaves the rows
    /// with +inf to the exact one; the op's answer is checked on them too).
    #[test]
    fn the_unranked_path_decides_rows_with_hostile_tops() {
        let mut next = stream(23);
        let v = 9001;
        for (case, top) in [
            vec![1e30, 3e38, 2e19],
            vec![f32::INFINITY, 5.0],
            vec![f32::INFINITY, f32::INFINITY, 1e30],
            vec![1e-30, 2e-30],
            vec![4.0, 4.0, 4.0, 3.999_999_8],
            vec![7.5],
        ]
        .into_iter()
        .enumerate()
        {
            let mut row = normal_row(&mut next, v, [1.0, 3.0][case % 2]);
            if case == 3 {
                // Every other value negative, so that the tiny ones are the largest.
                row.iter_mut().for_each(|x| *x = -x.abs() - 1.0);
            }
            for (i, &value) in top.iter().enumerate() {
                row[(i * 2741 + 17) % v] = value;
            }
            row[4000] = f32::NAN;
            for t in [1.0, 0.25] {
                for top_p in [0.05, 0.3, 0.7, 0.95] {
                    let r = next();
                    let expected = plain_sample(&row, t, 0, top_p, r);
                    if let Some(token) = unranked::sample(&row, t, top_p, r, RowHints::default()) {
                        assert_eq!(token, expected, "case {case}, t {t}, top_p {top_p}");
                    }
                    assert_eq!(sample_logit_row(&row, t, 0, top_p, r), expected);
                }
            }
        }
    }

    #[test]
    fn hostile_rows() {
        let nan = f32::NAN;
        let inf = f32::INFINITY;
        for row in [
            vec![nan, nan, -inf],
            vec![-inf, 3.0, inf, inf],
            vec![1e-30, -1e-30, 0.0],
            vec![3e38, -3e38, 1.0],
            // Equal readings (2^64, +0), different logits: the larger logit ranks first.
            vec![1e30, 3e38, -1.0],
            vec![1e-30, 2e-30, -5.0],
        ] {
            for t in [0.0, 1.0, inf, 1e-40] {
                for r in [0, u64::MAX, 1 << 63] {
                    for top_k in [0, 1, 2] {
                        assert_eq!(
                            sample_logit_row(&row, t, top_k, 0.7, r),
                            plain_sample(&row, t, top_k, 0.7, r),
                            "{row:?} t {t} top_k {top_k}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_zero_bound_never_drops_a_positive_weight() {
        let mut next = stream(3);
        for t in [1e-3f32, 0.3, 1.0, 7.0, 1e6] {
            let row = llm_row(&mut next, 4000, 400.0);
            let w = row_weights(&row, t);
            let weighing = Weighing::of(&row, t);
            let mut out = Vec::new();
            let total = positive_tokens(&row, &weighing, &mut out);
            assert_eq!(total, w.iter().sum::<u64>(), "t {t}");
            assert_eq!(out.len(), w.iter().filter(|&&x| x > 0).count(), "t {t}");
        }
    }

    #[test]
    fn top_ranked_is_the_sorted_prefix() {
        let mut next = stream(11);
        let row = llm_row(&mut next, 20_000, 10.0);
        let mut keyed: Vec<(u32, u32)> = row
            .iter()
            .enumerate()
            .map(|(i, &l)| (logit_rank_key(l), i as u32))
            .collect();
        keyed.sort_unstable_by(rank_cmp);
        let mut out = Vec::new();
        for k in [1, 7, 50, 1000, 19_999] {
            top_ranked(&row, k, &mut out);
            assert_eq!(out, keyed[..k], "k {k}");
        }
    }

    #[test]
    fn the_branch_free_weight_equals_the_contract_steps() {
        use specula_backend_api::logit_weights::scaled_weight;
        let mut next = stream(5);
        let specials = [
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            3e38,
            -3e38,
            f32::NAN,
            f32::NEG_INFINITY,
        ];
        for t in [1e-40f32, 1e-6, 0.05, 0.8, 1.0, 3.0, 1e10] {
            let RowScale::Scaled { c32, e } = row_scale(t) else {
                panic!("t {t} is finite and positive");
            };
            for max in [0.0f32, 1e-20, 2.5, -7.0, 1e19, 2f32.powi(64)] {
                let check = |l: f32| {
                    if sanitize_logit(l) <= max {
                        let scale = RowScale::Scaled { c32, e };
                        assert_eq!(
                            scaled_lane(l, max, c32, e),
                            scaled_weight(l, max, scale),
                            "l {l}, max {max}, t {t}"
                        );
                    }
                };
                specials.iter().for_each(|&l| check(l));
                check(max);
                for _ in 0..2000 {
                    let bits = next() as u32;
                    check(f32::from_bits(bits));
                    check(max - (bits % 100_000) as f32 * 1e-3);
                    check(max - f32::from_bits(bits & 0x7fff_ffff).min(1e3));
                }
            }
        }
    }

    #[test]
    fn shares_are_exact() {
        assert_eq!(share(FULL, FULL), 1.0);
        assert_eq!(share(FULL, 2 * FULL), 0.5);
        assert_eq!(share(0, FULL), 0.0);
        assert_eq!(share(5, 0), 0.0);
    }

    /// Top-k 50 / top-p 0.9 from logits at T = 1 on rows of the bench's logit spreads, one
    /// thread, cold (32 rows after a 400 MiB read, each row's least of 7): the streaming top-k
    /// pass alone and the whole row, beside a read, and the pass warm (run with `--ignored
    /// --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn top_k_costs() {
        use crate::sampling::lcg::Lcg;
        use crate::sampling::probe::{cold_micros, evictor};
        let evict = evictor();
        let mut lcg = Lcg(9);
        for (name, sigma) in [("sigma 3.5", 3.5), ("flat", 3.0), ("kept~100k", 0.874)] {
            let mut gaussian = || {
                let (u, w) = (f64::from(lcg.unit()).max(1e-12), f64::from(lcg.unit()));
                (sigma * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * w).cos()) as f32
            };
            let rows: Vec<Vec<f32>> = (0..32)
                .map(|_| (0..151_936).map(|_| gaussian()).collect())
                .collect();
            let cold = |f: &mut dyn FnMut(usize)| cold_micros(rows.len(), &evict, f);
            let read = cold(&mut |i| {
                std::hint::black_box(rows[i].iter().map(|x| x.to_bits() as u64).sum::<u64>());
            });
            let mut best = Vec::new();
            let pass = cold(&mut |i| top_ranked(&rows[i], 50, &mut best));
            let whole = cold(&mut |i| {
                std::hint::black_box(sample_logit_row(&rows[i], 1.0, 50, 0.9, 7));
            });
            let warm = crate::sampling::probe::least_us(50, &mut || {
                top_ranked(&rows[0], 50, &mut best);
            });

            println!(
                "{name}: cold per row: read {read:.1}, top-k pass {pass:.1}, whole {whole:.1}; \
                 warm top-k pass {warm:.1}"
            );
        }
    }
}

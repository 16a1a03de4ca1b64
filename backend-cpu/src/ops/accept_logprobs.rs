//! `accept_logprobs` (`docs/semantics.md` §5.11): log-probabilities, ranks and top-K of the accepted tokens.
//!
//! The accepted counts are packed first (a short sequential prefix sum); then every packed entry is
//! independent and runs in parallel. Per entry one pass over the source row finds the maximum,
//! the token's rank and the top-K (a bounded insertion into at most K ≤ 64 slots, never a sort of
//! the row; a chunk of 16 logits is looked at only when its maximum can enter the top-K) and, on
//! f32 rows in the vector loops at a finite T > 0, the normaliser (`float_math`'s one-pass
//! normaliser: terms against a running reference, moved to the row's maximum at the end). Rows
//! it does not cover (f16, bf16, no AVX2, T = 0 or +inf, a maximum of ±inf) take a second pass
//! for the normaliser, softmax's (`row_stats_after_max`). Log-probabilities follow the softmax
//! rules exactly (same temperature handling and special rows), so `exp(logprob)` is what
//! `softmax` returns (within the tolerance of §5.11).
//!
//! f32 rows take hand-written AVX-512 and AVX2 loops: maximum and rank count as vector
//! operations, a chunk offered to the top-K only when one of its logits can beat the K-th (by
//! one compare; the offers of a block of chunks made after it, so that the loop makes no call
//! and keeps its vectors in registers). The AVX-512 loop reads the row's four quarters side by
//! side, a chunk of each in turn, and sums each chunk's terms as it reads it; the result does
//! not depend on that order (`STREAMS`). The AVX2 loop reads the row in order and sums a block's
//! terms after scanning it, from L1 (its sixteen registers do not hold both loops' values).

use rayon::prelude::*;
use specula_backend_api::ops::accept_logprobs::OpCall;
use specula_backend_api::ops::*;
use specula_backend_api::{DType, FloatElement, Op, Result};

use super::argmax::ranks_above;
use super::softmax::{RowStats, effective_temperature, row_stats_after_max, scaled};
use super::{len_or_zero, token_index, with_float};
use crate::CpuDevice;
use crate::float_math::{self, Partial};
use crate::sampling::scan::{compiled_for, dispatch};
#[cfg(target_arch = "x86_64")]
use crate::sampling::scan::{has_avx2, has_avx512};
use specula_backend_api::host::{slice, slice_mut};

/// Where a packed entry comes from.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The accepted token id (raw device content).
    token: i32,
    /// The logits row it is scored against, if that row exists.
    row: Option<usize>,
}

/// The log-probability of logit `x` (entry `i` of the row, temperature `t`) under `stats`.
#[inline]
fn logprob(stats: &RowStats, i: usize, x: f32, t: f32, vocab: usize) -> f32 {
    match *stats {
        RowStats::OneHot(arg) => {
            if i == arg {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        }
        RowStats::PosInf { count } => {
            if x == f32::INFINITY {
                -(count as f32).ln()
            } else {
                f32::NEG_INFINITY
            }
        }
        RowStats::AllNegInf => -(vocab as f32).ln(),
        RowStats::Finite { max, sum } => scaled(x, max, t) - sum.ln(),
    }
}

/// Logit order for the rank: NaN counts as −inf.
#[inline(always)]
fn rank_value(x: f32) -> f32 {
    if x.is_nan() { f32::NEG_INFINITY } else { x }
}

/// Whether the entry `(a, ia)` ranks above `(b, ib)`: the higher logit (NaN lowest, as
/// [`ranks_above`]), on a tie the lower id, as the contract asks. A strict total order on a row's
/// entries, so the best `k` of a row are the same whatever order they are offered in.
#[inline]
fn entry_above(a: f32, ia: usize, b: f32, ib: usize) -> bool {
    ranks_above(a, b) || (!ranks_above(b, a) && ia < ib)
}

/// Inserts `(value, id)` into `top` (sorted best first by [`entry_above`], at most `k` long) if
/// it belongs there. The ids may come in any order (the vector passes read a row's parts side by
/// side); for ascending ids an equal value never displaces an earlier one.
#[inline]
fn offer(top: &mut TopK, k: usize, value: f32, id: usize) {
    if top.len() == k {
        match top.last() {
            Some(&(last, last_id)) if entry_above(value, id, last, last_id) => {
                top.pop();
            }
            _ => return,
        }
    }
    let at = top.partition_point(|&(v, i)| entry_above(v, i, value, id));
    top.insert(at, (value, id));
}

/// Offers the logits of a chunk (ids from `first`) to the top-K; returns its K-th entry, which a
/// later logit must rank above to enter, or `None` while every chunk must be offered (the top-K
/// has room, or its last entry is NaN).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn offer_chunk(top: &mut TopK, k: usize, chunk: &[f32], first: usize) -> Option<(f32, usize)> {
    // A logit below a full top-K's last (non-NaN) entry, or NaN, cannot enter: no search.
    let floor = match top.last() {
        Some(&(last, _)) if top.len() == k && !last.is_nan() => Some(last),
        _ => None,
    };
    for (j, &value) in chunk.iter().enumerate() {
        if floor.is_none_or(|last| value >= last) {
            offer(top, k, value, first + j);
        }
    }
    match top.last() {
        Some(&(last, id)) if top.len() == k && !last.is_nan() => Some((last, id)),
        _ => None,
    }
}

/// Logits per chunk of the fused pass: the top-K is offered a chunk only when its maximum can
/// enter it (one AVX-512 vector, two AVX2 vectors).
const CHUNK: usize = 16;
const _: () = assert!(CHUNK == 16, "the vector scans read a chunk as 16 lanes");

/// The best logits so far as `(value, id)`, best first (at most K).
type TopK = Vec<(f32, usize)>;
/// What the first pass counts: the maximum, the +inf count and the count above the token.
type Counts = (f32, usize, usize);

/// What the fused pass over a row finds.
#[derive(Clone, Copy, Debug)]
struct RowScan {
    /// The maximum logit (NaN ignored; −inf for a row of NaN and −inf).
    max: f32,
    /// How many logits are +inf.
    inf_count: usize,
    /// How many logits rank strictly above the token's (0 without a token).
    larger: usize,
}

/// One pass over `row`: its maximum and +inf count (for the normaliser), the number of logits
/// above `token_value`, the best `k` logits into `top`, and, given `inverse` (`1/T`, from
/// [`float_math::one_pass_inverse`]), on an f32 row in the vector loops, the normaliser against
/// a running reference (`None` elsewhere: the caller sums in a second pass).
fn scan_row<T: FloatElement>(
    row: &[T],
    token_value: Option<f32>,
    k: usize,
    top: &mut TopK,
    inverse: Option<f32>,
) -> (RowScan, Option<Partial>) {
    // Nothing ranks above +inf under `>`: no token counts nothing.
    let tv = token_value.unwrap_or(f32::INFINITY);
    let ((max, inf_count, larger), partial) = match as_f32(row) {
        // SAFETY: AVX-512F/BW/VL/DQ are present.
        #[cfg(target_arch = "x86_64")]
        Some(values) if has_avx512() => unsafe { avx512::scan_row(values, tv, k, top, inverse) },
        // SAFETY: AVX2 and FMA are present.
        #[cfg(target_arch = "x86_64")]
        Some(values) if has_avx2() => unsafe { avx2::scan_row(values, tv, k, top, inverse) },
        _ => (
            dispatch!(scan_row_generic::<T>(row, tv, k, top) via scan_row_avx512, scan_row_avx2),
            None,
        ),
    };
    let scan = RowScan {
        max,
        inf_count,
        larger,
    };
    (scan, partial)
}

/// `row` as f32 values, when it is an f32 row.
fn as_f32<T: FloatElement>(row: &[T]) -> Option<&[f32]> {
    if T::DTYPE != DType::F32 {
        return None;
    }
    bytemuck::try_cast_slice::<T, f32>(row).ok()
}

compiled_for!(avx512, fn scan_row_avx512 [T: FloatElement]
    (row: &[T], tv: f32, k: usize, top: &mut TopK) -> Counts
    = scan_row_generic [T]);
compiled_for!(avx2, fn scan_row_avx2 [T: FloatElement]
    (row: &[T], tv: f32, k: usize, top: &mut TopK) -> Counts
    = scan_row_generic [T]);

/// [`scan_row`] in chunks: the counts and the maximum are branch-free lanes; a chunk goes
/// through the (scalar) top-K only if the top-K has room, its last entry is NaN, or the chunk's
/// maximum beats it (an equal value never displaces an earlier id).
#[inline(always)]
fn scan_row_generic<T: FloatElement>(row: &[T], tv: f32, k: usize, top: &mut TopK) -> Counts {
    let mut max = [f32::NEG_INFINITY; CHUNK];
    let mut infs = [0u32; CHUNK];
    let mut above = [0u32; CHUNK];
    let mut values = [0.0f32; CHUNK];
    for (c, chunk) in row.chunks(CHUNK).enumerate() {
        let mut chunk_max = f32::NEG_INFINITY;
        for (j, v) in chunk.iter().enumerate() {
            let x = v.to_f32();
            values[j] = x;
            // Comparisons with NaN are false: a NaN logit is never the maximum nor above `tv`
            // (rank order reads NaN as −inf, and `tv` is never NaN).
            max[j] = if x > max[j] { x } else { max[j] };
            infs[j] += u32::from(x == f32::INFINITY);
            above[j] += u32::from(x > tv);
            chunk_max = if x > chunk_max { x } else { chunk_max };
        }
        if k == 0 {
            continue;
        }
        let open = match top.last() {
            Some(&(last, _)) if top.len() == k => last.is_nan() || chunk_max > last,
            _ => true,
        };
        if open {
            for (j, &x) in values[..chunk.len()].iter().enumerate() {
                offer(top, k, x, c * CHUNK + j);
            }
        }
    }
    let best = max
        .iter()
        .fold(f32::NEG_INFINITY, |b, &m| if m > b { m } else { b });
    let count = |lanes: &[u32; CHUNK]| lanes.iter().map(|&c| c as usize).sum::<usize>();
    (best, count(&infs), count(&above))
}

/// The logits row an entry is scored against.
#[derive(Clone, Copy, Debug)]
struct Source<'a, T> {
    row: &'a [T],
    temperature: f32,
}

/// Scores one packed entry: writes its log-probability and rank, and fills its top-K slots.
fn score_entry<T: FloatElement>(
    Source { row, temperature }: Source<'_, T>,
    token: i32,
    logprob_out: &mut f32,
    rank_out: &mut i32,
    top_ids: &mut [i32],
    top_logprobs: &mut [f32],
) {
    let vocab = row.len();
    let t = effective_temperature(temperature);
    let k = top_ids.len();
    let token = token_index(token, vocab);
    let token_value = token
        .and_then(|i| row.get(i))
        .map(|v| rank_value(v.to_f32()));
    let mut top = Vec::with_capacity(k);
    // One pass for the maximum, the rank, the top-K and (f32 rows on the vector loops, a finite
    // T > 0) the normaliser; a second one for the normaliser elsewhere and on the special rows
    // (T = 0, a maximum of ±inf).
    let inverse = float_math::one_pass_inverse(t);
    let (scan, partial) = scan_row(row, token_value, k, &mut top, inverse);
    let stats = match partial.and_then(|p| p.at_max(scan.max)) {
        Some(sum) => RowStats::Finite { max: scan.max, sum },
        None => row_stats_after_max(row, t, (scan.max, scan.inf_count), None),
    };
    let larger = scan.larger;
    let lp = |i: usize| -> f32 {
        let x = row.get(i).map_or(f32::NEG_INFINITY, |v| v.to_f32());
        logprob(&stats, i, x, t, vocab)
    };

    match token {
        Some(i) => {
            *logprob_out = lp(i);
            *rank_out = i32::try_from(larger + 1).unwrap_or(i32::MAX);
        }
        None => {
            *logprob_out = f32::NEG_INFINITY;
            *rank_out = 0;
        }
    }
    for (slot, (id, lp_out)) in top_ids.iter_mut().zip(top_logprobs.iter_mut()).enumerate() {
        match top.get(slot) {
            Some(&(_, i)) => {
                *id = i as i32;
                *lp_out = lp(i);
            }
            // Only when K > V: the row has fewer ids than slots.
            None => {
                *id = -1;
                *lp_out = f32::NEG_INFINITY;
            }
        }
    }
}

/// Parts of an f32 row the vector first passes read side by side, a chunk of each in turn: four
/// memory streams in flight instead of one (as `max_and_clean` in `sampling/logits/lanes.rs`),
/// then the rest of the row in order.
#[cfg(target_arch = "x86_64")]
const STREAMS: usize = 4;

/// Chunks of each part the vector passes read before offering the ones their gate let in to
/// the top-K (so that the loop over a block makes no call; `STREAMS · BLOCK ≤ 64`, one bit
/// each).
#[cfg(target_arch = "x86_64")]
const BLOCK: usize = 16;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(STREAMS * BLOCK <= 64, "a block's offers are bits of a u64");

/// Logits in each of the [`STREAMS`] parts of a row of `len` (whole chunks; 0 for a row under
/// `STREAMS` chunks, which is then read in order).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn stream_part(len: usize) -> usize {
    len / (STREAMS * CHUNK) * CHUNK
}

/// How many logits of `row` are +inf, given its maximum `max` (none unless it is +inf: the
/// vector passes count them only on such a row, in a second read).
#[cfg(target_arch = "x86_64")]
fn inf_count(row: &[f32], max: f32) -> usize {
    if max == f32::INFINITY {
        row.iter().filter(|&&x| x == f32::INFINITY).count()
    } else {
        0
    }
}

/// When a vector pass offers a chunk to the top-K: always while `open` (the top-K has room or
/// its last entry is NaN), else when one of its logits ranks above the K-th entry, `(last,
/// last_id)`: beats it, or equals it from a lower id (the parts are read side by side, so a
/// chunk may come after higher ids).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Gate {
    open: bool,
    last: f32,
    last_id: usize,
}

#[cfg(target_arch = "x86_64")]
impl Gate {
    /// The gate of an empty top-K.
    #[inline(always)]
    fn new(k: usize) -> Self {
        Gate {
            open: k > 0,
            last: f32::NAN,
            last_id: 0,
        }
    }

    /// Offers `chunk` (ids from `first`) to the top-K and moves the gate to its new K-th entry.
    /// Out of line: the vector loop that calls it keeps its lanes in registers.
    #[inline(never)]
    fn offer(&mut self, top: &mut TopK, k: usize, chunk: &[f32], first: usize) {
        match offer_chunk(top, k, chunk, first) {
            Some((last, last_id)) => {
                *self = Gate {
                    open: false,
                    last,
                    last_id,
                }
            }
            None => self.open = true,
        }
    }
}

/// The first pass over an f32 row in AVX-512 lanes, as [`scan_row_generic`], reading the row's
/// [`STREAMS`] parts side by side. Nothing depends on that order: the counts are integers; each
/// part keeps its own maxima, folded in part order (index order) at the end, so even the sign
/// of a zero maximum is the generic pass's; the top-K ranks ties by id (`offer`), so it holds the
/// same entries whatever order the chunks come in.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{BLOCK, CHUNK, Counts, Gate, STREAMS, TopK, inf_count, stream_part};
    use crate::float_math::{Partial, avx512::Normaliser};
    use std::arch::x86_64::*;

    const _: () = assert!(STREAMS == 4, "the loop reads four parts side by side");

    /// The pass's lanes: a maximum per part (the rest of the row in the last), the
    /// above-the-token count, and where `SUM`, the normaliser. Vectors only, and no call in
    /// the loop that updates them, so they stay in registers.
    struct Lanes<const SUM: bool> {
        max: [__m512; STREAMS],
        above: __m512i,
        tv: __m512,
        sum: Normaliser,
    }

    /// The gate of a block (as it stood at the block's start): `last` is its K-th value in
    /// every lane.
    #[derive(Clone, Copy)]
    struct BlockGate {
        gate: Gate,
        last: __m512,
    }

    impl<const SUM: bool> Lanes<SUM> {
        /// Takes in the chunk of part `P` at `chunk` (16 values; ids from `first`) into that
        /// part's maximum, the count and the normaliser (its terms against the reference as
        /// it stands; the caller checks after the block); returns whether `gate` lets it into
        /// the top-K. Not a `target_feature` function, so that it is always inlined into the
        /// loop, which is.
        ///
        /// # Safety
        /// The CPU must support AVX-512F/BW/VL/DQ; `chunk` holds 16 f32.
        #[inline(always)]
        unsafe fn step<const P: usize>(
            &mut self,
            chunk: &[f32],
            first: usize,
            g: &BlockGate,
        ) -> bool {
            // SAFETY: the caller's promise.
            unsafe {
                let x = _mm512_loadu_ps(chunk.as_ptr());
                if SUM {
                    self.sum.add_unchecked(x);
                }
                self.take(x, P, first, g)
            }
        }

        /// [`Self::step`]'s scan: `x` (NaN past a short chunk's end) into the maximum of part
        /// `part` and the count; whether `g` lets the chunk into the top-K: always while open,
        /// else when one of its logits beats the K-th, or equals it from a lower id (the parts
        /// are read side by side, so a chunk may come after higher ids).
        ///
        /// # Safety
        /// The CPU must support AVX-512F/BW/VL/DQ.
        #[inline(always)]
        unsafe fn take(&mut self, x: __m512, part: usize, first: usize, g: &BlockGate) -> bool {
            // SAFETY: the caller's promise.
            unsafe {
                // `max(x, m)` returns `m` for a NaN `x` and on a tie: `x > m ? x : m`.
                self.max[part] = _mm512_max_ps(x, self.max[part]);
                let is_above = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, self.tv);
                self.above =
                    _mm512_mask_add_epi32(self.above, is_above, self.above, _mm512_set1_epi32(1));
                g.gate.open
                    || (_mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, g.last) != 0
                        && (first < g.gate.last_id
                            || _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, g.last) != 0))
            }
        }
    }

    /// The parts' maxima, in index order: a later part's only where strictly greater.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn max_of(max: &[__m512; STREAMS]) -> __m512 {
        max[1..].iter().fold(max[0], |m, &p| _mm512_max_ps(p, m))
    }

    /// The maximum (NaN ignored), the +inf count and the count above `tv` of `row`, its
    /// best `k` logits into `top`, and given `inverse` (`1/T`) its one-pass normaliser.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW/VL/DQ.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn scan_row(
        row: &[f32],
        tv: f32,
        k: usize,
        top: &mut TopK,
        inverse: Option<f32>,
    ) -> (Counts, Option<Partial>) {
        let part = stream_part(row.len());
        match inverse {
            Some(inverse) => {
                let (counts, sum) = scan_parts_with::<true>(row, tv, k, top, part, inverse);
                (counts, Some(sum))
            }
            None => (scan_parts_with::<false>(row, tv, k, top, part, 1.0).0, None),
        }
    }

    /// [`scan_parts_with`] without the normaliser.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW/VL/DQ.
    #[cfg(test)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn scan_parts(
        row: &[f32],
        tv: f32,
        k: usize,
        top: &mut TopK,
        part: usize,
    ) -> Counts {
        scan_parts_with::<false>(row, tv, k, top, part, 1.0).0
    }

    /// [`scan_row`] with parts of `part` logits (a multiple of [`CHUNK`], at most a
    /// [`STREAMS`]th of the row; 0 reads the row in order), and where `SUM`, the normaliser at
    /// `1/T = inverse` (an empty one otherwise).
    ///
    /// The parts are read [`BLOCK`] chunks each at a time, and the block's terms summed as
    /// they are read, against the reference as it stood before the block; if the block held
    /// a logit too far above it (`Normaliser::too_far` of the maxima), its terms are taken
    /// again (from L1) against the maximum so far. The chunks the gate lets in are offered to
    /// the top-K after their block, with the gate as it stood at the block's start — which
    /// lets in every chunk the gate of the moment would (the K-th entry only rises), and
    /// offering a chunk that does not belong changes nothing.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) fn scan_parts_with<const SUM: bool>(
        row: &[f32],
        tv: f32,
        k: usize,
        top: &mut TopK,
        part: usize,
        inverse: f32,
    ) -> (Counts, Partial) {
        let mut lanes = Lanes::<SUM> {
            max: [_mm512_set1_ps(f32::NEG_INFINITY); STREAMS],
            above: _mm512_setzero_si512(),
            tv: _mm512_set1_ps(tv),
            // SAFETY: this function's features.
            sum: unsafe { Normaliser::new(inverse) },
        };
        let mut gate = Gate::new(k);
        let (streams, rest) = row.split_at(STREAMS * part);
        let parts: [&[f32]; STREAMS] = std::array::from_fn(|p| &streams[p * part..(p + 1) * part]);
        let mut block = 0;
        while block < part {
            // While the top-K has room, a chunk a part at a time (every chunk goes to it).
            let end = (block + if gate.open { CHUNK } else { BLOCK * CHUNK }).min(part);
            let before = lanes.sum;
            let g = BlockGate {
                gate,
                last: _mm512_set1_ps(gate.last),
            };
            // Bit `STREAMS · c + p`: the block's chunk `c` of part `p` goes to the top-K.
            let mut offers = 0u64;
            let [a, b, c, d] = parts.map(|p| p[block..end].chunks_exact(CHUNK));
            for (i, (((a, b), c), d)) in a.zip(b).zip(c).zip(d).enumerate() {
                let first = block + i * CHUNK;
                // SAFETY: this function's features; each chunk holds 16 f32.
                let wants = unsafe {
                    [
                        lanes.step::<0>(a, first, &g),
                        lanes.step::<1>(b, part + first, &g),
                        lanes.step::<2>(c, 2 * part + first, &g),
                        lanes.step::<3>(d, 3 * part + first, &g),
                    ]
                };
                for (p, wants) in wants.into_iter().enumerate() {
                    offers |= u64::from(wants) << (STREAMS * i + p);
                }
            }
            // SAFETY: this function's features.
            if SUM && unsafe { lanes.sum.too_far(max_of(&lanes.max)) } {
                // A term of the block was more than `REBASE_ABOVE` above the reference: the
                // block's terms again, against the maximum so far.
                lanes.sum = before;
                // SAFETY: this function's features; every chunk holds 16 f32.
                unsafe {
                    lanes.sum.rebase(max_of(&lanes.max));
                    for p in parts {
                        for chunk in p[block..end].chunks_exact(CHUNK) {
                            lanes.sum.add_unchecked(_mm512_loadu_ps(chunk.as_ptr()));
                        }
                    }
                }
            }
            while offers != 0 {
                let bit = offers.trailing_zeros() as usize;
                offers &= offers - 1;
                let at = (bit % STREAMS) * part + block + bit / STREAMS * CHUNK;
                gate.offer(top, k, &streams[at..at + CHUNK], at);
            }
            block = end;
        }
        for (c, chunk) in rest.chunks(CHUNK).enumerate() {
            let first = STREAMS * part + c * CHUNK;
            let bits = (1u32 << chunk.len()) - 1;
            let g = BlockGate {
                gate,
                last: _mm512_set1_ps(gate.last),
            };
            // SAFETY: the mask reads only the `chunk.len()` values of `chunk`; the other lanes
            // are NaN, which no count, maximum or compare takes, and whose terms weigh
            // `2^-125`; this function's features.
            let wants = unsafe {
                let x = _mm512_mask_loadu_ps(
                    _mm512_set1_ps(f32::NAN),
                    bits as __mmask16,
                    chunk.as_ptr(),
                );
                if SUM {
                    lanes.sum.add(x);
                }
                lanes.take(x, STREAMS - 1, first, &g)
            };
            if wants {
                gate.offer(top, k, chunk, first);
            }
        }
        let max = max_of(&lanes.max);
        let mut values = [0f32; 16];
        // SAFETY: `values` holds 16 f32.
        unsafe { _mm512_storeu_ps(values.as_mut_ptr(), max) };
        let best = values
            .iter()
            .fold(f32::NEG_INFINITY, |b, &m| if m > b { m } else { b });
        let above = _mm512_reduce_add_epi32(lanes.above) as u32 as usize;
        let counts = (best, inf_count(row, best), above);
        // SAFETY: this function's features.
        (counts, unsafe { lanes.sum.finish() })
    }
}

/// The first pass over an f32 row in AVX2 lanes (two vectors of 8 per chunk of [`CHUNK`]), as
/// the AVX-512 one but in order: read in four parts (the AVX-512 loop's way, eight maxima and the
/// counts in the sixteen AVX2 registers) it lost to this loop in `specula bench`
/// (`SPECULA_CPU_MAX_ISA=avx2`, `docs/bench/stop40-streams-accept-avx2.txt`).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{BLOCK, CHUNK, Counts, Gate, STREAMS, TopK, inf_count};
    use crate::float_math::{Partial, avx2::Normaliser};
    use std::arch::x86_64::*;

    /// Whole chunks read before the ones the gate let in are offered (as the AVX-512 loop's
    /// blocks: one bit each of a u64).
    const CHUNKS: usize = STREAMS * BLOCK;

    /// The pass's lanes (two vectors of 8 per chunk): the maximum, the above-the-token count
    /// (both halves in one), and where `SUM`, the normaliser.
    struct Lanes<const SUM: bool> {
        max: [__m256; 2],
        above: __m256i,
        tv: __m256,
        sum: Normaliser,
    }

    impl<const SUM: bool> Lanes<SUM> {
        /// Takes in the half `h` of a chunk, its values `x` (NaN past its end), into the
        /// maximum and the count; returns the mask of its lanes above `last` (the gate's K-th
        /// value). Not a `target_feature` function, so that it is always inlined into the
        /// loop, which is.
        ///
        /// # Safety
        /// The CPU must support AVX2 and FMA.
        #[inline(always)]
        unsafe fn step(&mut self, x: __m256, h: usize, last: __m256) -> i32 {
            // SAFETY: the caller's promise (the intrinsics need only those features).
            unsafe {
                // `max(x, m)` returns `m` for a NaN `x`: `x > m ? x : m`.
                self.max[h] = _mm256_max_ps(x, self.max[h]);
                // A true compare is −1 in every bit: subtracting it counts 1.
                let is_above = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(x, self.tv));
                self.above = _mm256_sub_epi32(self.above, is_above);
                _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(x, last))
            }
        }

        /// Takes in `chunk` (16 values, or fewer: NaN in the other lanes) as [`Self::step`];
        /// returns whether `gate` lets it into the top-K.
        ///
        /// # Safety
        /// The CPU must support AVX2 and FMA.
        #[inline(always)]
        unsafe fn chunk(&mut self, chunk: &[f32], gate: &Gate) -> bool {
            // SAFETY: the caller's features.
            let last = unsafe { _mm256_set1_ps(gate.last) };
            let mut beats = 0;
            for h in 0..2 {
                let x = if chunk.len() == CHUNK {
                    // SAFETY: `chunk` holds 16 f32; the caller's features.
                    unsafe { _mm256_loadu_ps(chunk.as_ptr().add(8 * h)) }
                } else {
                    // The short last chunk: its values, NaN in the other lanes (no count,
                    // maximum or compare takes NaN).
                    let mut lanes = [f32::NAN; 8];
                    for (l, &v) in lanes.iter_mut().zip(chunk.iter().skip(8 * h)) {
                        *l = v;
                    }
                    // SAFETY: `lanes` holds 8 f32; the caller's features.
                    unsafe { _mm256_loadu_ps(lanes.as_ptr()) }
                };
                // SAFETY: the caller's features.
                beats |= unsafe { self.step(x, h, last) };
            }
            // Ids arrive in order: an equal logit never ranks above the K-th entry.
            gate.open || beats != 0
        }
    }

    /// See the AVX-512 loop.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn scan_row(
        row: &[f32],
        tv: f32,
        k: usize,
        top: &mut TopK,
        inverse: Option<f32>,
    ) -> (Counts, Option<Partial>) {
        match inverse {
            Some(inverse) => {
                let (counts, sum) = scan_with::<true>(row, tv, k, top, inverse);
                (counts, Some(sum))
            }
            None => (scan_with::<false>(row, tv, k, top, 1.0).0, None),
        }
    }

    /// [`scan_row`], and where `SUM`, the normaliser at `1/T = inverse` (an empty one
    /// otherwise). The row is read in order, [`CHUNKS`] chunks at a time, the chunks the gate
    /// lets in offered after their block (as the AVX-512 loop: the block's gate lets in every
    /// chunk the gate of the moment would).
    #[target_feature(enable = "avx2,fma,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) fn scan_with<const SUM: bool>(
        row: &[f32],
        tv: f32,
        k: usize,
        top: &mut TopK,
        inverse: f32,
    ) -> (Counts, Partial) {
        let mut lanes = Lanes::<SUM> {
            max: [_mm256_set1_ps(f32::NEG_INFINITY); 2],
            above: _mm256_setzero_si256(),
            tv: _mm256_set1_ps(tv),
            // SAFETY: this function's features.
            sum: unsafe { Normaliser::new(inverse) },
        };
        let mut gate = Gate::new(k);
        let whole = row.len() / CHUNK * CHUNK;
        let (body, tail) = row.split_at(whole);
        let mut start = 0;
        while start < whole {
            // While the top-K has room, a chunk at a time (every chunk goes to it).
            let end = (start + if gate.open { CHUNK } else { CHUNKS * CHUNK }).min(whole);
            let block = &body[start..end];
            let mut offers = 0u64;
            for (c, chunk) in block.chunks_exact(CHUNK).enumerate() {
                // SAFETY: this function's features.
                let wants = unsafe { lanes.chunk(chunk, &gate) };
                offers |= u64::from(wants) << c;
            }
            if SUM {
                // The block's terms from L1, after the scan (in sixteen registers the two
                // loops in one spill), against the maximum so far if the block holds a logit
                // too far above the reference.
                let max = _mm256_max_ps(lanes.max[0], lanes.max[1]);
                // SAFETY: this function's features; every vector read is 8 f32 of `block`.
                unsafe {
                    if lanes.sum.too_far(max) {
                        lanes.sum.rebase(max);
                    }
                    for v in block.chunks_exact(8) {
                        lanes.sum.add_unchecked(_mm256_loadu_ps(v.as_ptr()));
                    }
                }
            }
            while offers != 0 {
                let c = offers.trailing_zeros() as usize;
                offers &= offers - 1;
                let chunk = &block[c * CHUNK..(c + 1) * CHUNK];
                gate.offer(top, k, chunk, start + c * CHUNK);
            }
            start = end;
        }
        if !tail.is_empty() {
            // SAFETY: this function's features.
            if unsafe { lanes.chunk(tail, &gate) } {
                gate.offer(top, k, tail, whole);
            }
            for half in tail.chunks(8).filter(|_| SUM) {
                // The short last chunk's values, NaN (weighing `2^-125`) in the other lanes.
                let mut values = [f32::NAN; 8];
                values[..half.len()].copy_from_slice(half);
                // SAFETY: `values` holds 8 f32; this function's features.
                unsafe { lanes.sum.add(_mm256_loadu_ps(values.as_ptr())) };
            }
        }
        let mut values = [0f32; 16];
        // SAFETY: `values` holds 16 f32.
        unsafe {
            _mm256_storeu_ps(values.as_mut_ptr(), lanes.max[0]);
            _mm256_storeu_ps(values.as_mut_ptr().add(8), lanes.max[1]);
        }
        let best = values
            .iter()
            .fold(f32::NEG_INFINITY, |b, &m| if m > b { m } else { b });
        let mut counts = [0u32; 8];
        // SAFETY: `counts` holds 8 u32.
        unsafe { _mm256_storeu_si256(counts.as_mut_ptr().cast(), lanes.above) };
        let above = counts.iter().map(|&c| c as usize).sum::<usize>();
        let counts = (best, inf_count(row, best), above);
        // SAFETY: this function's features.
        (counts, unsafe { lanes.sum.finish() })
    }
}

/// Packs the accepted tokens and scores each against its logits row.
pub(crate) fn accept_logprobs(
    dtype: DType,
    inputs: &LogprobsInputs<'_>,
    out: &mut LogprobsOutputs<'_>,
    params: &LogprobsParams<'_>,
) -> Result<()> {
    let dims = &params.dims;
    let s = dims.max_step_tokens;
    let vocab = params.shape.vocab;
    let rows = params.shape.rows;
    let k = params.top_k;
    let accept_tokens = slice::<i32>(inputs.accept_tokens)?;
    let accept_num = slice::<i32>(inputs.accept_num)?;
    let encoder = slice::<i32>(inputs.seq_lens_encoder)?;
    let cu_out = slice::<i32>(inputs.cu_seqlens_q_output)?;
    let temperature = slice::<f32>(inputs.temperature)?;

    // Sequential: max_bsz + 1 prefix sums and one small descriptor per accepted token.
    let cu_accept = slice_mut::<i32>(out.cu_accept)?;
    let mut entries = Vec::with_capacity(dims.max_bsz * s);
    cu_accept[0] = 0;
    for b in 0..dims.max_bsz {
        let n = if b < dims.real_bsz {
            len_or_zero(accept_num[b]).min(s)
        } else {
            0
        };
        let base = cu_out.get(b).map(|&c| i64::from(c));
        let prefill = encoder[b] > 0;
        for pos in 0..n {
            let row = base
                .map(|base| if prefill { base } else { base + pos as i64 })
                .and_then(|r| usize::try_from(r).ok())
                .filter(|&r| r < rows);
            entries.push(Entry {
                token: accept_tokens[b * s + pos],
                row,
            });
        }
        // ≤ max_bsz · S entries, which the validated buffers hold, so this fits in i32 in practice;
        // saturate rather than wrap if it ever did not.
        cu_accept[b + 1] = i32::try_from(entries.len()).unwrap_or(i32::MAX);
    }

    let token_ids = slice_mut::<i32>(out.token_ids)?;
    let logprobs = slice_mut::<f32>(out.logprobs)?;
    let ranks = slice_mut::<i32>(out.ranks)?;
    let top_ids = slice_mut::<i32>(out.top_ids)?;
    let top_logprobs = slice_mut::<f32>(out.top_logprobs)?;
    // Per-entry top-K windows; with K = 0 every entry gets an empty window (chunks of 0 would
    // panic, and skipping the zip would skip the entries).
    let mut id_windows: Vec<&mut [i32]> = Vec::with_capacity(token_ids.len());
    let mut lp_windows: Vec<&mut [f32]> = Vec::with_capacity(token_ids.len());
    if k == 0 {
        id_windows.resize_with(token_ids.len(), Default::default);
        lp_windows.resize_with(token_ids.len(), Default::default);
    } else {
        id_windows.extend(top_ids.chunks_mut(k));
        lp_windows.extend(top_logprobs.chunks_mut(k));
    }

    with_float!(dtype, Op::AcceptLogprobs, T => {
        let logits = slice::<T>(inputs.logits)?;
        token_ids
            .par_iter_mut()
            .zip(logprobs.par_iter_mut())
            .zip(ranks.par_iter_mut())
            .zip(id_windows.par_iter_mut())
            .zip(lp_windows.par_iter_mut())
            .enumerate()
            .for_each(|(p, ((((token_out, lp_out), rank_out), ids), lps))| {
                let entry = entries.get(p);
                *token_out = entry.map_or(-1, |e| e.token);
                let row_of = |e: Option<&Entry>| {
                    let r = e?.row?;
                    Some((logits.get(r * vocab..(r + 1) * vocab)?, *temperature.get(r)?))
                };
                match (entry, row_of(entry)) {
                    (Some(e), Some((row, temperature))) => {
                        let source = Source { row, temperature };
                        score_entry(source, e.token, lp_out, rank_out, ids, lps)
                    }
                    // Padding entries and entries whose source row does not exist.
                    _ => {
                        *lp_out = f32::NEG_INFINITY;
                        *rank_out = 0;
                        ids.fill(-1);
                        lps.fill(f32::NEG_INFINITY);
                    }
                }
            });
        Ok(())
    })
}

/// Runs a validated `accept_logprobs` call (the front has checked every argument).
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, dtype) = call.parts();
    device.install(|| accept_logprobs(*dtype, inputs, out, params))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::lcg::Lcg;

    /// Kinds of rows [`styled_row`] makes.
    #[cfg(target_arch = "x86_64")]
    const STYLES: usize = 8;

    /// A row of `len` logits of kind `style`: spread values; NaN and ±inf among them; heavy ties;
    /// NaN and −0; one value everywhere; negative values and zeros of both signs (a zero
    /// maximum, its sign from the first zero); −inf but for a few (a masked row); and low values
    /// with one high value tied around every boundary between the vector passes' parts.
    #[cfg(target_arch = "x86_64")]
    fn styled_row(lcg: &mut Lcg, len: usize, style: usize) -> Vec<f32> {
        let part = stream_part(len);
        let boundary = |i: usize| {
            (1..=STREAMS).any(|p| (p * part).abs_diff(i) <= 1 || (p * part).abs_diff(i + 1) <= 1)
        };
        (0..len)
            .map(|i| {
                let u = lcg.unit();
                match (style, i % 23) {
                    (1, 3) => f32::NAN,
                    (1, 5) => f32::INFINITY,
                    (1, 7) => f32::NEG_INFINITY,
                    (2, _) => (u * 4.0).floor() - 2.0, // heavy ties
                    (3, _) if i % 2 == 0 => f32::NAN,
                    (3, _) => -0.0,
                    (4, _) => 1.5,
                    (5, _) if u < 0.3 => -0.0,
                    (5, _) if u < 0.6 => 0.0,
                    (5, _) => -u,
                    (6, 11) => u,
                    (6, _) => f32::NEG_INFINITY,
                    (7, _) if boundary(i) || i + 2 >= len => 7.0,
                    (7, _) => u - 5.0,
                    _ => u * 20.0 - 10.0,
                }
            })
            .collect()
    }

    /// The AVX-512 first pass, which reads a row's four parts side by side, and the AVX2 one find the
    /// maximum (its bits: the sign of a zero maximum too), the counts and the top-K (ids and
    /// order: ties by id) of the generic one, which reads it in order: on rows with NaN, ±inf,
    /// ties (across the parts' boundaries too), ±0, masked rows, of lengths around every split
    /// into parts and off the chunk size, for every K and token value kind.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_scans_match_the_generic_one() {
        type Scan = unsafe fn(&[f32], f32, usize, &mut TopK, usize) -> Counts;
        let mut loops: Vec<(&str, Scan)> = Vec::new();
        if has_avx512() {
            loops.push(("avx512", avx512::scan_parts));
            loops.push(("avx512 with the normaliser", avx512_summed));
        }
        if has_avx2() {
            loops.push(("avx2", avx2_in_order));
            loops.push(("avx2 with the normaliser", avx2_summed));
        }
        if loops.is_empty() {
            eprintln!("skipped: no vector loops on this CPU");
            return;
        }
        let mut lcg = Lcg(23);
        // Around every split into parts (`STREAMS` × `CHUNK` = 64) and the short last chunk,
        // and over many blocks (`BLOCK` chunks a part).
        let lens = [
            1usize, 15, 16, 17, 33, 63, 64, 65, 127, 128, 129, 500, 4099, 4160, 20_011,
        ];
        for len in lens {
            for style in 0..STYLES {
                let row = styled_row(&mut lcg, len, style);
                for k in [0usize, 1, 5, 20, 64] {
                    for tv in [f32::INFINITY, 0.0, row[len / 2], f32::NEG_INFINITY] {
                        let tv = if tv.is_nan() { f32::NEG_INFINITY } else { tv };
                        let mut plain = Vec::new();
                        let want = scan_row_generic(&row, tv, k, &mut plain);
                        // The row's split (`scan_row`'s), one of a chunk a part, and none (the
                        // row in order): the same results whatever the split.
                        let split = stream_part(len);
                        let parts = [split, split.min(CHUNK), 0];
                        for (&(name, scan), part) in
                            loops.iter().flat_map(|l| parts.map(|p| (l, p)))
                        {
                            let mut fast = Vec::new();
                            // SAFETY: the CPU has the loop's features (checked above).
                            let got = unsafe { scan(&row, tv, k, &mut fast, part) };
                            let at = format!(
                                "{name}, len {len}, part {part}, style {style}, k {k}, tv {tv}"
                            );
                            assert_eq!(got.0.to_bits(), want.0.to_bits(), "{at}");
                            assert_eq!((got.1, got.2), (want.1, want.2), "{at}");
                            let ids =
                                |top: &[(f32, usize)]| top.iter().map(|e| e.1).collect::<Vec<_>>();
                            assert_eq!(ids(&fast), ids(&plain), "{at}");
                        }
                    }
                }
            }
        }
    }

    /// The AVX2 pass, which reads a row in order whatever the split asked for.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_in_order(row: &[f32], tv: f32, k: usize, top: &mut TopK, _: usize) -> Counts {
        // SAFETY: the caller's promise.
        unsafe { avx2::scan_row(row, tv, k, top, None).0 }
    }

    /// The AVX2 pass with the normaliser (at T = 0.8), its counts.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx2_summed(row: &[f32], tv: f32, k: usize, top: &mut TopK, _: usize) -> Counts {
        // SAFETY: the caller's promise.
        unsafe { avx2::scan_with::<true>(row, tv, k, top, 1.25).0 }
    }

    /// The AVX-512 pass with the normaliser (at T = 0.8), its counts.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW/VL/DQ.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512_summed(row: &[f32], tv: f32, k: usize, top: &mut TopK, part: usize) -> Counts {
        // SAFETY: the caller's promise.
        unsafe { avx512::scan_parts_with::<true>(row, tv, k, top, part, 1.25).0 }
    }

    /// The one pass's normaliser, in every vector loop (and every split into parts of the
    /// AVX-512 one), is an f64 sum within 2e-5 on hostile rows (`float_math`'s: the maximum in
    /// the first and the last block, a ramp that moves the reference in every block, NaN and
    /// −inf among the logits, a row of −inf but one, large logits at small temperatures,
    /// lengths off every chunk and block size) at temperatures from 0.001 to 100; and it
    /// gives no sum where the row's maximum is ±inf (all −inf, all NaN, a +inf logit).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn one_pass_normaliser_matches_an_f64_sum() {
        use crate::float_math::tests::{HOSTILE_TEMPERATURES, f64_normaliser, hostile_rows};
        type Summed = unsafe fn(&[f32], usize, f32) -> (Counts, Partial);
        let mut loops: Vec<(&str, Summed)> = Vec::new();
        if has_avx512() {
            loops.push(("avx512", |row, part, inverse| unsafe {
                // SAFETY: AVX-512 is present (checked above).
                avx512::scan_parts_with::<true>(row, 0.0, 20, &mut Vec::new(), part, inverse)
            }));
        }
        if has_avx2() {
            loops.push(("avx2", |row, _, inverse| unsafe {
                // SAFETY: AVX2 is present (checked above).
                avx2::scan_with::<true>(row, 0.0, 20, &mut Vec::new(), inverse)
            }));
        }
        let mut rows = hostile_rows();
        let mut lcg = Lcg(41);
        let mut long = gaussian_row(&mut lcg, 151_936, 3.5);
        long[151_935] = 40.0;
        rows.push(("vocabulary row, maximum last".to_owned(), long));
        for (name, row) in &rows {
            let split = stream_part(row.len());
            for t in HOSTILE_TEMPERATURES {
                let (max, want) = f64_normaliser(row, t);
                for (&(isa, scan), part) in loops
                    .iter()
                    .flat_map(|l| [split, CHUNK.min(split), 0].map(|p| (l, p)))
                {
                    // SAFETY: the loop's features (checked above).
                    let (counts, partial) = unsafe { scan(row, part, 1.0 / t) };
                    assert_eq!(counts.0.to_bits(), max.to_bits(), "{isa} {name}");
                    let got = partial.at_max(counts.0);
                    let got = got.unwrap_or_else(|| panic!("{isa} {name}, t {t}: no sum"));
                    let error = (f64::from(got) / want - 1.0).abs();
                    assert!(
                        error <= 2e-5,
                        "{isa} {name}, part {part}, t {t}: {got} vs {want} ({error:e})"
                    );
                }
            }
        }
        let specials = [
            ("all -inf", vec![f32::NEG_INFINITY; 100]),
            ("all NaN", vec![f32::NAN; 37]),
            (
                "+inf",
                (0..300)
                    .map(|i| if i == 250 { f32::INFINITY } else { i as f32 })
                    .collect(),
            ),
        ];
        for (name, row) in specials {
            for &(isa, scan) in &loops {
                // SAFETY: the loop's features (checked above).
                let (counts, partial) = unsafe { scan(&row, stream_part(row.len()), 1.25) };
                assert_eq!(partial.at_max(counts.0), None, "{isa} {name}");
            }
        }
    }

    /// What `score_entry` gives by the two-pass path: the generic first pass, then the
    /// normaliser of `softmax` (`row_stats_after_max`).
    fn two_pass_entry(row: &[f32], t: f32, token: i32, k: usize) -> (f32, i32, Vec<i32>, Vec<f32>) {
        let vocab = row.len();
        let t = effective_temperature(t);
        let index = token_index(token, vocab);
        let tv = index.map(|i| rank_value(row[i])).unwrap_or(f32::INFINITY);
        let mut top = Vec::new();
        let (max, infs, larger) = scan_row_generic(row, tv, k, &mut top);
        let stats = row_stats_after_max(row, t, (max, infs), None);
        let lp = |i: usize| logprob(&stats, i, row[i], t, vocab);
        let (logprob, rank) = match index {
            Some(i) => (lp(i), i32::try_from(larger + 1).unwrap_or(i32::MAX)),
            None => (f32::NEG_INFINITY, 0),
        };
        let mut ids = vec![-1; k];
        let mut lps = vec![f32::NEG_INFINITY; k];
        for (slot, &(_, i)) in top.iter().enumerate() {
            ids[slot] = i as i32;
            lps[slot] = lp(i);
        }
        (logprob, rank, ids, lps)
    }

    /// `score_entry` (the one pass where it applies) gives the two-pass path's rank and top-K
    /// ids exactly and its log-probabilities within §5.11's tolerance on hostile rows (NaN and
    /// negative temperatures too); and the special rows, which take the two-pass path's
    /// fallbacks (T = 0, T = +inf, a maximum of ±inf, NaN rows, a temperature whose reciprocal
    /// is not normal), give its outputs bit for bit. Run on the AVX2 loops too with
    /// `SPECULA_CPU_MAX_ISA=avx2`.
    #[test]
    fn score_entry_matches_the_two_pass_path() {
        use crate::float_math::tests::{HOSTILE_TEMPERATURES, hostile_rows};
        let entry = |row: &[f32], t: f32, token: i32, k: usize| {
            let (mut lp, mut rank) = (0f32, 0i32);
            let (mut ids, mut lps) = (vec![0i32; k], vec![0f32; k]);
            let source = Source {
                row,
                temperature: t,
            };
            score_entry(source, token, &mut lp, &mut rank, &mut ids, &mut lps);
            (lp, rank, ids, lps)
        };
        let close =
            |a: f32, b: f32| a.to_bits() == b.to_bits() || (a - b).abs() <= 1e-4 + 1e-4 * b.abs();
        for (name, row) in hostile_rows() {
            // NaN and negative temperatures read as 1 (the one pass).
            for t in HOSTILE_TEMPERATURES.into_iter().chain([f32::NAN, -2.0]) {
                for token in [0i32, (row.len() / 2) as i32, -1] {
                    let got = entry(&row, t, token, 20);
                    let want = two_pass_entry(&row, t, token, 20);
                    let at = format!("{name}, t {t}, token {token}");
                    assert_eq!((got.1, &got.2), (want.1, &want.2), "{at}");
                    assert!(close(got.0, want.0), "{at}: {} vs {}", got.0, want.0);
                    for (g, w) in got.3.iter().zip(&want.3) {
                        assert!(close(*g, *w), "{at}: {g} vs {w}");
                    }
                }
            }
        }
        let mut with_inf: Vec<f32> = (0..500).map(|i| (i % 17) as f32 - 3.0).collect();
        with_inf[77] = f32::INFINITY;
        with_inf[401] = f32::INFINITY;
        let mut masked = vec![f32::NEG_INFINITY; 300];
        masked[5] = f32::NAN;
        let spread: Vec<f32> = (0..300).map(|i| (i % 23) as f32 * 0.5).collect();
        let specials: [(&str, Vec<f32>, f32); 6] = [
            ("+inf logits", with_inf, 0.8),
            ("all -inf", masked, 0.8),
            ("all NaN", vec![f32::NAN; 64], 1.0),
            ("T = 0", spread.clone(), 0.0),
            ("T = +inf", spread.clone(), f32::INFINITY),
            ("1/T not normal", spread, 1e-39),
        ];
        for (name, row, t) in specials {
            for token in [0i32, 77, 299, -1] {
                let (got, want) = (
                    entry(&row, t, token, 20),
                    two_pass_entry(&row, t, token, 20),
                );
                let bits = |e: &(f32, i32, Vec<i32>, Vec<f32>)| {
                    (
                        e.0.to_bits(),
                        e.1,
                        e.2.clone(),
                        e.3.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    )
                };
                assert_eq!(bits(&got), bits(&want), "{name}, token {token}");
            }
        }
    }

    /// Gaussian logits N(0, σ²) (the bench's rows).
    fn gaussian_row(lcg: &mut Lcg, v: usize, sigma: f64) -> Vec<f32> {
        (0..v)
            .map(|_| {
                let (u, w) = (f64::from(lcg.unit()).max(1e-12), f64::from(lcg.unit()));
                (sigma * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * w).cos()) as f32
            })
            .collect()
    }

    /// The costs of the first pass alone, of the one pass with the normaliser, and of a whole
    /// entry (K = 20; and at K = 0 without a token), on the bench's rows, one thread: cold (32 rows after a 400 MiB read, each
    /// row's least of 7, averaged) and warm (one row, least of 50), with a read of the rows
    /// beside them (run with `--ignored --nocapture`; `SPECULA_CPU_MAX_ISA=avx2` for the AVX2
    /// loops).
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore = "a measurement, not a check"]
    fn one_pass_costs() {
        use crate::sampling::probe::{cold_micros, evictor, least_us};
        const V: usize = 151_936;
        let mut lcg = Lcg(9);
        let evict = evictor();
        for (name, sigma, t) in [("sigma 3.5, T 0.8", 3.5, 0.8f32), ("flat", 3.0, 1.0)] {
            let rows: Vec<Vec<f32>> = (0..32).map(|_| gaussian_row(&mut lcg, V, sigma)).collect();
            let cold = |f: &mut dyn FnMut(usize)| cold_micros(rows.len(), &evict, f);
            let inverse = float_math::one_pass_inverse(t);
            let tv = rows[0][V / 2];
            let read = cold(&mut |i| {
                std::hint::black_box(rows[i].iter().map(|x| x.to_bits() as u64).sum::<u64>());
            });
            let mut top = Vec::with_capacity(20);
            let mut scan = |i: usize, inverse: Option<f32>| {
                top.clear();
                std::hint::black_box(scan_row(&rows[i], Some(tv), 20, &mut top, inverse));
            };
            let first = cold(&mut |i| scan(i, None));
            let one = cold(&mut |i| scan(i, inverse));
            let w_first = least_us(50, &mut || scan(0, None));
            let w_one = least_us(50, &mut || scan(0, inverse));
            let (mut ids, mut lps) = ([0i32; 20], [0f32; 20]);
            let mut entry = |i: usize| {
                let source = Source {
                    row: &rows[i][..],
                    temperature: t,
                };
                let (mut lp, mut rank) = (0f32, 0i32);
                score_entry(source, 7, &mut lp, &mut rank, &mut ids, &mut lps);
                std::hint::black_box((lp, rank));
            };
            let whole = cold(&mut entry);
            let w_whole = least_us(50, &mut || entry(0));
            let w_max = least_us(50, &mut || {
                std::hint::black_box(float_math::max_and_inf_count(&rows[0]));
            });
            let w_k0 = least_us(50, &mut || {
                let mut top = Vec::new();
                std::hint::black_box(scan_row(&rows[0], None, 0, &mut top, None));
            });
            let w_k0s = least_us(50, &mut || {
                let mut top = Vec::new();
                std::hint::black_box(scan_row(&rows[0], None, 0, &mut top, inverse));
            });
            println!(
                "{name}: cold per row: read {read:.1}, first pass {first:.1}, one pass {one:.1}, \
                 entry {whole:.1} us; warm: first pass {w_first:.1}, one pass {w_one:.1}, \
                 entry {w_whole:.1} us; warm at K = 0 (no token): first pass {w_k0:.1}, one pass \
                 {w_k0s:.1} us, a plain maximum and +inf count {w_max:.1} us"
            );
        }
    }

    /// `offer` keeps the same best `k` entries, in the same order, whatever order a row's
    /// entries come in: offered in a shuffled order (ties and NaN among them), the top-K is the
    /// one offered in id order.
    #[test]
    fn the_top_k_does_not_depend_on_the_offer_order() {
        let mut lcg = Lcg(5);
        for len in [1usize, 7, 40, 300] {
            let row: Vec<f32> = (0..len)
                .map(|i| match i % 13 {
                    4 => f32::NAN,
                    9 => f32::NEG_INFINITY,
                    _ => (lcg.unit() * 5.0).floor(),
                })
                .collect();
            let mut order: Vec<usize> = (0..len).collect();
            for i in (1..len).rev() {
                let j = (lcg.unit() * (i + 1) as f32) as usize;
                order.swap(i, j.min(i));
            }
            for k in [1usize, 3, 20, 64, 400] {
                let (mut plain, mut shuffled) = (Vec::new(), Vec::new());
                for (i, &x) in row.iter().enumerate() {
                    offer(&mut plain, k, x, i);
                }
                for &i in &order {
                    offer(&mut shuffled, k, row[i], i);
                }
                let ids = |top: &[(f32, usize)]| top.iter().map(|e| e.1).collect::<Vec<_>>();
                assert_eq!(ids(&shuffled), ids(&plain), "len {len}, k {k}");
            }
        }
    }
}

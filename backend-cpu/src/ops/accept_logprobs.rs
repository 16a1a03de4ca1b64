//! `accept_logprobs` (`docs/semantics.md` §5.11): log-probabilities, ranks and top-K of the accepted tokens.
//!
//! The accepted counts are packed first (a short sequential prefix sum); then every packed entry is
//! independent and runs in parallel. Per entry the source row is read twice: one pass for the
//! maximum, the token's rank and the top-K (a bounded insertion into at most K ≤ 64 slots, never a
//! sort of the row; a chunk of 16 logits is looked at only when its maximum can enter the top-K),
//! one for the normaliser (vectorised `exp`, `float_math`). Log-probabilities follow the softmax rules exactly
//! (same temperature handling and special rows), so `exp(logprob)` is what `softmax` returns
//! (within the tolerance of §5.11).
//!
//! f32 rows on AVX-512 take hand-written loops: the first pass in sixteen lanes (maximum, +inf
//! count and rank count as vector operations; a chunk goes to the top-K only when one of its
//! logits beats the K-th, by one compare), and the normaliser in sixteen lanes with a multiply by
//! `1/T` (`float_math::sum_exp_reciprocal`). The AVX-512 first pass reads the row's four
//! quarters side by side, a chunk of each in turn (four memory streams in flight); the result
//! does not depend on that order (`STREAMS`). The AVX2 one reads it in order (four lost there).

use rayon::prelude::*;
use specula_backend_api::ops::accept_logprobs::OpCall;
use specula_backend_api::ops::*;
use specula_backend_api::{DType, FloatElement, Op, Result};

use super::argmax::ranks_above;
use super::softmax::{RowStats, effective_temperature, row_stats_after_max, scaled};
use super::{len_or_zero, token_index, with_float};
use crate::CpuDevice;
use crate::float_math;
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
    for (j, &value) in chunk.iter().enumerate() {
        offer(top, k, value, first + j);
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
/// above `token_value`, and the best `k` logits into `top`.
fn scan_row<T: FloatElement>(
    row: &[T],
    token_value: Option<f32>,
    k: usize,
    top: &mut TopK,
) -> RowScan {
    // Nothing ranks above +inf under `>`: no token counts nothing.
    let tv = token_value.unwrap_or(f32::INFINITY);
    let (max, inf_count, larger) = match as_f32(row) {
        // SAFETY: AVX-512F/BW/VL/DQ are present.
        #[cfg(target_arch = "x86_64")]
        Some(values) if has_avx512() => unsafe { avx512::scan_row(values, tv, k, top) },
        // SAFETY: AVX2 and FMA are present.
        #[cfg(target_arch = "x86_64")]
        Some(values) if has_avx2() => unsafe { avx2::scan_row(values, tv, k, top) },
        _ => dispatch!(scan_row_generic::<T>(row, tv, k, top) via scan_row_avx512, scan_row_avx2),
    };
    RowScan {
        max,
        inf_count,
        larger,
    }
}

/// `row` as f32 values, when it is an f32 row.
fn as_f32<T: FloatElement>(row: &[T]) -> Option<&[f32]> {
    if T::DTYPE != DType::F32 {
        return None;
    }
    bytemuck::try_cast_slice::<T, f32>(row).ok()
}

/// The normaliser `Σ exp(y)` of a row whose maximum `max` is finite, at a finite `t > 0`, where
/// the AVX-512 loop applies (f32 rows); `None` elsewhere. `next` is the row this thread likely
/// scores next (asked for into L2 meanwhile).
fn fast_sum<T: FloatElement>(row: &[T], t: f32, max: f32, next: &[T]) -> Option<f32> {
    if t == 0.0 || !t.is_finite() || !max.is_finite() {
        return None;
    }
    let next = as_f32(next).unwrap_or(&[]);
    float_math::sum_exp_reciprocal(as_f32(row)?, max, t, next)
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
    /// The row of the next entry (empty if none): asked for into L2 while this one is summed.
    next: &'a [T],
}

/// Scores one packed entry: writes its log-probability and rank, and fills its top-K slots.
fn score_entry<T: FloatElement>(
    Source {
        row,
        temperature,
        next,
    }: Source<'_, T>,
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
    // One pass for the maximum, the rank and the top-K, one for the normaliser.
    let scan = scan_row(row, token_value, k, &mut top);
    let stats = match fast_sum(row, t, scan.max, next) {
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

/// Logits in each of the [`STREAMS`] parts of a row of `len` (whole chunks; 0 for a row under
/// `STREAMS` chunks, which is then read in order).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn stream_part(len: usize) -> usize {
    len / (STREAMS * CHUNK) * CHUNK
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
    #[inline(always)]
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
    use super::{CHUNK, Counts, Gate, STREAMS, TopK, stream_part};
    use std::arch::x86_64::*;

    /// The pass's lanes: a maximum per part (the rest of the row in the last), the +inf and
    /// above-the-token counts, the top-K and its gate.
    struct Lanes<'t> {
        max: [__m512; STREAMS],
        infs: __m512i,
        above: __m512i,
        tv: __m512,
        k: usize,
        top: &'t mut TopK,
        gate: Gate,
    }

    impl Lanes<'_> {
        /// Takes in the chunk `chunk` (ids from `first`, its values in `x`, NaN past its end)
        /// into the maximum of part `part`, the counts and the top-K.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
        #[inline]
        fn step(&mut self, x: __m512, chunk: &[f32], first: usize, part: usize) {
            // `max(x, m)` returns `m` for a NaN `x` and on a tie: `x > m ? x : m`.
            self.max[part] = _mm512_max_ps(x, self.max[part]);
            let one = _mm512_set1_epi32(1);
            let is_inf = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_set1_ps(f32::INFINITY));
            self.infs = _mm512_mask_add_epi32(self.infs, is_inf, self.infs, one);
            let is_above = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, self.tv);
            self.above = _mm512_mask_add_epi32(self.above, is_above, self.above, one);
            if self.k == 0 {
                return;
            }
            let gate = self.gate;
            let last = _mm512_set1_ps(gate.last);
            if gate.open
                || (_mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, last) != 0
                    && (first < gate.last_id || _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, last) != 0))
            {
                self.gate.offer(self.top, self.k, chunk, first);
            }
        }
    }

    /// The maximum (NaN ignored), the +inf count and the count above `tv` of `row`, and its
    /// best `k` logits into `top`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW/VL/DQ.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) unsafe fn scan_row(row: &[f32], tv: f32, k: usize, top: &mut TopK) -> Counts {
        // SAFETY: the caller's promise.
        unsafe { scan_parts(row, tv, k, top, stream_part(row.len())) }
    }

    /// [`scan_row`] with parts of `part` logits (a multiple of [`CHUNK`], at most a
    /// [`STREAMS`]th of the row; 0 reads the row in order).
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW/VL/DQ.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) unsafe fn scan_parts(
        row: &[f32],
        tv: f32,
        k: usize,
        top: &mut TopK,
        part: usize,
    ) -> Counts {
        let mut lanes = Lanes {
            max: [_mm512_set1_ps(f32::NEG_INFINITY); STREAMS],
            infs: _mm512_setzero_si512(),
            above: _mm512_setzero_si512(),
            tv: _mm512_set1_ps(tv),
            k,
            top,
            gate: Gate::new(k),
        };
        let (streams, rest) = row.split_at(STREAMS * part);
        for first in (0..part).step_by(CHUNK) {
            for p in 0..STREAMS {
                let at = p * part + first;
                let chunk = &streams[at..at + CHUNK];
                // SAFETY: `chunk` holds 16 f32.
                let x = unsafe { _mm512_loadu_ps(chunk.as_ptr()) };
                lanes.step(x, chunk, at, p);
            }
        }
        for (c, chunk) in rest.chunks(CHUNK).enumerate() {
            let bits = (1u32 << chunk.len()) - 1;
            // SAFETY: the mask reads only the `chunk.len()` values of `chunk`; the other lanes
            // are NaN, which no count, maximum or compare takes.
            let x = unsafe {
                _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NAN), bits as __mmask16, chunk.as_ptr())
            };
            lanes.step(x, chunk, STREAMS * part + c * CHUNK, STREAMS - 1);
        }
        // The parts' maxima in index order: a later part's only where strictly greater.
        let max = lanes.max[1..]
            .iter()
            .fold(lanes.max[0], |m, &p| _mm512_max_ps(p, m));
        let mut values = [0f32; 16];
        // SAFETY: `values` holds 16 f32.
        unsafe { _mm512_storeu_ps(values.as_mut_ptr(), max) };
        let best = values
            .iter()
            .fold(f32::NEG_INFINITY, |b, &m| if m > b { m } else { b });
        let count = |v: __m512i| _mm512_reduce_add_epi32(v) as u32 as usize;
        (best, count(lanes.infs), count(lanes.above))
    }
}

/// The first pass over an f32 row in AVX2 lanes (two vectors of 8 per chunk of [`CHUNK`]), as
/// the AVX-512 one but in order: read in four parts (the AVX-512 loop's way, eight maxima and the
/// counts in the sixteen AVX2 registers) it lost to this loop in `specula bench`
/// (`SPECULA_CPU_MAX_ISA=avx2`, `docs/bench/stop40-streams-accept-avx2.txt`).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{CHUNK, Counts, TopK, offer_chunk};
    use std::arch::x86_64::*;

    /// See the AVX-512 loop.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scan_row(row: &[f32], tv: f32, k: usize, top: &mut TopK) -> Counts {
        let (inf, tvv) = (_mm256_set1_ps(f32::INFINITY), _mm256_set1_ps(tv));
        let mut max = [_mm256_set1_ps(f32::NEG_INFINITY); 2];
        let mut infs = [_mm256_setzero_si256(); 2];
        let mut above = [_mm256_setzero_si256(); 2];
        let mut open = k > 0;
        let mut last = _mm256_set1_ps(f32::NAN);
        for (c, chunk) in row.chunks(CHUNK).enumerate() {
            let mut beats = 0;
            for h in 0..2 {
                let x = if chunk.len() == CHUNK {
                    // SAFETY: `chunk` holds 16 f32.
                    unsafe { _mm256_loadu_ps(chunk.as_ptr().add(8 * h)) }
                } else {
                    // The short last chunk: its values, NaN in the other lanes (no count,
                    // maximum or compare below takes NaN).
                    let mut lanes = [f32::NAN; 8];
                    for (l, &v) in lanes.iter_mut().zip(chunk.iter().skip(8 * h)) {
                        *l = v;
                    }
                    // SAFETY: `lanes` holds 8 f32.
                    unsafe { _mm256_loadu_ps(lanes.as_ptr()) }
                };
                // `max(x, m)` returns `m` for a NaN `x`: `x > m ? x : m`.
                max[h] = _mm256_max_ps(x, max[h]);
                // A true compare is −1 in every bit: subtracting it counts 1.
                let is_inf = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_EQ_OQ>(x, inf));
                infs[h] = _mm256_sub_epi32(infs[h], is_inf);
                let is_above = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(x, tvv));
                above[h] = _mm256_sub_epi32(above[h], is_above);
                beats |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(x, last));
            }
            if k == 0 {
                continue;
            }
            if open || beats != 0 {
                // Ids arrive in order: an equal logit never ranks above the K-th entry.
                match offer_chunk(top, k, chunk, c * CHUNK) {
                    Some((l, _)) => (open, last) = (false, _mm256_set1_ps(l)),
                    None => open = true,
                }
            }
        }
        let mut lanes = [0f32; 16];
        // SAFETY: `lanes` holds 16 f32.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), max[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), max[1]);
        }
        let best = lanes
            .iter()
            .fold(f32::NEG_INFINITY, |b, &m| if m > b { m } else { b });
        let count = |v: [__m256i; 2]| {
            let mut counts = [0u32; 16];
            // SAFETY: `counts` holds 16 u32.
            unsafe {
                _mm256_storeu_si256(counts.as_mut_ptr().cast(), v[0]);
                _mm256_storeu_si256(counts.as_mut_ptr().add(8).cast(), v[1]);
            }
            counts.iter().map(|&c| c as usize).sum::<usize>()
        };
        (best, count(infs), count(above))
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
                        let next = row_of(entries.get(p + 1)).map_or(&[][..], |(next, _)| next);
                        let source = Source { row, temperature, next };
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
        }
        if has_avx2() {
            loops.push(("avx2", avx2_in_order));
        }
        if loops.is_empty() {
            eprintln!("skipped: no vector loops on this CPU");
            return;
        }
        let mut lcg = Lcg(23);
        // Around every split into parts (`STREAMS` × `CHUNK` = 64) and the short last chunk.
        let lens = [
            1usize, 15, 16, 17, 33, 63, 64, 65, 127, 128, 129, 500, 4099, 4160,
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
        unsafe { avx2::scan_row(row, tv, k, top) }
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

//! `process_logits` (`docs/semantics.md` §5.12, §4c): one row per task.
//!
//! Each row takes one dense pass over its 32-token mask words — the dense masks (`allowed`, the
//! runner's bitmask) and the penalties from the slot's count table, with no bias and no drafts —
//! then recomputes from the input value every token that a sparse rule touches (bias entries, the
//! drafts before the row, end tokens under `min_tokens`, bad-word bans) with the complete rule.
//! The history is never rebuilt: the drafts before the row are a per-token count delta, and only
//! multi-token bad words look at the last generated tokens. min_p needs no per-token weights:
//! weights never increase down the rank order, so the kept logits are those at or above one
//! threshold, found by a binary search over f32 values.

use rayon::prelude::*;
use specula_backend_api::fixed_point::weight;
use specula_backend_api::logit_weights::{RowScale, row_scale, sanitize_logit, scaled_weight};
use specula_backend_api::ops::process_logits::{OpCall, PENALTY_FIELDS, mask_words, penalty};
use specula_backend_api::ops::{ProcessInputs, ProcessParams, RowBlock, ScoresKind, VocabSlice};
use specula_backend_api::{DType, FloatElement, Op, Result};

use super::{len_or_zero, token_index, with_float};
use crate::CpuDevice;
use crate::sampling::logits::key_select;
use crate::sampling::scan::{compiled_for, dispatch, dispatched};

pub(crate) mod counted;
mod fused;
#[cfg(target_arch = "x86_64")]
use crate::sampling::scan::{has_avx2, has_avx512};
pub(crate) use fused::run_processed_sample;
use specula_backend_api::host::{ProcessSlices, slice, slice_mut};

/// The largest count the frequency penalty sees.
const MAX_COUNT: i32 = 1 << 24;

/// `2^-32` and `2^32`: the range of usable repetition factors.
const FACTOR_MIN: f32 = f32::from_bits(0x2f80_0000);
const FACTOR_MAX: f32 = f32::from_bits(0x4f80_0000);

/// `2^64`: the largest magnitude the float steps read.
const HUGE: f32 = f32::from_bits(0x5f80_0000);

/// A bias value, β or γ as the float steps read it: NaN is 0, `|x| < 2^-76` is 0, `|x| > 2^64`
/// (±inf included) is ±2^64.
#[inline]
fn additive(x: f32) -> f32 {
    if x.is_nan() {
        0.0
    } else {
        sanitize_logit(x.clamp(-HUGE, HUGE))
    }
}

/// A logit as the rank order reads it: NaN is −inf, every other value as it is.
#[inline(always)]
fn unprocessed(x: f32) -> f32 {
    if x.is_nan() { f32::NEG_INFINITY } else { x }
}

/// The output of the float steps on logit `x`, which ended on `result` (sanitized): `x` itself
/// (NaN as −inf) when they left its sanitized reading as it was, so that a token no step
/// changes keeps its rank (`docs/semantics.md` §4c).
#[inline(always)]
fn stepped(x: f32, result: f32) -> f32 {
    if result == sanitize_logit(x) {
        unprocessed(x)
    } else {
        result
    }
}

/// Every buffer the rows read, as host slices (the unpacking shared with the reference,
/// [`ProcessSlices`], which a `Batch` dereferences to), and what the CPU derives from them.
struct Batch<'a> {
    host: ProcessSlices<'a>,
    logits: bool,
    /// Per slot, one bit per 32-token word that a penalty may change (see [`penalized_words`]).
    penalized: &'a [u64],
    /// Per slot of the table, one bit per token with a positive count ([`counted::Counted`]),
    /// current for the slots [`penalized_slots`] names.
    counted: &'a [u32],
}

impl<'a> std::ops::Deref for Batch<'a> {
    type Target = ProcessSlices<'a>;

    fn deref(&self) -> &ProcessSlices<'a> {
        &self.host
    }
}

/// One row's slot, position and parameters.
struct Row<'a> {
    r: usize,
    b: usize,
    repetition: Option<(f32, f32)>,
    frequency: f32,
    presence: f32,
    min_p: u64,
    counts: &'a [i32],
    prompt: &'a [u32],
    /// The slot's bits of [`Batch::penalized`].
    penalized: &'a [u64],
    /// The slot's words of [`Batch::counted`].
    counted: &'a [u32],
    drafts: &'a [i32],
    bias: (&'a [i32], &'a [f32]),
    end_masked: bool,
    banned: Vec<usize>,
}

/// `offsets[b] .. offsets[b + 1]` when it is a valid range of a `len`-entry list, else empty.
fn list_range(offsets: &[i32], b: usize, len: usize) -> std::ops::Range<usize> {
    match (usize::try_from(offsets[b]), usize::try_from(offsets[b + 1])) {
        (Ok(start), Ok(end)) if start <= end && end <= len => start..end,
        _ => 0..0,
    }
}

impl<'a> Batch<'a> {
    /// Row `r`'s slot and position, or `None` for a row of no slot.
    fn source(&self, r: usize) -> Option<(usize, usize)> {
        let b = usize::try_from(self.batch_id[r])
            .ok()
            .filter(|&b| b < self.real_bsz)?;
        let pos = usize::try_from(r as i64 - i64::from(self.cu_out[b])).ok()?;
        (pos < self.s).then_some((b, pos))
    }

    /// Row `r` of slot `b` at position `pos`, with its parameters and sparse masks.
    fn row(&self, r: usize, b: usize, pos: usize) -> Row<'a> {
        let p = &self.penalties[b * PENALTY_FIELDS..(b + 1) * PENALTY_FIELDS];
        let factors = (p[penalty::REPETITION], p[penalty::REPETITION_INVERSE]);
        let usable = |x: f32| (FACTOR_MIN..=FACTOR_MAX).contains(&x);
        let min_p = p[penalty::MIN_P];
        let words = mask_words(self.vocab);
        let drafts = &self.draft_tokens[b * self.s + 1..b * self.s + 1 + pos];
        let bias = list_range(self.bias_offsets, b, self.bias_ids.len());
        let generated = i64::from(self.step_idx[b].max(0)) + pos as i64;
        Row {
            r,
            b,
            repetition: (usable(factors.0) && usable(factors.1)).then_some(factors),
            frequency: additive(p[penalty::FREQUENCY]),
            presence: additive(p[penalty::PRESENCE]),
            min_p: if min_p > 0.0 {
                (f64::from(min_p.min(1.0)) * f64::from(1u32 << 24)).ceil() as u64
            } else {
                0
            },
            counts: &self.token_counts[b * self.vocab..(b + 1) * self.vocab],
            prompt: &self.prompt_mask[b * words..(b + 1) * words],
            penalized: {
                let n = words.div_ceil(64);
                &self.penalized[b * n..(b + 1) * n]
            },
            counted: &self.counted[b * words..(b + 1) * words],
            drafts,
            bias: (&self.bias_ids[bias.clone()], &self.bias_values[bias]),
            end_masked: generated < i64::from(self.min_tokens[b]),
            banned: self.banned(b, drafts),
        }
    }

    /// The tokens slot `b`'s bad words ban for a row whose history ends with `drafts`.
    fn banned(&self, b: usize, drafts: &[i32]) -> Vec<usize> {
        let list = &self.bad_words[list_range(self.bad_word_offsets, b, self.bad_words.len())];
        let generated = self.generated(b);
        let mut banned = Vec::new();
        let mut k = 0;
        while k < list.len() {
            let n = list[k];
            if n < 1 || n as usize >= list.len() - k {
                break;
            }
            let entry = &list[k + 1..=k + n as usize];
            k += n as usize + 1;
            let (prefix, last) = entry.split_at(entry.len() - 1);
            if history_ends_with(generated, drafts, prefix) {
                banned.extend(token_index(last[0], self.vocab));
            }
        }
        banned
    }

    /// Slot `b`'s generated tokens in `token_ids_all`.
    fn generated(&self, b: usize) -> &'a [i32] {
        let row = &self.token_ids_all[b * self.max_model_len..(b + 1) * self.max_model_len];
        let prompt = len_or_zero(self.prompt_lens[b]).min(self.max_model_len);
        let end = (prompt + len_or_zero(self.step_idx[b])).min(self.max_model_len);
        &row[prompt..end]
    }

    /// Asks for the cache lines of the dense mask words `w` of row `r` (slot `b`) ahead of
    /// their use: the fused pass reads only the words of the chunks that may enter the top k,
    /// too sparse for the hardware to see a stream, so each read would otherwise wait on memory.
    #[inline(always)]
    fn prefetch_dense_words(&self, r: usize, b: usize, w: usize) {
        let words = mask_words(self.vocab);
        if let Some(allowed) = self.allowed {
            prefetch(allowed, b * words + w);
        }
        if let Some(bitmask) = self.bitmask {
            prefetch(bitmask, r * words + w);
        }
    }

    /// Whether the dense masks keep token `v` of row `r` (slot `b`).
    #[inline]
    fn dense_word(&self, r: usize, b: usize, w: usize) -> u32 {
        let words = mask_words(self.vocab);
        let allowed = self.allowed.map_or(u32::MAX, |a| a[b * words + w]);
        let bitmask = self.bitmask.map_or(u32::MAX, |m| m[r * words + w]);
        allowed & bitmask
    }
}

/// A hint to bring the cache line of `slice[i]` in; nothing when `i` is outside `slice`.
#[inline(always)]
fn prefetch<T>(slice: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = slice.get(i) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: a prefetch reads nothing and cannot fault (SSE, which has it, is part of every
        // x86_64 CPU); the address is an element of `slice`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(x).cast()) };
    }
}

/// Whether `generated ++ drafts` ends with `suffix`.
fn history_ends_with(generated: &[i32], drafts: &[i32], suffix: &[i32]) -> bool {
    let n = suffix.len();
    if n > generated.len() + drafts.len() {
        return false;
    }
    let from_drafts = n.min(drafts.len());
    let (head, tail) = suffix.split_at(n - from_drafts);
    drafts.ends_with(tail) && generated.ends_with(head)
}

impl Row<'_> {
    /// Whether a penalty may change a token of word `w` ([`penalized_words`]).
    #[inline(always)]
    fn penalizes_word(&self, w: usize) -> bool {
        self.penalized[w / 64] >> (w % 64) & 1 == 1
    }

    /// Whether no penalty raises a value (`α ≥ 1`, `β ≥ 0`, `γ ≥ 0`): then every processed
    /// value outside the sparse tokens is at most its input (NaN as −inf).
    fn never_raises(&self) -> bool {
        self.repetition
            .is_none_or(|(alpha, inverse)| alpha >= 1.0 && inverse <= 1.0)
            && self.frequency >= 0.0
            && self.presence >= 0.0
    }

    /// Token `v`'s logit after the dense rules alone, given its input `x`: what
    /// [`dense_word_values`] writes for it (−inf when a dense mask drops it).
    #[inline]
    fn dense_logit(&self, batch: &Batch<'_>, v: usize, x: f32) -> f32 {
        let (w, j) = (v / 32, v % 32);
        if batch.dense_word(self.r, self.b, w) >> j & 1 == 0 {
            return f32::NEG_INFINITY;
        }
        if !self.penalizes_word(w) {
            return unprocessed(x);
        }
        // The word is penalized, so the slot's counted bits are current.
        let count = if self.counted[w] >> j & 1 == 1 {
            self.base_count(v)
        } else {
            0
        };
        stepped(x, self.penalize(sanitize_logit(x), v, count))
    }

    /// The slot's count of `v` (negative table entries count as 0), without the drafts.
    #[inline]
    fn base_count(&self, v: usize) -> i32 {
        self.counts[v].clamp(0, MAX_COUNT)
    }

    #[inline]
    fn in_prompt(&self, v: usize) -> bool {
        self.prompt[v / 32] >> (v % 32) & 1 == 1
    }

    /// The float steps on a sanitized logit, with `count` capped and a bias already added.
    #[inline]
    fn penalize(&self, mut l: f32, v: usize, count: i32) -> f32 {
        if let Some((alpha, inverse)) = self.repetition
            && (count > 0 || self.in_prompt(v))
        {
            l = sanitize_logit(if l > 0.0 { l * inverse } else { l * alpha });
        }
        if count > 0 {
            l = sanitize_logit(l - self.frequency * count as f32);
            l = sanitize_logit(l - self.presence);
        }
        l
    }

    /// Whether a sparse rule (end tokens, bad words) masks `v`.
    fn sparse_masked(&self, v: usize, end_tokens: &[i32]) -> bool {
        let is = |t: &i32| usize::try_from(*t).is_ok_and(|t| t == v);
        (self.end_masked && end_tokens.iter().any(is)) || self.banned.contains(&v)
    }

    /// Token `v`'s complete value (every rule), given its input value `x`.
    fn full_value(&self, batch: &Batch<'_>, v: usize, x: f32, dense_kept: bool) -> Option<f32> {
        if !dense_kept || self.sparse_masked(v, batch.end_tokens) {
            return None;
        }
        if !batch.logits {
            return Some(sanitize_prob(x));
        }
        let mut l = sanitize_logit(x);
        let is_v = |t: &i32| usize::try_from(*t).is_ok_and(|t| t == v);
        if let Some(k) = self.bias.0.iter().rposition(is_v) {
            l = sanitize_logit(l + additive(self.bias.1[k]));
        }
        let delta = self.drafts.iter().filter(|t| is_v(t)).count() as i32;
        let count = (self.base_count(v) + delta).min(MAX_COUNT);
        Some(stepped(x, self.penalize(l, v, count)))
    }

    /// Token `v`'s processed value (every rule, `masked_value` when masked), given its input
    /// value `x`: what the sparse rules write over the dense pass's value.
    fn patched_value(&self, batch: &Batch<'_>, v: usize, x: f32, masked_value: f32) -> f32 {
        let kept = batch.dense_word(self.r, self.b, v / 32) >> (v % 32) & 1 == 1;
        self.full_value(batch, v, x, kept).unwrap_or(masked_value)
    }

    /// The tokens a sparse rule touches (with repeats).
    fn touched(&self, batch: &Batch<'_>) -> Vec<usize> {
        let vocab = batch.vocab;
        let mut touched: Vec<usize> = self.banned.clone();
        touched.extend(self.bias.0.iter().filter_map(|&t| token_index(t, vocab)));
        touched.extend(self.drafts.iter().filter_map(|&t| token_index(t, vocab)));
        if self.end_masked {
            touched.extend(
                batch
                    .end_tokens
                    .iter()
                    .filter_map(|&t| token_index(t, vocab)),
            );
        }
        touched
    }
}

/// `sanitize(p)` of `docs/semantics.md` §4: 0 for NaN and `p ≤ 0`, 1 above 1.
#[inline]
fn sanitize_prob(p: f32) -> f32 {
    if p > 1.0 {
        1.0
    } else if p > 0.0 {
        p
    } else {
        0.0
    }
}

/// The order key of a processed value (never NaN): the rank key of a logit, the bits of a
/// (sanitized) probability (both larger-is-first).
#[inline]
fn rank_key(value: f32, logits: bool) -> u32 {
    if logits {
        key_select(value)
    } else {
        value.to_bits()
    }
}

/// Processes one row into `out` and returns its fallback.
fn process_row<T: FloatElement>(batch: &Batch<'_>, r: usize, input: &[T], out: &mut [f32]) -> i32 {
    let masked_value = if batch.logits { f32::NEG_INFINITY } else { 0.0 };
    let Some((b, pos)) = batch.source(r) else {
        out.fill(masked_value);
        return -1;
    };
    let row = batch.row(r, b, pos);
    let dense_best = dense_pass(batch, &row, input, out, masked_value);
    let (mut best_key, mut stale) = (dense_best, false);
    for v in row.touched(batch) {
        // The dense pass's value of a touched token may have been the row's largest.
        stale |= rank_key(out[v], batch.logits) == dense_best;
        out[v] = row.patched_value(batch, v, input[v].to_f32(), masked_value);
        best_key = best_key.max(rank_key(out[v], batch.logits));
    }
    if stale {
        best_key = out
            .iter()
            .map(|&x| rank_key(x, batch.logits))
            .max()
            .unwrap_or(0);
    }
    let best = first_with_key(out, best_key, batch.logits);
    let fallback = if best_key > rank_key(masked_value, batch.logits) {
        best as i32
    } else {
        first_unmasked(batch, &row, 0..out.len())
    };
    if row.min_p > 0 {
        apply_min_p(batch, &row, out, best, masked_value);
    }
    fallback
}

/// Processes row `r` of one rank's slice (`docs/semantics.md` §4d) into `out` and returns its
/// fallback: the slice's first unmasked token in rank order (a global id), or -1. `input` and
/// `out` hold the ids `first ..`; every rule reads its tables by global id; no min_p (the
/// sharded ops apply it against the whole row's maximum).
fn process_slice_row<T: FloatElement>(
    batch: &Batch<'_>,
    (r, first): (usize, usize),
    input: &[T],
    out: &mut [f32],
) -> i32 {
    let masked_value = if batch.logits { f32::NEG_INFINITY } else { 0.0 };
    let Some((b, pos)) = batch.source(r) else {
        out.fill(masked_value);
        return -1;
    };
    let row = batch.row(r, b, pos);
    for (j, (x, o)) in input.iter().zip(out.iter_mut()).enumerate() {
        let v = first + j;
        *o = if batch.logits {
            row.dense_logit(batch, v, x.to_f32())
        } else if batch.dense_word(r, b, v / 32) >> (v % 32) & 1 == 1 {
            sanitize_prob(x.to_f32())
        } else {
            0.0
        };
    }
    let ids = first..first + out.len();
    for v in row.touched(batch).into_iter().filter(|v| ids.contains(v)) {
        let x = input[v - first].to_f32();
        out[v - first] = row.patched_value(batch, v, x, masked_value);
    }
    let best_key = out
        .iter()
        .map(|&x| rank_key(x, batch.logits))
        .max()
        .unwrap_or(0);
    if best_key > rank_key(masked_value, batch.logits) {
        (first + first_with_key(out, best_key, batch.logits)) as i32
    } else {
        first_unmasked(batch, &row, ids)
    }
}

dispatched!(
    /// The dense rules on every token: masks from the mask words, and for logits the penalties
    /// from the slot's counts (no bias, no drafts). Returns the largest rank key written. Runs the
    /// loop compiled for the widest vector unit of the CPU.
    fn dense_pass [T: FloatElement]
        (batch: &Batch<'_>, row: &Row<'_>, input: &[T], out: &mut [f32], masked_value: f32) -> u32
        = dense_pass_generic [T]
);

/// [`dense_pass`] as written. A word that no mask, prompt token or count touches (nearly all of
/// them) takes a branch-free loop.
#[inline(always)]
fn dense_pass_generic<T: FloatElement>(
    batch: &Batch<'_>,
    row: &Row<'_>,
    input: &[T],
    out: &mut [f32],
    masked_value: f32,
) -> u32 {
    let mut best = 0u32;
    for (w, (src, dst)) in input.chunks(32).zip(out.chunks_mut(32)).enumerate() {
        best = best.max(dense_word_values(batch, row, w, src, dst, masked_value));
    }
    best
}

/// The dense rules on the tokens of word `w` (`src` into `dst`); returns the largest rank key
/// written.
#[inline(always)]
fn dense_word_values<T: FloatElement>(
    batch: &Batch<'_>,
    row: &Row<'_>,
    w: usize,
    src: &[T],
    dst: &mut [f32],
    masked_value: f32,
) -> u32 {
    let kept = batch.dense_word(row.r, row.b, w);
    if !row.penalizes_word(w) {
        return plain_word(src, dst, kept, batch.logits);
    }
    let mut best = 0u32;
    let counted = row.counted[w];
    for (j, (x, o)) in src.iter().zip(dst.iter_mut()).enumerate() {
        let x = x.to_f32();
        *o = if kept >> j & 1 == 0 {
            masked_value
        } else if !batch.logits {
            sanitize_prob(x)
        } else {
            // The word is penalized, so the slot's counted bits are current: only the tokens
            // of a positive count read the count table.
            let v = w * 32 + j;
            let count = if counted >> j & 1 == 1 {
                row.base_count(v)
            } else {
                0
            };
            stepped(x, row.penalize(sanitize_logit(x), v, count))
        };
        best = best.max(rank_key(*o, batch.logits));
    }
    best
}

/// A word of tokens no penalty touches: each value as it is (logits: NaN as −inf; probabilities
/// sanitized), or the masked value where `kept` has a 0 bit; returns the largest rank key.
/// Written with selects only, so that the loop vectorizes.
#[inline(always)]
fn plain_word<T: FloatElement>(src: &[T], dst: &mut [f32], kept: u32, logits: bool) -> u32 {
    let mut best = 0u32;
    if logits
        && T::DTYPE == DType::F32
        && let Ok(src) = bytemuck::try_cast_slice::<T, u32>(src)
        && let (Ok(src), Ok(dst)) = (
            <&[u32; 32]>::try_from(src),
            <&mut [u32; 32]>::try_from(bytemuck::cast_slice_mut::<f32, u32>(dst)),
        )
    {
        return plain_f32_word(src, dst, kept);
    }
    for (j, (x, o)) in src.iter().zip(dst.iter_mut()).enumerate() {
        let on = kept >> j & 1 == 1;
        *o = match (logits, on) {
            (true, true) => unprocessed(x.to_f32()),
            (true, false) => f32::NEG_INFINITY,
            (false, true) => sanitize_prob(x.to_f32()),
            (false, false) => 0.0,
        };
        best = best.max(rank_key(*o, logits));
    }
    best
}

/// A whole word of f32 logits no penalty touches, on their bits (integer selects vectorise
/// reliably): each as it is (NaN as −inf), −inf where `kept` has a 0 bit; returns the largest
/// rank key.
#[inline(always)]
fn plain_f32_word(src: &[u32; 32], dst: &mut [u32; 32], kept: u32) -> u32 {
    const INF: u32 = 0x7f80_0000;
    const SIGN: u32 = 0x8000_0000;
    let mut keys = [0u32; 32];
    for j in 0..32 {
        let b = src[j];
        let y = if b & !SIGN > INF { INF | SIGN } else { b };
        // A masked token is −inf.
        let y = if kept >> j & 1 == 1 { y } else { INF | SIGN };
        dst[j] = y;
        // −0 keys as +0.
        let z = if y == SIGN { 0 } else { y };
        let sign = ((z as i32) >> 31) as u32;
        keys[j] = z ^ (sign | SIGN);
    }
    keys.into_iter().fold(0, u32::max)
}

/// The first token whose rank key is `key` (the row's largest).
fn first_with_key(out: &[f32], key: u32, logits: bool) -> usize {
    if logits {
        // The processed logits are never NaN: the key's value is the one float (or ±0) with
        // that key.
        let value = f32::from_bits(if key >> 31 == 1 {
            key ^ 0x8000_0000
        } else {
            !key
        });
        return dispatch!(first_equal_generic::<f32>(out, value)
            via first_equal_avx512, first_equal_avx2);
    }
    out.iter()
        .position(|&x| rank_key(x, logits) == key)
        .unwrap_or(0)
}

compiled_for!(avx512, fn first_equal_avx512 [T: PartialEq + Copy] (out: &[T], value: T) -> usize
    = first_equal_generic [T]);
compiled_for!(avx2, fn first_equal_avx2 [T: PartialEq + Copy] (out: &[T], value: T) -> usize
    = first_equal_generic [T]);

/// The first index of `value` in `out` (0 if absent), a vectorised test per 64 values first.
#[inline(always)]
fn first_equal_generic<T: PartialEq + Copy>(out: &[T], value: T) -> usize {
    for (c, chunk) in out.chunks(64).enumerate() {
        if chunk.iter().fold(false, |found, &x| found | (x == value)) {
            return c * 64 + chunk.iter().position(|&x| x == value).unwrap_or(0);
        }
    }
    0
}

compiled_for!(avx512, fn drop_below_avx512 [T: PartialOrd + Copy]
    (out: &mut [T], keep_from: T, dropped: T) -> () = drop_below_generic [T]);
compiled_for!(avx2, fn drop_below_avx2 [T: PartialOrd + Copy]
    (out: &mut [T], keep_from: T, dropped: T) -> () = drop_below_generic [T]);

/// Every value below `keep_from` becomes `dropped`: selects into a block that is stored whole
/// (a conditional store would become a masked store, slow on some CPUs).
#[inline(always)]
fn drop_below_generic<T: PartialOrd + Copy>(out: &mut [T], keep_from: T, dropped: T) {
    let mut chunks = out.chunks_exact_mut(32);
    for chunk in &mut chunks {
        let mut block = [dropped; 32];
        for (b, &x) in block.iter_mut().zip(chunk.iter()) {
            *b = if x < keep_from { dropped } else { x };
        }
        chunk.copy_from_slice(&block);
    }
    for x in chunks.into_remainder() {
        *x = if *x < keep_from { dropped } else { *x };
    }
}

/// The lowest-id token of `ids` no mask removes, or -1 (a row whose unmasked tokens weigh
/// nothing).
fn first_unmasked(batch: &Batch<'_>, row: &Row<'_>, ids: std::ops::Range<usize>) -> i32 {
    ids.into_iter()
        .find(|&v| {
            batch.dense_word(row.r, row.b, v / 32) >> (v % 32) & 1 == 1
                && !row.sparse_masked(v, batch.end_tokens)
        })
        .map_or(-1, |v| v as i32)
}

/// Which logits min_p keeps in a logits row whose first token in rank order is `best`, of
/// processed value `m` (`w · 2^24 ≥ MINP · w_max`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum MinPFloor {
    /// Every token at or above the value.
    From(f32),
    /// Only `best` (at T = 0 only the first maximum weighs anything).
    OnlyBest,
}

impl MinPFloor {
    /// min_p's floor for row `row` of maximum `m` (not −inf; its weight is that of its
    /// sanitized value, and the floor holds for the processed values as they are).
    fn of(batch: &Batch<'_>, row: &Row<'_>, m: f32) -> Self {
        let m = sanitize_logit(m);
        let t = batch.temperature.map_or(1.0, |t| t[row.r]);
        match row_scale(t) {
            _ if m == f32::INFINITY => MinPFloor::From(m),
            RowScale::Uniform => MinPFloor::From(f32::MIN),
            RowScale::ArgmaxOnly => MinPFloor::OnlyBest,
            scale @ RowScale::Scaled { .. } => {
                MinPFloor::From(lowest_kept(m, scale, u128::from(row.min_p)))
            }
        }
    }

    /// Whether token `v` of processed value `x` stays (`best` is the row's first maximum).
    #[inline]
    fn keeps(&self, v: usize, x: f32, best: usize) -> bool {
        match *self {
            MinPFloor::From(keep_from) => x >= keep_from,
            MinPFloor::OnlyBest => v == best,
        }
    }
}

/// min_p: drops the tokens with `w · 2^24 < MINP · w_max` (`best` is the row's first token in rank
/// order, so its weight is `w_max`).
fn apply_min_p(batch: &Batch<'_>, row: &Row<'_>, out: &mut [f32], best: usize, dropped: f32) {
    let minp = u128::from(row.min_p);
    if !batch.logits {
        let w_max = u128::from(weight(out[best]));
        for p in out.iter_mut() {
            if u128::from(weight(*p)) << 24 < minp * w_max {
                *p = dropped;
            }
        }
        return;
    }
    let m = out[best];
    if m == f32::NEG_INFINITY {
        return;
    }
    match MinPFloor::of(batch, row, m) {
        MinPFloor::OnlyBest => {
            for (v, x) in out.iter_mut().enumerate() {
                if v != best {
                    *x = dropped;
                }
            }
        }
        MinPFloor::From(keep_from) => dispatch!(drop_below_generic::<f32>(out, keep_from, dropped)
            via drop_below_avx512, drop_below_avx2),
    }
}

/// The smallest logit whose weight in a row of sanitized maximum `m` passes
/// `w · 2^24 ≥ MINP · 2^40` (weights never decrease as the logit grows, and `m` itself weighs
/// `2^40`); the unsanitized logits at or above it are those that pass.
fn lowest_kept(m: f32, scale: RowScale, minp: u128) -> f32 {
    let keeps = |l: f32| u128::from(scaled_weight(l, m, scale)) << 24 >= minp << 40;
    // Search the f32 order between −2^64 and m on signed integer keys.
    let key = |x: f32| {
        let bits = x.to_bits();
        if bits >> 31 == 0 {
            i64::from(bits)
        } else {
            -i64::from(bits & 0x7fff_ffff)
        }
    };
    let value = |k: i64| {
        if k >= 0 {
            f32::from_bits(k as u32)
        } else {
            f32::from_bits((-k) as u32 | 0x8000_0000)
        }
    };
    let (mut lo, mut hi) = (key(f32::from_bits(0xdf80_0000)), key(m));
    if keeps(value(lo)) {
        return f32::NEG_INFINITY;
    }
    // Invariant: value(lo) is dropped, value(hi) is kept.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if keeps(value(mid)) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    value(hi)
}

/// Whether the penalties of slot `b` may change a value: a usable repetition factor other than
/// 1 (`.0`), or a frequency or presence penalty other than 0 (`.1`).
fn slot_penalties(batch: &Batch<'_>, b: usize) -> (bool, bool) {
    let p = &batch.penalties[b * PENALTY_FIELDS..(b + 1) * PENALTY_FIELDS];
    let (alpha, inverse) = (p[penalty::REPETITION], p[penalty::REPETITION_INVERSE]);
    let usable = |x: f32| (FACTOR_MIN..=FACTOR_MAX).contains(&x);
    let repetition = usable(alpha) && usable(inverse) && (alpha != 1.0 || inverse != 1.0);
    let additive_on =
        additive(p[penalty::FREQUENCY]) != 0.0 || additive(p[penalty::PRESENCE]) != 0.0;
    (repetition, additive_on)
}

/// Per slot of the table, whether a row of `block` belongs to it and its penalties are not
/// neutral (a neutral slot — no usable repetition factors or both 1, β = γ = 0 — leaves every
/// value as the dense masks left it): the slots whose counted bits the rows read.
fn penalized_slots(batch: &Batch<'_>, block: RowBlock, slots: usize) -> Vec<bool> {
    let mut wanted = vec![false; slots];
    for r in block.first..block.first + block.rows {
        if let Some((b, _)) = batch.source(r) {
            let (repetition, additive_on) = slot_penalties(batch, b);
            wanted[b] = repetition || additive_on;
        }
    }
    wanted
}

/// Per slot of `wanted`, a bit per 32-token word that the repetition, frequency or presence
/// penalty may change: a word with a positive count (`counted`, the table's counted bits), or
/// with a prompt token when the repetition penalty is on. Computed once per call, so that the
/// rows of a slot share it.
fn penalized_words(batch: &Batch<'_>, wanted: &[bool], counted: &[u32]) -> Vec<u64> {
    let words = mask_words(batch.vocab);
    let n = words.div_ceil(64);
    let mut bits = vec![0u64; batch.real_bsz * n];
    bits.par_chunks_mut(n.max(1))
        .enumerate()
        .filter(|(b, _)| wanted[*b])
        .for_each(|(b, bits)| {
            let (repetition, _) = slot_penalties(batch, b);
            let prompt = &batch.prompt_mask[b * words..(b + 1) * words];
            let counted = &counted[b * words..(b + 1) * words];
            for (w, (&prompt, &counted)) in prompt.iter().zip(counted).enumerate() {
                let touched = (repetition && prompt != 0) || counted != 0;
                bits[w / 64] |= u64::from(touched) << (w % 64);
            }
        });
    bits
}

/// Processes the rows of the block: scores row `block.first + i` into output row `i`. The rows
/// hold the ids of `ids`: the whole vocabulary, or one rank's slice (`docs/semantics.md` §4d).
fn process_logits(
    batch: &Batch<'_>,
    (kind, block, ids): (ScoresKind, RowBlock, VocabSlice),
    inputs: &ProcessInputs<'_>,
    out: &mut [f32],
    fallback: &mut [i32],
) -> Result<()> {
    let width = ids.len;
    let whole = width == batch.vocab;
    with_float!(kind.dtype, Op::ProcessLogits, T => {
        let input = slice::<T>(inputs.scores.matrix())?;
        let input = &input[block.first * width..(block.first + block.rows) * width];
        out.par_chunks_exact_mut(width)
            .zip(fallback.par_iter_mut())
            .zip(input.par_chunks_exact(width))
            .enumerate()
            .for_each(|(i, ((out, fallback), input))| {
                let r = block.first + i;
                *fallback = match whole {
                    true => process_row(batch, r, input, out),
                    false => process_slice_row(batch, (r, ids.first), input, out),
                };
            });
        Ok(())
    })
}

/// The host slices of a validated call's buffers, with the per-slot penalized words of the rows
/// of `block` (computed on `device`'s threads).
fn with_batch<R>(
    device: &CpuDevice,
    (inputs, params, kind): (&ProcessInputs<'_>, &ProcessParams<'_>, &ScoresKind),
    then: impl FnOnce(&Batch<'_>) -> Result<R>,
) -> Result<R> {
    let ProcessParams { dims, shape, .. } = *params;
    let batch = Batch {
        host: ProcessSlices::new(inputs, params)?,
        logits: kind.logits,
        penalized: &[],
        counted: &[],
    };
    let tables = device.counted_tables();
    let mut counted = tables.take(inputs.history.token_counts, shape.vocab);
    let wanted = penalized_slots(&batch, params.row_block(), dims.max_bsz);
    let penalized = device.install(|| {
        counted.bring_up_to_date(batch.token_counts, shape.vocab, &wanted);
        penalized_words(&batch, &wanted, counted.words())
    });
    let result = then(&Batch {
        penalized: &penalized,
        counted: counted.words(),
        ..batch
    });
    tables.put(counted);
    result
}

/// Runs a validated `process_logits` call (the front has checked every argument).
pub(crate) fn run(device: &CpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, kind) = call.parts();
    let block = params.row_block();
    with_batch(device, (inputs, params, kind), |batch| {
        let processed = slice_mut::<f32>(out.processed)?;
        let fallback = slice_mut::<i32>(out.fallback)?;
        let call = (*kind, block, params.ids());
        device.install(|| process_logits(batch, call, inputs, processed, fallback))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::logits::logit_key_select;
    use specula_backend_api::logit_weights::logit_rank_key;

    #[test]
    fn the_select_forms_equal_the_rules() {
        let specials = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-30,
            -1e-23,
            1e-22,
            3e38,
            -3e38,
            1.8446744e19,
            1.8446746e19,
            -1.8446746e19,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            2.0f32.powi(-76),
            -(2.0f32.powi(-76)),
            2.0f32.powi(-77),
        ];
        let mut state = 0x1234_5678u32;
        let random = (0..100_000).map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            f32::from_bits(state)
        });
        let values: Vec<f32> = specials.into_iter().chain(random).collect();
        for &l in &values {
            assert_eq!(logit_key_select(l), logit_rank_key(l), "{l:e}");
            let kept = unprocessed(l);
            assert_eq!(key_select(kept), logit_rank_key(l), "{l:e}");
            assert_eq!(
                kept.to_bits(),
                if l.is_nan() { f32::NEG_INFINITY } else { l }.to_bits()
            );
            // No step: the logit itself; a step that changes nothing: the logit itself too.
            assert_eq!(
                stepped(l, sanitize_logit(l)).to_bits(),
                kept.to_bits(),
                "{l:e}"
            );
        }
        for word in values.chunks_exact(32) {
            let src: [u32; 32] = std::array::from_fn(|j| word[j].to_bits());
            let mut dst = [0u32; 32];
            let best = plain_f32_word(&src, &mut dst, u32::MAX);
            for j in 0..32 {
                assert_eq!(dst[j], unprocessed(word[j]).to_bits(), "{:e}", word[j]);
            }
            let keys = word.iter().map(|&l| logit_rank_key(l));
            assert_eq!(best, keys.max().unwrap_or(0));
        }
    }
}

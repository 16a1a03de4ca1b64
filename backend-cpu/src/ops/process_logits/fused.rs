//! The fused form of `process_logits` then `top_k_top_p_sample` (`docs/semantics.md` §5.12):
//! each row is sampled as `process_logits` would make it, without writing the processed rows.
//!
//! A logits row under a top-k the streaming pass handles takes one pass: each 64-token chunk
//! is processed on the fly (the dense rules of [`dense_word_values`], then the sparse tokens
//! patched from their input values) and offered to the streaming top-k ([`TopRanked`]); a chunk
//! that neither a penalty nor a sparse rule touches is first tested on its raw logits against
//! the top-k floor, since such a token keeps its logit and the masks only lower it; once
//! the pass has a floor and no penalty of the row raises a value, a passing chunk offers only its
//! candidates (raw logit not below the floor's bound) and its sparse tokens. The
//! row maximum is the first of the top k, so min_p becomes a floor on their values (the
//! threshold `process_logits` computes) instead of a drop pass. Every other row (probabilities,
//! no top-k, a top-k beyond the streaming pass) is processed into a per-thread scratch row and
//! sampled by the plain sampling op's row function: the composition itself.

use std::cell::RefCell;

use rayon::prelude::*;
use specula_backend_api::logit_weights::sanitize_logit;
use specula_backend_api::ops::{ProcessedSampleCall, ScoresKind};
use specula_backend_api::rng::{Purpose, draw};

use super::{
    Batch, MinPFloor, Row, dense_word_values, first_unmasked, key_select, process_row, with_batch,
};
use crate::CpuDevice;
use crate::ops::top_k_top_p_sample::sample_prob_row;
use crate::ops::{weighs_nothing, with_float};
use crate::sampling::logits::{
    self, CHUNK, TopRanked, Weighing, draw_among_ranked, streams_top_k, value_of_key,
};
use crate::sampling::scan::{compiled_for, dispatch};
#[cfg(target_arch = "x86_64")]
use crate::sampling::scan::{has_avx2, has_avx512};
use specula_backend_api::host::{slice, slice_mut};
use specula_backend_api::{FloatElement, Op, Result};

/// The chunks whose dense mask words share a 64-byte line (16 words of 32 tokens).
const PREFETCH_EVERY: usize = 64 * 8 / CHUNK;
/// How many chunks ahead the mask words are asked for (two lines ahead).
const PREFETCH_AHEAD: usize = 2 * PREFETCH_EVERY;

/// Per-thread scratch: a processed row (rows sampled by composition) and the top-k buffer.
type Scratch = (Vec<f32>, Vec<(u32, u32)>);

thread_local! {
    /// The thread's [`Scratch`], reused from row to row.
    static SCRATCH: RefCell<Scratch> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// A row's sampling inputs: `top_k`, `top_p` and the seed.
type RowSampling = (i32, f32, u64);

/// Runs a validated fused `top_k_top_p_sample` of processed rows on the CPU.
pub(crate) fn run_processed_sample(
    device: &CpuDevice,
    mut call: ProcessedSampleCall<'_>,
) -> Result<()> {
    let ((sample, process), tokens, (sample_params, process_params), facts) = call.parts();
    let kind = &facts.scores;
    let top_k = slice::<i32>(sample.top_k)?;
    let top_p = slice::<f32>(sample.top_p)?;
    let seed = slice::<u64>(sample.seed)?;
    let tokens = slice_mut::<i32>(tokens)?;
    let vocab = sample_params.shape.vocab;
    let ScoresKind { dtype, .. } = *kind;
    with_batch(device, (process, process_params, kind), |batch| {
        with_float!(dtype, Op::TopKTopPSample, T => {
            let input = slice::<T>(sample.scores.matrix())?;
            device.install(|| {
                tokens
                    .par_iter_mut()
                    .zip(input.par_chunks_exact(vocab))
                    .enumerate()
                    .for_each(|(r, (token, row))| {
                        *token = sample_processed_row(batch, r, row, (top_k[r], top_p[r], seed[r]));
                    });
            });
            Ok(())
        })
    })
}

/// The token row `r` yields: sampled from its processed values, or its fallback when they
/// weigh nothing.
fn sample_processed_row<T: FloatElement>(
    batch: &Batch<'_>,
    r: usize,
    input: &[T],
    sampling: RowSampling,
) -> i32 {
    let k = usize::try_from(sampling.0).unwrap_or(0);
    if batch.logits && streams_top_k(k, input.len()) {
        return match batch.source(r) {
            Some((b, pos)) => streamed_top_k(batch, &batch.row(r, b, pos), input, k, sampling),
            None => -1,
        };
    }
    composed_row(batch, r, input, sampling)
}

/// `process_logits` of the row into the thread's scratch row, then the sampling op's row
/// function and its fallback rule.
fn composed_row<T: FloatElement>(
    batch: &Batch<'_>,
    r: usize,
    input: &[T],
    (top_k, top_p, seed): RowSampling,
) -> i32 {
    let mut processed = SCRATCH.with(|cell| std::mem::take(&mut cell.borrow_mut().0));
    processed.resize(input.len(), 0.0);
    let fallback = process_row(batch, r, input, &mut processed);
    let token = match batch.temperature {
        Some(t) if batch.logits => {
            logits::sample_logit_row(&processed, t[r], top_k, top_p, draw(seed, Purpose::Sample))
        }
        _ => sample_prob_row(&processed, top_k, top_p, seed, 1),
    };
    let value = processed[token];
    SCRATCH.with(|cell| cell.borrow_mut().0 = processed);
    if weighs_nothing(value, batch.logits) {
        fallback
    } else {
        token as i32
    }
}

/// Top-k (the streaming pass), min_p, top-p and the draw of a logits row, processing each chunk
/// as the top-k pass reads it.
fn streamed_top_k<T: FloatElement>(
    batch: &Batch<'_>,
    row: &Row<'_>,
    input: &[T],
    k: usize,
    (_, top_p, seed): RowSampling,
) -> i32 {
    let buffer = SCRATCH.with(|cell| std::mem::take(&mut cell.borrow_mut().1));
    let best = processed_top_ranked(batch, row, input, TopRanked::new(k, buffer));
    let token = best
        .first()
        .and_then(|&(key, id)| draw_processed(batch, row, &best, (key, id), (top_p, seed)));
    SCRATCH.with(|cell| cell.borrow_mut().1 = best);
    token.map_or_else(|| first_unmasked(batch, row, 0..input.len()), |t| t as i32)
}

/// The sample among the row's processed top k `best` (first `(key, id)`), with min_p's floor;
/// `None` when the row weighs nothing.
fn draw_processed(
    batch: &Batch<'_>,
    row: &Row<'_>,
    best: &[(u32, u32)],
    (key, id): (u32, u32),
    (top_p, seed): (f32, u64),
) -> Option<usize> {
    let m = value_of_key(key);
    if m == f32::NEG_INFINITY {
        return None;
    }
    let t = batch.temperature.map_or(1.0, |t| t[row.r]);
    let weighing = Weighing::with_max(sanitize_logit(m), t, || id as usize);
    let floor = (row.min_p > 0).then(|| MinPFloor::of(batch, row, m));
    let logit = |key: u32, v: u32| {
        let x = value_of_key(key);
        match floor {
            Some(floor) if !floor.keeps(v as usize, x, id as usize) => f32::NEG_INFINITY,
            _ => x,
        }
    };
    draw_among_ranked(&weighing, best, top_p, draw(seed, Purpose::Sample), logit)
}

/// The streaming top-k pass over the processed values of the row, made a chunk at a time. Runs
/// the loop compiled for the widest vector unit of the CPU.
fn processed_top_ranked<T: FloatElement>(
    batch: &Batch<'_>,
    row: &Row<'_>,
    input: &[T],
    ranked: TopRanked,
) -> Vec<(u32, u32)> {
    dispatch!(processed_top_ranked_generic::<T>(batch, row, input, ranked)
        via processed_top_ranked_avx512, processed_top_ranked_avx2)
}

compiled_for!(avx512, fn processed_top_ranked_avx512 [T: FloatElement]
    (batch: &Batch<'_>, row: &Row<'_>, input: &[T], ranked: TopRanked) -> Vec<(u32, u32)>
    = processed_top_ranked_generic [T]);
compiled_for!(avx2, fn processed_top_ranked_avx2 [T: FloatElement]
    (batch: &Batch<'_>, row: &Row<'_>, input: &[T], ranked: TopRanked) -> Vec<(u32, u32)>
    = processed_top_ranked_generic [T]);

/// [`processed_top_ranked`] as written.
#[inline(always)]
fn processed_top_ranked_generic<T: FloatElement>(
    batch: &Batch<'_>,
    row: &Row<'_>,
    input: &[T],
    mut ranked: TopRanked,
) -> Vec<(u32, u32)> {
    let patches = patches(batch, row, input);
    let never_raises = row.never_raises();
    let mut next = 0;
    let mut values = [0f32; 32];
    // The dense rules never raise a token above its input then (a step that changes a value
    // lowers it below its sanitized reading, which the input is not below; masks lower to −inf):
    // a span whose raw logits all stay below the floor, with no sparse token and no penalty that
    // raises, offers nothing.
    let offers = |ranked: &TopRanked, next: usize, (first, span): (usize, &[T])| {
        let end = first + span.len();
        patches.get(next).is_some_and(|&(v, _)| v < end)
            || (!never_raises && (first / 32..end.div_ceil(32)).any(|w| row.penalizes_word(w)))
            || !ranked.skips(span)
    };
    for (c, chunk) in input.chunks(CHUNK).enumerate() {
        if c % PREFETCH_EVERY == 0 {
            let ahead = (c + PREFETCH_AHEAD) * CHUNK / 32;
            batch.prefetch_dense_words(row.r, row.b, ahead);
        }
        if !offers(&ranked, next, (c * CHUNK, chunk)) {
            continue;
        }
        if never_raises && ranked.has_floor() {
            next = offer_candidates(
                batch,
                row,
                (c * CHUNK, chunk),
                (&patches, next),
                &mut ranked,
            );
            continue;
        }
        // A chunk that may offer a token is processed a word at a time: most of its words do
        // not, and skipping them skips their mask words and counts.
        for (i, src) in chunk.chunks(32).enumerate() {
            let first = c * CHUNK + i * 32;
            if !offers(&ranked, next, (first, src)) {
                continue;
            }
            let values = &mut values[..src.len()];
            dense_word_values(batch, row, first / 32, src, values, f32::NEG_INFINITY);
            while let Some(&(v, x)) = patches.get(next).filter(|(v, _)| *v < first + src.len()) {
                values[v - first] = x;
                next += 1;
            }
            let mut keys = [0u32; 32];
            for (key, &x) in keys.iter_mut().zip(values.iter()) {
                *key = key_select(x);
            }
            // The processed values are never NaN: their keys are plain keys of their floats.
            ranked.push_keys(first, &keys[..values.len()]);
        }
    }
    ranked.finish()
}

/// Offers the tokens of a chunk (ids from `first`) that may enter, when no rule raises a value
/// outside the sparse tokens: the sparse tokens of the chunk (`patches` from `next`) at their
/// patched values, and each other token whose raw logit is not below the floor's bound at its
/// dense value; every other token's processed value is at most its input, below the floor.
/// Returns the next patch.
#[inline(always)]
fn offer_candidates<T: FloatElement>(
    batch: &Batch<'_>,
    row: &Row<'_>,
    (first, chunk): (usize, &[T]),
    (patches, mut next): (&[(usize, f32)], usize),
    ranked: &mut TopRanked,
) -> usize {
    let mut candidates = ranked.candidates(chunk);
    while let Some(&(v, x)) = patches.get(next).filter(|(v, _)| *v < first + chunk.len()) {
        candidates &= !(1u64 << (v - first));
        ranked.offer(v, key_select(x));
        next += 1;
    }
    while candidates != 0 {
        let j = candidates.trailing_zeros() as usize;
        let x = row.dense_logit(batch, first + j, chunk[j].to_f32());
        ranked.offer(first + j, key_select(x));
        candidates &= candidates - 1;
    }
    ranked.settle();
    next
}

/// The tokens a sparse rule touches and their processed values, in id order.
fn patches<T: FloatElement>(batch: &Batch<'_>, row: &Row<'_>, input: &[T]) -> Vec<(usize, f32)> {
    let mut patches: Vec<(usize, f32)> = row
        .touched(batch)
        .into_iter()
        .map(|v| {
            let x = input[v].to_f32();
            (v, row.patched_value(batch, v, x, f32::NEG_INFINITY))
        })
        .collect();
    patches.sort_unstable_by_key(|p| p.0);
    patches.dedup_by_key(|p| p.0);
    patches
}

//! Sampling a logits row that top-k leaves whole (`top_k` 0 or ≥ V), at a cost that does not
//! depend on the shape of the row: every decision is made on tight float bounds of the weights
//! ([`lanes`]), and exact weights are computed only where the bounds leave it open — the tokens
//! of the top-p threshold's bin and the chunk the draw lands in.
//!
//! - **top_p = 1**: one pass estimates the weight of every chunk of [`CHUNK`] tokens; the total
//!   `W` and the cumulative mass before each chunk are then known within [`Bounds`]. The chunk
//!   the draw `t = ⌊R · W / 2^64⌋` falls in is weighed exactly, and the token is decided when the
//!   bounds put `t` on the same side of every partial sum of that chunk as the exact values would.
//! - **top_p < 1**: one pass estimates (and keeps, in f32) every token's weight and the total. A
//!   strided sample of those estimates places a **band** of logits around the top-p threshold
//!   (the logit where the mass from the top reaches `top_p` of `W`); a second pass over the kept
//!   estimates sums the mass above the band per chunk and lists the band's tokens. A histogram of
//!   the band's rank keys, weighted by their estimates, finds the bins where the threshold can
//!   lie; only those tokens are weighed exactly and put in rank order, which gives the exact
//!   threshold (key, id) and the kept mass within bounds. The draw then walks the kept mass of each
//!   chunk in id order and weighs the chunk it lands in exactly, as for top_p = 1.
//!
//! Every answer is exact: a decision is taken only when it holds at both ends of its bounds. When
//! one does not (rarely: the bound on the total is about `2^-22` of it), or the band missed the
//! threshold, `sample` returns `None` and the caller decides on exact weights.

use rayon::prelude::*;
use specula_backend_api::FloatElement;
use specula_backend_api::abi::TOP_P_BITS;
use specula_backend_api::fixed_point::top_p_fixed;
use specula_backend_api::logit_weights::{row_scale, sanitize_logit};

use super::key_select;

mod fused;
use super::lanes::{
    self, ESTIMATE_ABSOLUTE, ESTIMATE_RELATIVE, RowLanes, STORED_RELATIVE, estimate_block_sums,
    estimate_store, estimate_store_levels, exact_weights, max_and_clean,
};

/// Tokens per chunk of the passes: the unit of the per-chunk masses and of the draw's exact walk.
const CHUNK: usize = lanes::SUM_BLOCK;
#[cfg(target_arch = "x86_64")]
use crate::sampling::scan::{has_avx2, has_avx512, has_avx512_vbmi2};

/// Rows shorter than this take the exact path (it is cheap there).
const MIN_VOCAB: usize = 4096;
// The band's placement (estimates sampled in runs, its slack) and its histogram's bins are the
// probability band path's.
use crate::sampling::band::{BAND_BINS, SAMPLE_RUN, SAMPLES, SLACK, band_bins};
/// Standard deviations of the sample's estimate that place the band's ends: three, not the
/// probability path's four ([`crate::sampling::band::SIGMAS`]). The band's tokens cost about
/// 5 ns each to list, count and add to the draw's masses, a band that misses about 50 µs (a
/// second classify pass): at three the bands hold 10–25 % fewer tokens on the wide rows and
/// miss on at most 2 of 1000 rows of the bench shapes at top-p 0.5, 0.9 and 0.99
/// (`tests::band_widths`); a cold batch costs 3–7 % less.
const BAND_SIGMAS: f64 = 3.0;
/// A margin on every float comparison of the bounds, relative: covers the f64 roundings of the
/// sums and products the comparisons themselves make.
const MARGIN: f64 = 1.0 / (1u64 << 44) as f64;

/// Per-stage timing of the top_p < 1 path for the ignored batch probe (`tests::batch_costs`):
/// [`staged`] runs its closure, and in test builds with the probe's switch on it adds the
/// closure's wall time to the stage's counter on this thread. Shipped code only runs the closure.
mod stage {
    /// The maximum pass.
    pub(super) const MAX: usize = 0;
    /// The strided sample.
    pub(super) const SAMPLE: usize = 1;
    /// The store pass (estimates, and the levels).
    pub(super) const STORE: usize = 2;
    /// The band's placement.
    pub(super) const PLACE: usize = 3;
    /// The classify pass, its listing included.
    pub(super) const CLASSIFY: usize = 4;
    /// The listing of the band tokens (inside the classify pass).
    pub(super) const LIST: usize = 5;
    /// The histogram count of the band tokens (inside the listing).
    pub(super) const COUNT: usize = 6;
    /// The threshold in the band.
    pub(super) const THRESHOLD: usize = 7;
    /// The draw's kept masses (the band tokens added to their chunks).
    pub(super) const KEPT: usize = 8;
    /// The draw's walk (`draw_by_chunks`).
    pub(super) const WALK: usize = 9;
    /// How many stages.
    #[cfg(test)]
    pub(super) const COUNT_OF: usize = 10;

    #[cfg(test)]
    thread_local! {
        /// Nanoseconds per stage on this thread since its last flush.
        pub(super) static NS: std::cell::Cell<[u64; COUNT_OF]> =
            const { std::cell::Cell::new([0; COUNT_OF]) };
    }

    /// Whether the stages are timed (tests only).
    #[cfg(test)]
    pub(super) static ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// Runs `f`, timed into stage `k` when the probe asks (tests only).
    #[cfg(test)]
    #[inline(always)]
    pub(super) fn staged<R>(k: usize, f: impl FnOnce() -> R) -> R {
        if !ON.load(std::sync::atomic::Ordering::Relaxed) {
            return f();
        }
        let start = std::time::Instant::now();
        let r = f();
        let ns = start.elapsed().as_nanos() as u64;
        NS.with(|c| {
            let mut v = c.get();
            v[k] += ns;
            c.set(v);
        });
        r
    }

    /// Runs `f` (shipped code: no timing).
    #[cfg(not(test))]
    #[inline(always)]
    pub(super) fn staged<R>(_: usize, f: impl FnOnce() -> R) -> R {
        f()
    }
}
use stage::staged;

/// Per-thread buffers, reused from row to row.
#[derive(Default)]
struct Scratch {
    /// The row as f32 (rows of other dtypes).
    widened: Vec<f32>,
    /// Per-token estimates (top_p < 1).
    estimates: Vec<f32>,
    /// Per-chunk masses.
    masses: Vec<f64>,
    /// The band's tokens: rank key, id, estimate.
    band: Vec<BandToken>,
    /// The band's histogram of rank keys.
    histogram: Histogram,
    /// The tokens of the threshold's bins, with exact weights.
    region: Vec<(u32, u32, u64)>,
    /// Sample bins (placement of the band).
    sample: Vec<(f64, f64)>,
    /// The sampled tokens' estimates.
    sampled: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// A token of the band.
#[derive(Clone, Copy, Debug)]
struct BandToken {
    key: u32,
    id: u32,
    estimate: f32,
}

/// The band's histogram of rank keys weighted by the estimates, filled as its tokens are found:
/// at most [`BAND_BINS`] bins over the keys of the band's logits.
#[derive(Clone, Debug, Default)]
struct Histogram {
    /// The key of the band's lowest logit.
    low: u32,
    /// Keys per bin, as a shift.
    shift: u32,
    /// Per bin: the estimates' sum and the token count.
    bins: Vec<(f64, u32)>,
}

impl Histogram {
    /// Empties the histogram and spans it over the keys of `band` up to the key of `top`, a
    /// bound on every band token's logit: a band open at the top (`high` +inf, or far above the
    /// row) keeps its bins on its tokens, instead of a few of them holding all (whose tokens the
    /// threshold then weighs exactly and sorts).
    fn span(&mut self, band: Band, top: f32) {
        let (low, high) = (
            key_select(band.low),
            key_select(band.high).min(key_select(top)),
        );
        let range = high.saturating_sub(low);
        self.low = low;
        self.shift = (32 - range.leading_zeros()).saturating_sub(BAND_BINS.trailing_zeros());
        self.bins.clear();
        self.bins
            .resize((range >> self.shift) as usize + 1, (0.0, 0));
    }

    /// The bin of a key of the band.
    #[inline(always)]
    fn bin(&self, key: u32) -> usize {
        (key.saturating_sub(self.low) >> self.shift) as usize
    }

    /// The least key of bin `b`, saturated (no finite logit's key is `u32::MAX`).
    fn keys(&self, b: usize) -> u32 {
        (u64::from(self.low) + ((b as u64) << self.shift)).min(u64::from(u32::MAX)) as u32
    }

    /// Counts a band token.
    #[inline(always)]
    fn add(&mut self, key: u32, estimate: f32) {
        let b = self.bin(key).min(self.bins.len() - 1);
        let bin = &mut self.bins[b];
        bin.0 += f64::from(estimate);
        bin.1 += 1;
    }

    /// Adds the counts of `other` (spanned over the same band).
    fn merge(&mut self, other: &Histogram) {
        for (bin, o) in self.bins.iter_mut().zip(&other.bins) {
            bin.0 += o.0;
            bin.1 += o.1;
        }
    }
}

/// A float value known within an error: the exact value lies in `[value − error, value + error]`.
#[derive(Clone, Copy, Debug, Default)]
struct Bounds {
    value: f64,
    error: f64,
}

impl Bounds {
    /// A sum of `tokens` weights totalling `value`, each as accurate as `accuracy` says.
    fn estimated(value: f64, tokens: usize, accuracy: Accuracy) -> Self {
        Bounds {
            value,
            error: value * (accuracy.relative + MARGIN) + tokens as f64 * accuracy.absolute,
        }
    }

    /// An exact integer (its f64 rounding covered by the margin).
    fn exact(value: u64) -> Self {
        let value = value as f64;
        Bounds {
            value,
            error: value * MARGIN,
        }
    }

    fn low(&self) -> f64 {
        self.value - self.error
    }

    fn high(&self) -> f64 {
        self.value + self.error
    }

    fn plus(self, other: Bounds) -> Bounds {
        Bounds {
            value: self.value + other.value,
            error: self.error + other.error,
        }
    }
}

/// How far a weight of a sum may be from the exact one: `relative` of it plus `absolute`.
#[derive(Clone, Copy, Debug)]
struct Accuracy {
    relative: f64,
    absolute: f64,
}

/// The f32 estimates ([`estimate_block_sums`], [`estimate_store`]).
const ESTIMATED: Accuracy = Accuracy {
    relative: ESTIMATE_RELATIVE,
    absolute: ESTIMATE_ABSOLUTE,
};
/// Sums of the stored f32 estimates ([`estimate_store`], added in f64): the top_p < 1 path's.
const STORED: Accuracy = Accuracy {
    relative: STORED_RELATIVE,
    absolute: ESTIMATE_ABSOLUTE,
};
/// Exact weights (sums of at most a chunk of them are exact in f64).
const EXACT: Accuracy = Accuracy {
    relative: 0.0,
    absolute: 0.0,
};

/// How the passes over a row may run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RowHints<'a> {
    /// Threads a pass over the row may be split across (rows fewer than threads).
    pub parts: usize,
    /// The bytes of the row this thread will likely sample next: asked for (into L2) while this
    /// row's chunk weights are estimated (top_p = 1), so that its first pass does not wait on
    /// memory. The top_p < 1 passes do not ask for it: they keep every token's estimate, and the
    /// row and its estimates alone (1.2 MB at V = 151936) overflow a core's 1 MB L2, which the
    /// second pass reads them from; asked for there, or its maximum folded into the second pass,
    /// the next row cost more than it saved (`docs/performance.md`, "Top-p from logits at batch
    /// 64" and "Issue 28, stop 45").
    pub next: &'a [u8],
}

/// The token drawn by `r` from a logits row at temperature `t` under `top_p` (no top-k), or
/// `None` when the caller must decide on exact weights (special rows, short rows).
pub(super) fn sample<T: FloatElement>(
    row: &[T],
    t: f32,
    top_p: f32,
    r: u64,
    hints: RowHints<'_>,
) -> Option<usize> {
    if row.len() < MIN_VOCAB {
        return None;
    }
    // Moved out for the duration: a nested parallel section running another row on this thread
    // finds fresh buffers instead of a borrowed cell.
    let mut scratch = SCRATCH.with(|cell| cell.take());
    let mut widened = std::mem::take(&mut scratch.widened);
    let values = as_f32(row, &mut widened);
    let token = sample_f32(values, t, top_p, r, hints, &mut scratch);
    scratch.widened = widened;
    SCRATCH.with(|cell| *cell.borrow_mut() = scratch);
    token
}

/// `row` as f32: itself, or widened into `buffer`.
fn as_f32<'a, T: FloatElement>(row: &'a [T], buffer: &'a mut Vec<f32>) -> &'a [f32] {
    if let Ok(values) = bytemuck::try_cast_slice::<T, f32>(row)
        && T::DTYPE == specula_backend_api::DType::F32
    {
        return values;
    }
    buffer.clear();
    buffer.extend(row.iter().map(|v| v.to_f32()));
    buffer
}

fn sample_f32(
    values: &[f32],
    t: f32,
    top_p: f32,
    r: u64,
    hints: RowHints<'_>,
    s: &mut Scratch,
) -> Option<usize> {
    let segments = Segments::of(values.len(), hints.parts);
    let p = top_p_fixed(top_p);
    if p >= 1 << TOP_P_BITS && segments.count == 2 {
        // One parallel section for the maximum and the estimates (see `fused`).
        let lanes = fused::max_then_chunks(values, t, segments, hints.next, &mut s.masses)?;
        let passes = Passes {
            values,
            lanes,
            top: f32::INFINITY,
            segments,
            next: hints.next,
        };
        return sample_whole(&passes, r, s, false);
    }
    let (raw_max, clean) = staged(stage::MAX, || segments.max_and_clean(values));
    let lanes = RowLanes::new(sanitize_logit(raw_max), row_scale(t), clean)?;
    let passes = Passes {
        values,
        lanes,
        top: raw_max,
        segments,
        next: hints.next,
    };
    if p >= 1 << TOP_P_BITS {
        sample_whole(&passes, r, s, true)
    } else {
        sample_top_p(&passes, p, r, s)
    }
}

/// A row's full passes: its values, its constants, how it is split across threads and the next
/// row to ask for.
struct Passes<'a> {
    values: &'a [f32],
    lanes: RowLanes,
    /// The row's largest value, NaN ignored (`max_and_clean`'s; +inf where unknown): no band
    /// token lies above it, so that a band open at the top spans its histogram up to it.
    top: f32,
    segments: Segments,
    next: &'a [u8],
}

impl<'a> Passes<'a> {
    /// The passes of `values` with no next row to ask for.
    #[cfg(test)]
    fn unhinted(values: &'a [f32], lanes: RowLanes, segments: Segments) -> Self {
        Passes {
            values,
            lanes,
            top: max_and_clean(values).0,
            segments,
            next: &[],
        }
    }

    /// The estimated weight of every chunk into `masses` ([`estimate_block_sums`]).
    fn estimate_chunks(&self, masses: &mut Vec<f64>) {
        masses.resize(self.values.len().div_ceil(CHUNK), 0.0);
        let lanes = &self.lanes;
        self.segments
            .for_each_chunked(self.values, masses, self.next, |part, out| {
                estimate_block_sums(part, lanes, out);
            });
    }

    /// The estimate of every token into `estimates`, a rough total and the rough masses at
    /// `levels` ([`estimate_store_levels`]).
    fn estimate_tokens<const L: usize>(
        &self,
        estimates: &mut Vec<f32>,
        levels: &[f32; L],
    ) -> (f64, [f64; L]) {
        estimates.resize(self.values.len(), 0.0);
        let lanes = &self.lanes;
        let steps = self
            .segments
            .map_tokens(self.values, estimates, |part, out| {
                estimate_store_levels(part, lanes, out, levels)
            });
        let mut sums = (0.0, [0.0; L]);
        for (total, above) in steps {
            sums.0 += total;
            for (sum, a) in sums.1.iter_mut().zip(above) {
                *sum += a;
            }
        }
        sums
    }
}

/// How a row is cut into segments of whole chunks, one per thread.
#[derive(Clone, Copy, Debug)]
struct Segments {
    /// Tokens per segment (a multiple of [`CHUNK`]), the last one shorter.
    len: usize,
    /// Number of segments.
    count: usize,
}

/// Rows shorter than this are never split across threads.
const SPLIT_MIN: usize = 32 * 1024;
/// Tokens per step of the passes that go step by step: the chunk pass asks for the next row's
/// share before each step, the store pass restarts its f32 level sums at each.
const PREFETCH_STEP: usize = 16 * CHUNK;

impl Segments {
    fn of(len: usize, parts: usize) -> Self {
        let parts = if len >= SPLIT_MIN { parts.max(1) } else { 1 };
        let seg = len.div_ceil(parts).div_ceil(CHUNK) * CHUNK;
        Segments {
            len: seg.max(CHUNK),
            count: len.div_ceil(seg.max(CHUNK)).max(1),
        }
    }

    /// The row's raw maximum and whether it is clean ([`max_and_clean`]), segment by segment.
    fn max_and_clean(&self, values: &[f32]) -> (f32, bool) {
        self.reduce(values, |part, _| max_and_clean(part), combine_max)
    }

    /// `f` of each segment (with its first token), combined by `join`.
    fn reduce<R: Send>(
        &self,
        values: &[f32],
        f: impl Fn(&[f32], usize) -> R + Sync,
        join: impl Fn(R, R) -> R + Sync,
    ) -> R {
        if self.count == 1 {
            return f(values, 0);
        }
        values
            .par_chunks(self.len)
            .enumerate()
            .map(|(i, part)| f(part, i * self.len))
            .reduce_with(&join)
            .unwrap_or_else(|| f(&[], 0))
    }

    /// `f` of each segment and its chunks' slots of `out`, asking for the matching part of
    /// `next` as it goes.
    fn for_each_chunked<O: Send>(
        &self,
        values: &[f32],
        out: &mut [O],
        next: &[u8],
        f: impl Fn(&[f32], &mut [O]) + Sync,
    ) {
        let chunks = self.len / CHUNK;
        let run = |part: &[f32], out: &mut [O], next: &[u8]| chunked_steps(part, out, next, &f);
        if self.count == 1 {
            return run(values, out, next);
        }
        let next_len = next.len().div_ceil(self.count);
        values
            .par_chunks(self.len)
            .zip(out.par_chunks_mut(chunks))
            .enumerate()
            .for_each(|(i, (part, out))| {
                let start = (i * next_len).min(next.len());
                run(part, out, &next[start..(start + next_len).min(next.len())]);
            });
    }

    /// `f` of each segment's steps of [`PREFETCH_STEP`] tokens and their slots of `out` (the
    /// next row is not asked for: see [`RowHints::next`]); the results of the steps, each
    /// segment's last step first. The steps run from a segment's end to its start, so that the
    /// pass after this one ([`classify`], from the start) finds the lines it reads first the
    /// ones this pass touched last, still in L2: a row and its estimates (1.2 MB at V = 151936)
    /// do not fit a 1 MB L2, and in the same order each line it read was the one just evicted
    /// (a cold batch 0–4 % less, `docs/performance.md`, "Issue 28, stop 45").
    fn map_tokens<O: Send, R: Send>(
        &self,
        values: &[f32],
        out: &mut [O],
        f: impl Fn(&[f32], &mut [O]) -> R + Sync,
    ) -> Vec<R> {
        let run = |part: &[f32], out: &mut [O]| -> Vec<R> {
            part.chunks(PREFETCH_STEP)
                .zip(out.chunks_mut(PREFETCH_STEP))
                .rev()
                .map(|(step, out)| f(step, out))
                .collect()
        };
        if self.count == 1 {
            return run(values, out);
        }
        values
            .par_chunks(self.len)
            .zip(out.par_chunks_mut(self.len))
            .flat_map_iter(|(part, out)| run(part, out))
            .collect()
    }
}

/// The maxima and cleanliness of two consecutive parts of a row, combined (in this order).
fn combine_max((m1, c1): (f32, bool), (m2, c2): (f32, bool)) -> (f32, bool) {
    (if m2 > m1 { m2 } else { m1 }, c1 && c2)
}

/// `f` of a segment's steps of [`PREFETCH_STEP`] tokens and their chunks' slots of `out`, asking
/// for the matching share of `next` (this segment's part of the next row) before each step.
fn chunked_steps<O>(part: &[f32], out: &mut [O], next: &[u8], f: &impl Fn(&[f32], &mut [O])) {
    for (i, (step, out)) in part
        .chunks(PREFETCH_STEP)
        .zip(out.chunks_mut(PREFETCH_STEP / CHUNK))
        .enumerate()
    {
        prefetch_share(next, i * PREFETCH_STEP, step.len(), part.len());
        f(step, out);
    }
}

/// Asks for the share of `next` that matches tokens `start .. start + len` of a pass over `total`
/// tokens (a hint into L2: it never faults, and does nothing off x86_64).
#[inline]
fn prefetch_share(next: &[u8], start: usize, len: usize, total: usize) {
    if next.is_empty() || total == 0 {
        return;
    }
    let from = next.len() * start / total;
    let to = (next.len() * (start + len) / total).min(next.len());
    #[cfg(target_arch = "x86_64")]
    for line in (from..to).step_by(64) {
        // SAFETY: a prefetch is a hint; the address is inside `next`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                next.as_ptr().add(line).cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (from, to);
}

/// A decision `a · S ≥ b · F` (or `>`) between two disjoint masses `S` and `F` known within
/// bounds: an estimate's error enters only through the mass it is part of. (Comparing a prefix
/// with a share of the total instead counts the prefix's error twice: for top-p 0.9 this form
/// is about ten times tighter.)
#[derive(Clone, Copy, Debug)]
struct Split {
    /// The factor of the first mass.
    a: f64,
    /// The factor of the second mass.
    b: f64,
}

impl Split {
    /// The top-p test `C · 2^24 ≥ P · W` as `C · (2^24 − P) ≥ P · N`, with `N = W − C` the mass
    /// not kept.
    fn top_p(p: u64) -> Self {
        Split {
            a: ((1u64 << TOP_P_BITS) - p) as f64,
            b: p as f64,
        }
    }

    /// The draw `r`: the token is the first whose cumulative kept mass `S` exceeds
    /// `r · C / 2^64` (for an integer `S`, `⌊r · C / 2^64⌋ < S` ⟺ `r · C / 2^64 < S`), that is
    /// `S · (1 − u) > u · F` with `u = r / 2^64` and `F = C − S` the kept mass after it.
    fn draw(r: u64) -> Self {
        let u = r as f64 / 18_446_744_073_709_551_616.0;
        Split { a: 1.0 - u, b: u }
    }

    /// Whether `a · S ≥ b · F` certainly holds (and `a · S > b · F` too, up to the margin).
    fn certainly(&self, first: Bounds, second: Bounds) -> bool {
        self.a * first.low() > self.b * second.high() * (1.0 + MARGIN)
    }

    /// Whether `a · S ≥ b · F` certainly fails.
    fn certainly_not(&self, first: Bounds, second: Bounds) -> bool {
        self.a * first.high() * (1.0 + MARGIN) < self.b * second.low()
    }

    /// A first mass below which the test certainly fails, for a split `S + F` of a whole whose
    /// bounds are `whole`: with `E` its error (at least the errors of `S` and `F` together, and
    /// more than `MARGIN` of it), `S < b' · T − 2E` (`b' = b / (a + b)`, `T` the whole) gives
    /// `a · (S + E)(1 + MARGIN) < b · (T − S − E)`.
    fn skips(&self, whole: Bounds) -> f64 {
        self.b / (self.a + self.b) * whole.value - 2.0 * whole.error
    }
}

/// top_p = 1: every token of positive weight is kept; the draw's chunk is weighed exactly.
/// `estimate` false: `s.masses` already holds the chunk estimates ([`fused`]).
fn sample_whole(passes: &Passes<'_>, r: u64, s: &mut Scratch, estimate: bool) -> Option<usize> {
    let (values, lanes) = (passes.values, &passes.lanes);
    if estimate {
        passes.estimate_chunks(&mut s.masses);
    }
    let kept = |_: usize, _: f32| true;
    draw_by_chunks(values, lanes, &s.masses, ESTIMATED, r, kept).or_else(|| {
        // The bounds left the draw open: the exact chunk masses decide it.
        exact_above(values, lanes, 0, &mut s.masses);
        draw_by_chunks(values, lanes, &s.masses, EXACT, r, kept)
    })
}

#[cfg(test)]
thread_local! {
    /// How often a band missed the threshold and was widened, on this thread (tests only).
    static BAND_MISSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
thread_local! {
    /// The band tokens listed and the classify passes that listed them, on this thread (tests
    /// only).
    static BAND_TOKENS: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// Counts a classify pass that listed `tokens` band tokens (tests only).
fn count_band(_tokens: usize) {
    #[cfg(test)]
    BAND_TOKENS.with(|b| b.set((b.get().0 + _tokens, b.get().1 + 1)));
}

/// Counts a band that missed the threshold (tests only).
fn count_band_miss() {
    #[cfg(test)]
    BAND_MISSES.with(|misses| misses.set(misses.get() + 1));
}

/// How often the bounds left a decision open and exact masses were computed (tests only).
#[cfg(test)]
pub(super) static EXACT_PASSES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// The exact mass of each chunk's tokens whose rank key is at least `floor` into `masses` (exact
/// in f64: at most `64 · 2^40`), and the row's exact total weight.
fn exact_above(values: &[f32], lanes: &RowLanes, floor: u32, masses: &mut [f64]) -> u64 {
    #[cfg(test)]
    EXACT_PASSES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut weights = [0u64; CHUNK];
    let mut total = 0u64;
    for (chunk, mass) in values.chunks(CHUNK).zip(masses.iter_mut()) {
        let weights = &mut weights[..chunk.len()];
        exact_weights(chunk, lanes, weights);
        let (all, above) = sums_above(chunk, weights, floor);
        total += all;
        *mass = above as f64;
    }
    total
}

crate::sampling::scan::dispatched!(
    /// The sum of `weights` and the sum of those whose logit in `chunk` has a rank key at least
    /// `floor`, with the loop compiled for the CPU's vector unit (the baseline build's two-lane
    /// loop was a third of an exact pass).
    fn sums_above [] (chunk: &[f32], weights: &[u64], floor: u32) -> (u64, u64)
        = sums_above_generic []
);

/// [`sums_above`]: branch-free, so that the compiler vectorizes it.
#[inline(always)]
fn sums_above_generic(chunk: &[f32], weights: &[u64], floor: u32) -> (u64, u64) {
    let (mut all, mut above) = (0u64, 0u64);
    for (&l, &w) in chunk.iter().zip(weights) {
        all += w;
        above += w & 0u64.wrapping_sub(u64::from(key_select(l) >= floor));
    }
    (all, above)
}

/// The token the draw `r` selects among the kept tokens in id order, given each chunk's
/// kept mass (`masses`, within `accuracy` of the exact ones): the chunks the draw may fall in are weighed exactly
/// (`kept` says which of their tokens count) and walked; `None` when the bounds leave the
/// token open.
fn draw_by_chunks(
    values: &[f32],
    lanes: &RowLanes,
    masses: &[f64],
    accuracy: Accuracy,
    r: u64,
    kept: impl Fn(usize, f32) -> bool,
) -> Option<usize> {
    let split = Split::draw(r);
    let total: f64 = masses.iter().sum();
    let chunks =
        |mass: f64, count: usize| Bounds::estimated(mass.max(0.0), count * CHUNK, accuracy);
    // The first chunk whose end may lie past the draw. Chunks whose end lies below the point by
    // twice the whole row's error certainly end before it (see `Split::skips`): a plain add and
    // compare each, the bounds only near the point.
    let skip_below = split.skips(chunks(total, masses.len()));
    let mut before = 0.0f64;
    let mut first = None;
    for (c, &mass) in masses.iter().enumerate() {
        if before + mass >= skip_below {
            let rest = masses.len() - c - 1;
            let (through, after) = (
                chunks(before + mass, c + 1),
                chunks(total - before - mass, rest),
            );
            if !split.certainly_not(through, after) {
                first = Some(c);
                break;
            }
        }
        before += mass;
    }
    let first = first?;
    let mut weights = [0u64; CHUNK];
    // The exact kept mass of the chunks walked before the current one.
    let mut exact_before = 0u64;
    let mut after = total - before;
    for (c, &mass) in masses.iter().enumerate().skip(first) {
        let start = c * CHUNK;
        let chunk = &values[start..values.len().min(start + CHUNK)];
        let weights = &mut weights[..chunk.len()];
        exact_weights(chunk, lanes, weights);
        for (j, (&l, w)) in chunk.iter().zip(weights.iter_mut()).enumerate() {
            if !kept(start + j, l) {
                *w = 0;
            }
        }
        after -= mass;
        let chunk_total: u64 = weights.iter().sum();
        let (head, tail) = (chunks(before, first), chunks(after, masses.len() - c - 1));
        let mut partial = 0u64;
        for (j, &w) in weights.iter().enumerate() {
            if w == 0 {
                continue;
            }
            partial += w;
            let through = head.plus(Bounds::exact(exact_before + partial));
            let rest = tail.plus(Bounds::exact(chunk_total - partial));
            if split.certainly(through, rest) {
                // The draw lands here: it certainly did not at any kept token before.
                return Some(start + j);
            }
            if !split.certainly_not(through, rest) {
                return None; // the bounds leave it open
            }
        }
        exact_before += chunk_total;
    }
    None
}

/// top_p < 1: the band around the threshold, its exact bins, then the draw. A band that turns out
/// to lie below the threshold (the mass above it may reach the target) or above it (its tokens
/// do not reach it) is widened to the top or to the bottom of the row and the pass repeated.
///
/// The band is placed from a strided sample of the row's estimates. Where the sample pins the
/// row's total well (its own spread at most [`CONFIDENT`] of it: rows whose mass is spread over
/// many tokens) and the levels pay ([`levels_pay`]), the band is placed before the first pass,
/// and that pass narrows it with the masses at a few levels inside it ([`sample_in_band`]).
/// Elsewhere the first pass's total places it (the sample cannot pin it where a few heavy
/// tokens carry most of the mass).
fn sample_top_p(passes: &Passes<'_>, p: u64, r: u64, s: &mut Scratch) -> Option<usize> {
    let lanes = &passes.lanes;
    let sample = staged(stage::SAMPLE, || {
        Sample::of(lanes, passes.values, &mut s.sampled)
    });
    let share = 1.0 - p as f64 / (1u64 << TOP_P_BITS) as f64;
    let slack = |total: f64| SLACK * total;
    if sample.spread() <= CONFIDENT * sample.total && levels_pay() {
        let below = share * sample.total;
        let spread = share * sample.spread();
        let limits = (below - spread, below + spread);
        let sampled = staged(stage::PLACE, || {
            place_band(
                lanes,
                &s.sampled,
                &sample,
                limits,
                slack(sample.total),
                &mut s.sample,
            )
        });
        return sample_in_band(passes, p, r, s, sampled);
    }
    let (total, []) = staged(stage::STORE, || {
        passes.estimate_tokens(&mut s.estimates, &[])
    });
    let below = share * total;
    let band = staged(stage::PLACE, || {
        place_band(
            lanes,
            &s.sampled,
            &sample,
            (below, below),
            slack(total),
            &mut s.sample,
        )
    });
    settle(passes, p, r, s, band)
}

/// How closely the sample must pin the row's total (four of its standard deviations, as a share
/// of it) for the band to be placed before the first pass.
const CONFIDENT: f64 = 0.2;

/// Whether the first pass's levels pay for themselves: where a level costs a compare and a
/// masked add per sixteen tokens (AVX-512), 3.8 µs a row each, and without them a kept~100k
/// row took 13 µs longer (the band the total places lists 6,910 tokens, the narrowed one
/// 3,008); in eight AVX2 lanes a compare, a mask and an add per eight tokens, the three levels
/// 30 µs a row, and the same row's stage took 129 µs without them against 157–160 at main
/// (`docs/performance.md`, "Issue 28, stop 45"). Without them the first pass's total places
/// the band, as on rows the sample does not pin.
fn levels_pay() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx512()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`sample_top_p`] from the band `sampled` placed before the first pass: the first pass's
/// levels narrow it, the second pass checks it.
fn sample_in_band(
    passes: &Passes<'_>,
    p: u64,
    r: u64,
    s: &mut Scratch,
    sampled: Band,
) -> Option<usize> {
    let lanes = &passes.lanes;
    let levels = sampled.levels(lanes);
    let (rough_total, masses) = staged(stage::STORE, || {
        passes.estimate_tokens(&mut s.estimates, &levels)
    });
    let band = sampled.narrowed(&levels, &masses, rough_total, p);
    settle(passes, p, r, s, band)
}

/// The threshold and the draw from `band`, widened and the second pass repeated while it misses.
fn settle(passes: &Passes<'_>, p: u64, r: u64, s: &mut Scratch, mut band: Band) -> Option<usize> {
    let (values, lanes) = (passes.values, &passes.lanes);
    let split = Split::top_p(p);
    loop {
        let found = Found {
            tokens: &mut s.band,
            histogram: &mut s.histogram,
        };
        let counted = staged(stage::CLASSIFY, || {
            classify(passes, &s.estimates, band, &mut s.masses, found)
        });
        let (row, above) = counted.masses(values.len());
        count_band(s.band.len());
        if !split.certainly_not(above.bounds(), row.less(above).bounds()) {
            // The threshold may lie above the band.
            if band.high == f32::INFINITY {
                return None;
            }
            count_band_miss();
            band.high = f32::INFINITY;
            continue;
        }
        let in_band = staged(stage::THRESHOLD, || {
            threshold_in_band(values, lanes, s, (row, above), split)
        });
        match in_band {
            InBand::Found(threshold) => {
                return draw_kept(values, lanes, s, threshold, r).or_else(|| {
                    // The bounds left the draw open: exact kept masses decide it.
                    let floor = threshold.key.saturating_add(1);
                    exact_above(values, lanes, floor, &mut s.masses);
                    draw_exact(values, lanes, s, threshold, floor, r)
                });
            }
            InBand::Open(floor) => {
                // The bounds left the threshold open: the exact mass above the region and the
                // exact total decide it, and give the exact kept masses of the draw.
                let total = exact_above(values, lanes, floor, &mut s.masses);
                let head: u64 = s.masses.iter().map(|&m| m as u64).sum();
                // The region and everything ranked after it.
                let rest = total.checked_sub(head)?;
                let (head, rest) = (Bounds::exact(head), Bounds::exact(rest));
                let Walk::Found(threshold) = walk_region(&s.region, head, rest, split) else {
                    return None;
                };
                return draw_exact(values, lanes, s, threshold, floor, r);
            }
            InBand::Below if band.low == -f32::MAX => return None,
            InBand::Below => {
                count_band_miss();
                band.low = -f32::MAX;
            }
        }
    }
}

/// The draw on exact kept masses: `s.masses` holds each chunk's exact mass of the tokens whose
/// key is at least `floor` (all kept), to which the kept tokens of the region below `floor` are
/// added (the threshold's key is in the region, so every kept token below `floor` is there).
fn draw_exact(
    values: &[f32],
    lanes: &RowLanes,
    s: &mut Scratch,
    threshold: Threshold,
    floor: u32,
    r: u64,
) -> Option<usize> {
    for &(key, id, w) in &s.region {
        if key < floor && threshold.keeps(key, id) {
            s.masses[id as usize / CHUNK] += w as f64;
        }
    }
    let keeps = |id: usize, l: f32| threshold.keeps(key_select(l), id as u32);
    draw_by_chunks(values, lanes, &s.masses, EXACT, r, keeps)
}

/// A sum of stored estimates and how many tokens it counts.
#[derive(Clone, Copy, Debug, Default)]
struct Masses {
    total: f64,
    tokens: usize,
}

impl Masses {
    /// The bounds of the exact mass.
    fn bounds(&self) -> Bounds {
        Bounds::estimated(self.total.max(0.0), self.tokens, STORED)
    }

    /// The tokens of `self` that are not in `part` (a subset).
    fn less(&self, part: Masses) -> Masses {
        Masses {
            total: self.total - part.total,
            tokens: self.tokens - part.tokens,
        }
    }

    fn plus(&self, other: Masses) -> Masses {
        Masses {
            total: self.total + other.total,
            tokens: self.tokens + other.tokens,
        }
    }
}

/// The draw among the kept tokens, every token up to `threshold` in rank order: the per-chunk
/// masses of [`classify`] become kept masses (the mass above the band plus the kept band tokens),
/// then [`draw_by_chunks`].
fn draw_kept(
    values: &[f32],
    lanes: &RowLanes,
    s: &mut Scratch,
    threshold: Threshold,
    r: u64,
) -> Option<usize> {
    staged(stage::KEPT, || add_kept(&s.band, threshold, &mut s.masses));
    let keeps = |id: usize, l: f32| threshold.keeps(key_select(l), id as u32);
    staged(stage::WALK, || {
        draw_by_chunks(values, lanes, &s.masses, STORED, r, keeps)
    })
}

/// Adds the estimate of each kept token of `band` (in id order) to its chunk's slot of `masses`.
/// The two halves of the band go side by side: in id order most tokens add to the slot the one
/// before added to, and one chain of those additions, each waiting on the last one's store, cost
/// twice as long.
fn add_kept(band: &[BandToken], threshold: Threshold, masses: &mut [f64]) {
    let mut add = |t: &BandToken| {
        let kept = kept_estimate(threshold.keeps(t.key, t.id), t.estimate);
        masses[t.id as usize / CHUNK] += kept;
    };
    let (first, second) = band.split_at(band.len() / 2);
    for (a, b) in first.iter().zip(second) {
        add(a);
        add(b);
    }
    if let Some(last) = second.get(first.len()) {
        add(last);
    }
}

/// `estimate` widened where `keeps`, else +0.0, without a branch: in id order about half the band
/// is kept, unpredictably. A product with the test as 0.0 or 1.0, a float select, or a select of
/// the bits all compiled to a branch, which a cold batch paid about 4 ns a band token for; an
/// SSE2 AND with a mask of the test stays a vector operation.
#[inline(always)]
fn kept_estimate(keeps: bool, estimate: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            _mm_and_pd, _mm_castsi128_pd, _mm_cvtsd_f64, _mm_cvtsi64_si128, _mm_set_sd,
        };
        let mask = 0i64.wrapping_sub(i64::from(keeps));
        // SAFETY: SSE2 is part of the x86_64 baseline, so every x86_64 CPU runs these.
        unsafe {
            _mm_cvtsd_f64(_mm_and_pd(
                _mm_set_sd(f64::from(estimate)),
                _mm_castsi128_pd(_mm_cvtsi64_si128(mask)),
            ))
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        if keeps { f64::from(estimate) } else { 0.0 }
    }
}

/// What the band says of the threshold.
enum InBand {
    /// The threshold.
    Found(Threshold),
    /// The bounds leave the threshold open among the tokens of the region (`Scratch::region`,
    /// weighed exactly, in rank order); every token ranked above them has a key at least this.
    Open(u32),
    /// The band's tokens may not reach the target: the threshold may lie below the band.
    Below,
}

/// The logits band `[low, high)` around the threshold: the tokens with a logit at or above `high`
/// are certainly kept (checked after the fact), the threshold lies among the band's tokens.
#[derive(Clone, Copy, Debug)]
struct Band {
    low: f32,
    high: f32,
}

/// A strided sample of a row's estimates: runs of [`SAMPLE_RUN`] consecutive tokens spread over
/// the row (a few cache lines each, not one line per sampled token), estimated in lanes before
/// the first pass (the same bits as the first pass stores).
struct Sample {
    /// Tokens of the row per sampled token.
    scale: f64,
    /// The row's total as the sample estimates it, and the sum of the sampled estimates' squares
    /// (scaled as the total).
    total: f64,
    squares: f64,
}

impl Sample {
    /// The sample of `values` (its estimates into `out`).
    fn of(lanes: &RowLanes, values: &[f32], out: &mut Vec<f32>) -> Sample {
        let runs = (values.len() / SAMPLE_RUN).clamp(1, SAMPLES / SAMPLE_RUN);
        let step = values.len() / runs;
        // The runs' logits gathered, then estimated in one call (one call per run costs more).
        let mut logits = [0.0f32; SAMPLES];
        let mut n = 0;
        for i in 0..runs {
            let run = &values[i * step..(i * step + SAMPLE_RUN).min(values.len())];
            if let Ok(run) = <&[f32; SAMPLE_RUN]>::try_from(run) {
                // A copy of a known length: a few vector moves, not a call.
                logits[n..n + SAMPLE_RUN].copy_from_slice(run);
            } else {
                logits[n..n + run.len()].copy_from_slice(run);
            }
            n += run.len();
        }
        out.resize(n, 0.0);
        let total = estimate_store(&logits[..n], lanes, out);
        let scale = values.len() as f64 / n.max(1) as f64;
        // The squares in eight lanes (one chain of dependent adds would cost more than the
        // estimates).
        let mut squares = [0.0f64; 8];
        let mut groups = out.chunks_exact(8);
        for group in &mut groups {
            for (square, &w) in squares.iter_mut().zip(group) {
                *square += f64::from(w) * f64::from(w);
            }
        }
        let rest: f64 = groups
            .remainder()
            .iter()
            .map(|&w| f64::from(w).powi(2))
            .sum();
        Sample {
            scale,
            total: scale * total,
            squares: scale * scale * (squares.iter().sum::<f64>() + rest),
        }
    }

    /// Four standard deviations of the sample's estimate of the total.
    fn spread(&self) -> f64 {
        4.0 * self.squares.sqrt()
    }
}

/// Places the band from the sample's estimates `sampled`: the threshold is where the mass below
/// it is `W − P · W / 2^24`, between `limits`; the sample estimates the mass below each level
/// (well, since that mass is spread over many tokens), and the band spans the levels whose
/// estimate is within four standard deviations (and `slack`) of the limits.
fn place_band(
    lanes: &RowLanes,
    sampled: &[f32],
    sample: &Sample,
    limits: (f64, f64),
    slack: f64,
    bins: &mut Vec<(f64, f64)>,
) -> Band {
    // Bins of the estimate's f32 bits >> 17: sixty-four per octave, in the order of the logits,
    // from 2^-2 (the estimates of weights past the gap limit are at least about 2^-1) to 2^41
    // (every estimate is at most about 2^40).
    const SHIFT: u32 = 17;
    const FIRST: u32 = 0.25f32.to_bits() >> SHIFT;
    const LAST: u32 = 0x5400_0000 >> SHIFT; // 2^41
    bins.clear();
    bins.resize((LAST - FIRST + 1) as usize, (0.0, 0.0));
    for &w in sampled {
        let bin = (w.max(0.0).to_bits() >> SHIFT).clamp(FIRST, LAST) - FIRST;
        let bin = &mut bins[bin as usize];
        bin.0 += f64::from(w);
        bin.1 += f64::from(w) * f64::from(w);
    }
    let (low_bin, high_bin) = band_bins(bins, sample.scale, limits, slack, BAND_SIGMAS);
    let level = |bin: usize| f32::from_bits((bin as u32 + FIRST) << SHIFT);
    // A level at or above the maximum's weight keeps nothing above the band.
    let high = high_bin
        .map(level)
        .filter(|&w| f64::from(w) < (1u64 << 40) as f64);
    Band {
        low: low_bin.map_or(-f32::MAX, |b| logit_of_estimate(lanes, level(b))),
        high: high.map_or(f32::INFINITY, |w| logit_of_estimate(lanes, w)),
    }
}

/// Logit levels inside a band at which the first pass sums the estimates above (a compare and a
/// masked add per level and vector), so that the band it hands the second pass is one or two of
/// the `LEVELS + 1` slices they cut.
const LEVELS: usize = 3;
/// Levels of the first pass, from the top.
type Levels = [f32; LEVELS];
/// How far (a share of the row's rough total) the target must lie from a level's rough mass for
/// the level to bound the band: far above the f32 rounding of those sums (at most 256 adds per
/// lane and step) and the bounds' error (`2^-20`), so that the second pass rarely finds the
/// threshold outside.
const LEVEL_SLACK: f64 = 1.0 / 4096.0;

impl Band {
    /// The levels that cut the band into `LEVELS + 1` slices of equal logit width, between its
    /// ends clamped to the row (the maximum, the logit past which every weight is 0); NaN
    /// levels (no token is at them) where the band is too narrow to cut.
    fn levels(&self, lanes: &RowLanes) -> Levels {
        let top = self.high.min(lanes.max);
        let bottom = self.low.max(lanes.max - lanes.dcap);
        let width = (top - bottom) / (LEVELS + 1) as f32;
        let mut levels = [f32::NAN; LEVELS];
        for (k, level) in levels.iter_mut().enumerate() {
            *level = top - width * (k + 1) as f32;
        }
        let inside = |&l: &f32| l > self.low && l < self.high;
        let falling = levels.windows(2).all(|w| w[0] > w[1]);
        if !(levels.iter().all(inside) && falling) {
            levels = [f32::NAN; LEVELS];
        }
        levels
    }

    /// The band narrowed by the first pass's rough masses at `levels` (`Band::levels`): its
    /// high end is the lowest level whose mass is short of the target `P · W / 2^24` by
    /// [`LEVEL_SLACK`], its low end the highest level whose mass passes it by as much (the
    /// band's own ends where no level does). Rough sums: the second pass checks both ends.
    fn narrowed(&self, levels: &Levels, masses: &[f64; LEVELS], total: f64, p: u64) -> Band {
        if levels.iter().any(|l| l.is_nan()) {
            return *self;
        }
        let target = total * p as f64 / (1u64 << TOP_P_BITS) as f64;
        let slack = LEVEL_SLACK * total;
        let mut band = *self;
        for (&level, &mass) in levels.iter().zip(masses) {
            if mass < target - slack {
                band.high = level;
            }
        }
        for (&level, &mass) in levels.iter().zip(masses).rev() {
            if mass > target + slack {
                band.low = level;
            }
        }
        if band.low < band.high { band } else { *self }
    }
}

/// The logit whose estimate is about `w` (the inverse of the estimate, rounded anyhow: it only
/// places the band).
fn logit_of_estimate(lanes: &RowLanes, w: f32) -> f32 {
    let gap = (40.0 - f64::from(w).max(f64::MIN_POSITIVE).log2()).max(0.0);
    (f64::from(lanes.max) - gap / lanes.scale()) as f32
}

/// The second pass: per chunk the estimated mass of the tokens at or above the band into
/// `masses`, the band's tokens (in id order) into `band`; returns the mass above the band and
/// its token count.
fn classify(
    passes: &Passes<'_>,
    estimates: &[f32],
    band: Band,
    masses: &mut Vec<f64>,
    found: Found<'_>,
) -> Counted {
    let (values, segments) = (passes.values, passes.segments);
    masses.resize(values.len().div_ceil(CHUNK), 0.0);
    found.tokens.clear();
    found.histogram.span(band, passes.top);
    if segments.count == 1 {
        return classify_part(values, estimates, 0, band, masses, found);
    }
    let empty = found.histogram.clone();
    let parts: Vec<(Counted, Vec<BandToken>, Histogram)> = values
        .par_chunks(segments.len)
        .zip(estimates.par_chunks(segments.len))
        .zip(masses.par_chunks_mut(segments.len / CHUNK))
        .enumerate()
        .map(|(i, ((part, ests), masses))| {
            let (mut tokens, mut histogram) = (Vec::new(), empty.clone());
            let found = Found {
                tokens: &mut tokens,
                histogram: &mut histogram,
            };
            let counted = classify_part(part, ests, i * segments.len, band, masses, found);
            (counted, tokens, histogram)
        })
        .collect();
    let mut counted = Counted::default();
    for (part, tokens, histogram) in parts {
        counted = counted.plus(part);
        found.tokens.extend(tokens);
        found.histogram.merge(&histogram);
    }
    counted
}

/// What [`classify`] counts: the estimates' sum above the band and how many tokens it holds, and
/// the sum of every estimate of the row (f64 sums of the f32 estimates, so that the mass of the
/// tokens not above the band is exactly `row − above` of the same numbers).
#[derive(Clone, Copy, Debug, Default)]
struct Counted {
    above: f64,
    above_tokens: usize,
    row: f64,
}

impl Counted {
    /// The row's estimated mass (of its `tokens` tokens) and the mass above the band.
    fn masses(&self, tokens: usize) -> (Masses, Masses) {
        let row = Masses {
            total: self.row,
            tokens,
        };
        let above = Masses {
            total: self.above,
            tokens: self.above_tokens,
        };
        (row, above)
    }

    fn plus(self, other: Counted) -> Counted {
        Counted {
            above: self.above + other.above,
            above_tokens: self.above_tokens + other.above_tokens,
            row: self.row + other.row,
        }
    }
}

/// [`classify`] of the tokens of one segment, starting at token `first`.
fn classify_part(
    values: &[f32],
    estimates: &[f32],
    first: usize,
    band: Band,
    masses: &mut [f64],
    mut found: Found<'_>,
) -> Counted {
    let full = values.len() / CHUNK;
    let (head, tail) = values.split_at(full * CHUNK);
    let (head_masses, tail_masses) = masses.split_at_mut(full);
    let counted = classify_full(head, estimates, first, band, head_masses, &mut found);
    let rest = classify_chunks(
        tail,
        &estimates[head.len()..],
        first + head.len(),
        band,
        tail_masses,
        &mut found,
    );
    counted.plus(rest)
}

/// [`classify`] over whole chunks, with the vector loop of the CPU ([`step_loop`]) where it has
/// one.
fn classify_full(
    values: &[f32],
    estimates: &[f32],
    first: usize,
    band: Band,
    masses: &mut [f64],
    found: &mut Found<'_>,
) -> Counted {
    #[cfg(target_arch = "x86_64")]
    if let Some(step_loop) = step_loop() {
        return classify_steps(step_loop, values, estimates, first, band, masses, found);
    }
    classify_chunks(values, estimates, first, band, masses, found)
}

/// [`classify_full`] with the vector loop `step_loop`, one [`LIST_STEP`] at a time: a step's
/// tokens are listed right after its loop, while its logits and estimates are still in L1
/// (listed after the whole segment, the profile put most of the listing's time on the load of
/// each band token's logit).
#[cfg(target_arch = "x86_64")]
fn classify_steps(
    step_loop: StepLoop,
    values: &[f32],
    estimates: &[f32],
    first: usize,
    band: Band,
    masses: &mut [f64],
    found: &mut Found<'_>,
) -> Counted {
    let mut offsets = [0u16; LIST_STEP];
    let mut counted = Counted::default();
    let steps = values
        .chunks(LIST_STEP)
        .zip(estimates.chunks(LIST_STEP))
        .zip(masses.chunks_mut(LIST_STEP / CHUNK));
    for (i, ((values, estimates), masses)) in steps.enumerate() {
        let slices = Step {
            values,
            estimates,
            masses,
            offsets: &mut offsets,
        };
        // SAFETY: `step_loop` comes from `step_loops`, which offers only loops whose features
        // the CPU has; the slices hold whole chunks, `offsets` a slot
        // per token.
        let (step, listed) = unsafe { step_loop(slices, band) };
        counted = counted.plus(step);
        staged(stage::LIST, || {
            let offsets = &offsets[..listed];
            list_offsets(found, first + i * LIST_STEP, offsets, values, estimates)
        });
    }
    counted
}

/// A vector loop of [`classify`] over one [`Step`]: it writes each chunk's mass above the band
/// and the offsets in the step of its band tokens, in id order, to the front of `offsets`, and
/// returns the mass above the band, its token count and the row's sum, and how many offsets it
/// wrote.
///
/// # Safety
/// The CPU must have the features the loop is compiled for; the step's slices are as [`Step`]
/// says.
#[cfg(target_arch = "x86_64")]
type StepLoop = unsafe fn(Step<'_>, Band) -> (Counted, usize);

/// The vector loops of [`classify`], best first, each where this CPU runs it (the tests run
/// each).
#[cfg(target_arch = "x86_64")]
fn step_loops() -> [Option<StepLoop>; 3] {
    [
        has_avx512_vbmi2().then_some(avx512::classify_words as StepLoop),
        has_avx512().then_some(avx512::classify_dwords as StepLoop),
        has_avx2().then_some(avx2::classify as StepLoop),
    ]
}

/// The best vector loop of [`classify`] this CPU runs.
#[cfg(target_arch = "x86_64")]
fn step_loop() -> Option<StepLoop> {
    step_loops().into_iter().flatten().next()
}

/// Tokens per step of the vector classify loop: their logits and estimates (16 KiB) stay in L1
/// until the step's band tokens are listed. Offsets in a step fit 16 bits.
const LIST_STEP: usize = 8 * CHUNK;
const _: () = assert!(LIST_STEP <= 1 << 16);

/// [`classify`] token by token, for chunks starting at token `first`.
fn classify_chunks(
    values: &[f32],
    estimates: &[f32],
    first: usize,
    band: Band,
    masses: &mut [f64],
    found: &mut Found<'_>,
) -> Counted {
    let mut counted = Counted::default();
    for (c, ((chunk, ests), mass)) in values
        .chunks(CHUNK)
        .zip(estimates.chunks(CHUNK))
        .zip(masses.iter_mut())
        .enumerate()
    {
        *mass = 0.0;
        for (j, (&l, &w)) in chunk.iter().zip(ests).enumerate() {
            counted.row += f64::from(w);
            // NaN is neither above nor in the band (it ranks last and weighs 0).
            if l >= band.high {
                *mass += f64::from(w);
                counted.above_tokens += 1;
            } else if l >= band.low {
                push_band(found, first + c * CHUNK + j, l, w);
            }
        }
        counted.above += *mass;
    }
    counted
}

/// Appends a band token.
#[inline(always)]
fn push_band(found: &mut Found<'_>, id: usize, l: f32, w: f32) {
    let key = key_select(l);
    found.histogram.add(key, w);
    found.tokens.push(BandToken {
        key,
        id: id as u32,
        estimate: w,
    });
}

/// Where [`classify`] puts the band's tokens and their histogram.
struct Found<'a> {
    tokens: &'a mut Vec<BandToken>,
    histogram: &'a mut Histogram,
}

/// Appends the band tokens at `offsets` (in id order) of a step whose first token is token
/// `first` of the row, then counts them in the histogram: a loop of a known count, no branch per
/// token or per bitmap word (the AVX-512 loop packs the offsets as it classifies).
fn list_offsets(
    found: &mut Found<'_>,
    first: usize,
    offsets: &[u16],
    values: &[f32],
    estimates: &[f32],
) {
    let start = found.tokens.len();
    found.tokens.extend(offsets.iter().map(|&j| {
        let j = j as usize;
        BandToken {
            key: key_select(values[j]),
            id: (first + j) as u32,
            estimate: estimates[j],
        }
    }));
    staged(stage::COUNT, || {
        for t in &found.tokens[start..] {
            found.histogram.add(t.key, t.estimate);
        }
    });
}

/// One step of the vector [`classify`] loops: whole chunks of logits and their estimates, their
/// slots of the per-chunk masses, and a slot per token for the offsets of its band tokens.
#[cfg(target_arch = "x86_64")]
struct Step<'a> {
    values: &'a [f32],
    estimates: &'a [f32],
    masses: &'a mut [f64],
    offsets: &'a mut [u16; LIST_STEP],
}

/// The loop of both vector widths' [`classify`] over a step's whole chunks, `N` tokens at a
/// time: `group` classifies the `N` logits and estimates at its two pointers, token `at` of the
/// step on (into its chunk's accumulator, starting at `zero`), packs the offsets of their band
/// tokens to the front of the `N` slots it is given, and returns their count; `finish` turns a
/// chunk's accumulator into its estimated mass above the band, stored in its slot of `masses`.
/// Returns the mass above the band (the caller counts the tokens and the row's sum) and how
/// many offsets were listed.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn chunks_with<const N: usize, A: Copy>(
    step: Step<'_>,
    zero: A,
    mut group: impl FnMut(*const f32, *const f32, usize, &mut A, &mut [u16]) -> usize,
    mut finish: impl FnMut(A) -> f64,
) -> (Counted, usize) {
    let Step {
        values,
        estimates,
        masses,
        offsets,
    } = step;
    let mut counted = Counted::default();
    let mut listed = 0;
    let rows = values
        .chunks_exact(CHUNK)
        .zip(estimates.chunks_exact(CHUNK));
    for (c, ((chunk, ests), mass)) in rows.zip(masses.iter_mut()).enumerate() {
        let mut acc = zero;
        for at in (0..CHUNK).step_by(N) {
            // Tokens `at .. at + N` of the chunk (`at + N ≤ CHUNK`).
            let (l, e) = (chunk[at..].as_ptr(), ests[at..].as_ptr());
            let at = c * CHUNK + at;
            // At most `at` offsets precede these (one per token before them), so the `N` slots
            // from `listed` lie inside the step's `LIST_STEP` (`at + N ≤ LIST_STEP`); the slots
            // past the band lanes are overwritten next or never read.
            listed += group(l, e, at, &mut acc, &mut offsets[listed..listed + N]);
        }
        *mass = finish(acc);
        counted.above += *mass;
    }
    (counted, listed)
}

/// The [`classify`] loops over whole chunks with AVX-512, 32 tokens at a time: per 16 tokens
/// two compares and the estimates above the band widened and added in f64 under a mask; per 32
/// the band lanes' offsets packed to the front of a vector and stored whole at the end of the
/// step's list, which then grows by their count. No branch per token, and no call in the loop,
/// so that the accumulators stay in registers. The offsets are 16-bit words: with VBMI2 one
/// `vpcompressw` packs the 32 tokens' at once (`classify_words`); without, a `vpcompressd` and a
/// narrowing per 16 (`classify_dwords`). The packing and its store were a fifth of the loop at
/// one `vpcompressd` and a 64-byte store per 16 tokens (`docs/performance.md`, "Issue 28, stop 45").
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Band, Counted, Step, chunks_with};
    use std::arch::x86_64::*;

    /// Packs the offsets `at ..` of the band lanes of two vectors of 16 tokens (masks `low`,
    /// `high`) to the front of `slots` (at least 32) with one `vpcompressw`; returns their
    /// count.
    #[inline]
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi2,popcnt,bmi1,bmi2,lzcnt"
    )]
    fn pack_words(low: u16, high: u16, at: usize, slots: &mut [u16]) -> usize {
        let mask = u32::from(low) | (u32::from(high) << 16);
        let lanes = _mm512_set_epi16(
            31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10,
            9, 8, 7, 6, 5, 4, 3, 2, 1, 0,
        );
        // Offsets in a step are below `LIST_STEP` (2^16 at most): `at` fits a word.
        let offsets = _mm512_add_epi16(_mm512_set1_epi16(at as u16 as i16), lanes);
        let slots = &mut slots[..32];
        // SAFETY: the slice holds 32 words; unaligned stores are allowed.
        unsafe {
            _mm512_storeu_si512(
                slots.as_mut_ptr().cast(),
                _mm512_maskz_compress_epi16(mask, offsets),
            );
        }
        mask.count_ones() as usize
    }

    /// [`pack_words`] without VBMI2: a `vpcompressd` of each vector's offsets, narrowed to words.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt")]
    fn pack_dwords(low: u16, high: u16, at: usize, slots: &mut [u16]) -> usize {
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let mut listed = 0;
        for (k, mask) in [low, high].into_iter().enumerate() {
            let offsets = _mm512_add_epi32(_mm512_set1_epi32((at + 16 * k) as i32), lanes);
            let words = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(mask, offsets));
            let slots = &mut slots[listed..listed + 16];
            // SAFETY: the slice holds 16 words; unaligned stores are allowed.
            unsafe { _mm256_storeu_si256(slots.as_mut_ptr().cast(), words) };
            listed += mask.count_ones() as usize;
        }
        listed
    }

    /// The loop of both packings (`$pack`).
    macro_rules! classify_loop {
        ($name:ident, $features:literal, $pack:ident) => {
            /// See [`super::StepLoop`].
            ///
            /// # Safety
            /// The CPU must support the features the loop is compiled for; the step's slices
            /// are as [`Step`] says.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name(step: Step<'_>, band: Band) -> (Counted, usize) {
                let (high, low) = (_mm512_set1_ps(band.high), _mm512_set1_ps(band.low));
                let (mut all0, mut all1) = (_mm512_setzero_pd(), _mm512_setzero_pd());
                let mut above_tokens = 0;
                let zero = (_mm512_setzero_pd(), _mm512_setzero_pd());
                // The 16 tokens at `l` and `e` into the chunk's accumulator and the row's sum;
                // returns the mask of the band lanes.
                let mut vector = |l: *const f32, e: *const f32, acc: &mut (__m512d, __m512d)| {
                    // SAFETY: the callers pass pointers to 16 f32.
                    let (l, e) = unsafe { (_mm512_loadu_ps(l), _mm512_loadu_ps(e)) };
                    // Ordered compares: NaN is neither above nor in the band.
                    let above = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(l, high);
                    let in_band = _mm512_mask_cmp_ps_mask::<_CMP_GE_OQ>(!above, l, low);
                    let e_low = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
                    let e_high = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                        _mm512_castps_pd(e),
                    )));
                    acc.0 = _mm512_mask_add_pd(acc.0, above as u8, acc.0, e_low);
                    acc.1 = _mm512_mask_add_pd(acc.1, (above >> 8) as u8, acc.1, e_high);
                    all0 = _mm512_add_pd(all0, e_low);
                    all1 = _mm512_add_pd(all1, e_high);
                    above_tokens += above.count_ones() as usize;
                    in_band
                };
                let group = |l: *const f32, e: *const f32, at, acc: &mut _, slots: &mut [u16]| {
                    // SAFETY: `chunks_with` passes pointers to 32 f32.
                    let (b0, b1) =
                        unsafe { (vector(l, e, acc), vector(l.add(16), e.add(16), acc)) };
                    $pack(b0, b1, at, slots)
                };
                let finish = |(acc0, acc1)| _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
                let (mut counted, listed) = chunks_with::<32, _>(step, zero, group, finish);
                counted.above_tokens = above_tokens;
                counted.row = _mm512_reduce_add_pd(_mm512_add_pd(all0, all1));
                (counted, listed)
            }
        };
    }

    classify_loop!(
        classify_words,
        "avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi2,popcnt,bmi1,bmi2,lzcnt",
        pack_words
    );
    classify_loop!(
        classify_dwords,
        "avx512f,avx512bw,avx512vl,avx512dq,popcnt,bmi1,bmi2,lzcnt",
        pack_dwords
    );
}

/// The [`classify`] loop over whole chunks with AVX2 (8 tokens per step), as the AVX-512 one; a
/// vector's band offsets are the lane indices a table packs to the front ([`PACK8`]) plus the
/// vector's offset.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Band, Counted, Step, chunks_with};
    use crate::sampling::pack::PACK8;
    use std::arch::x86_64::*;

    /// The sum of 4 f64 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,popcnt,bmi1,bmi2,lzcnt")]
    fn reduce4(v: __m256d) -> f64 {
        let pair = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
        _mm_cvtsd_f64(_mm_add_sd(pair, _mm_unpackhi_pd(pair, pair)))
    }

    /// See the AVX-512 loop.
    ///
    /// # Safety
    /// The CPU must support AVX2 and POPCNT; the step's slices are as [`Step`] says.
    #[target_feature(enable = "avx2,fma,popcnt,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn classify(step: Step<'_>, band: Band) -> (Counted, usize) {
        let (high, low) = (_mm256_set1_ps(band.high), _mm256_set1_ps(band.low));
        let (mut all0, mut all1) = (_mm256_setzero_pd(), _mm256_setzero_pd());
        let mut above_tokens = 0;
        let zero = (_mm256_setzero_pd(), _mm256_setzero_pd());
        let group = |l: *const f32,
                     e: *const f32,
                     at: usize,
                     acc: &mut (__m256d, __m256d),
                     slots: &mut [u16]| {
            // SAFETY: `chunks_with` passes pointers to 8 f32.
            let (l, e) = unsafe { (_mm256_loadu_ps(l), _mm256_loadu_ps(e)) };
            let above = _mm256_cmp_ps::<_CMP_GE_OQ>(l, high);
            let at_least_low = _mm256_cmp_ps::<_CMP_GE_OQ>(l, low);
            all0 = _mm256_add_pd(all0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            all1 = _mm256_add_pd(all1, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(e)));
            let e = _mm256_and_ps(e, above);
            acc.0 = _mm256_add_pd(acc.0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            acc.1 = _mm256_add_pd(acc.1, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(e)));
            let above = _mm256_movemask_ps(above) as u32;
            above_tokens += above.count_ones() as usize;
            let in_band = (_mm256_movemask_ps(at_least_low) as u32 & !above) as usize;
            // The band lanes' indices packed to the front, widened to words, plus `at`: their
            // offsets (a step's fit words).
            let lanes = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(PACK8[in_band] as i64));
            let words = _mm_add_epi16(lanes, _mm_set1_epi16(at as u16 as i16));
            let slots = &mut slots[..8];
            // SAFETY: the slice holds 8 words; unaligned stores are allowed.
            unsafe { _mm_storeu_si128(slots.as_mut_ptr().cast(), words) };
            in_band.count_ones() as usize
        };
        let finish = |(acc0, acc1)| reduce4(_mm256_add_pd(acc0, acc1));
        let (mut counted, listed) = chunks_with::<8, _>(step, zero, group, finish);
        counted.above_tokens = above_tokens;
        counted.row = reduce4(_mm256_add_pd(all0, all1));
        (counted, listed)
    }
}

/// The last kept token in rank order: every token with a larger key is kept, and those with the
/// same key up to this id.
#[derive(Clone, Copy, Debug)]
struct Threshold {
    key: u32,
    id: u32,
}

impl Threshold {
    /// Whether the token of rank key `key` and id `id` is kept: `key > self.key`, or the same key
    /// and `id <= self.id`. Tested as one compare of `key` and the id's complement packed in a
    /// u64 (lexicographic order), so that no branch is taken on the first compare: in id order
    /// it goes either way for about half the band.
    #[inline(always)]
    fn keeps(&self, key: u32, id: u32) -> bool {
        let packed = |key: u32, id: u32| (u64::from(key) << 32) | u64::from(!id);
        packed(key, id) >= packed(self.key, self.id)
    }
}

/// The exact threshold among the band's tokens, given the stored estimates' sums of the row and
/// of the tokens above the band. A histogram of the band's rank keys weighted by the estimates
/// gives the bins where the threshold may lie; only their tokens are weighed exactly and put in
/// rank order.
fn threshold_in_band(
    values: &[f32],
    lanes: &RowLanes,
    s: &mut Scratch,
    (row, above): (Masses, Masses),
    split: Split,
) -> InBand {
    let (band, histogram) = (&s.band, &s.histogram);
    if band.is_empty() {
        return InBand::Below;
    }
    // From the top bin down: the first bin after which the target may be reached, to the first
    // after which it certainly is.
    let mut kept = above;
    let (mut first, mut last) = (None, None);
    // Bins that end below the target by twice the row's error certainly fall short (see
    // `Split::skips`): a plain add and compare each, the bounds only near the target.
    let skip_below = split.skips(row.bounds());
    for b in (0..histogram.bins.len()).rev() {
        let (mass, count) = histogram.bins[b];
        let through = kept.plus(Masses {
            total: mass,
            tokens: count as usize,
        });
        if through.total < skip_below {
            kept = through;
            continue;
        }
        let (c, n) = (through.bounds(), row.less(through).bounds());
        if first.is_none() && !split.certainly_not(c, n) {
            first = Some((b, kept));
        }
        if first.is_some() && split.certainly(c, n) {
            last = Some(b);
            break;
        }
        kept = through;
    }
    let (Some((top, base)), Some(bottom)) = (first, last) else {
        return InBand::Below;
    };
    // The least key above the region's bins (saturated: no finite logit's key is that high).
    let floor = histogram.keys(top + 1);
    // The tokens of those bins, weighed exactly, in rank order.
    s.region.clear();
    let mut region = Masses::default();
    // The keys of those bins (every band key is at least the histogram's low key), `least ..
    // floor`, tested as one unsigned compare `key − least < width`: a range's `contains` is two
    // compares branched on the first, which in id order goes either way for about half a wide
    // band (the profile put kept~100k's 26–29 µs here, on mispredicted branches).
    let least = histogram.keys(bottom);
    let width = floor.wrapping_sub(least);
    for t in band.iter().filter(|t| t.key.wrapping_sub(least) < width) {
        s.region.push((t.key, t.id, 0));
        region = region.plus(Masses {
            total: f64::from(t.estimate),
            tokens: 1,
        });
    }
    let logits: Vec<f32> = s
        .region
        .iter()
        .map(|&(_, id, _)| values[id as usize])
        .collect();
    let mut weights = vec![0u64; logits.len()];
    exact_weights(&logits, lanes, &mut weights);
    for (entry, &w) in s.region.iter_mut().zip(&weights) {
        entry.2 = w;
    }
    s.region
        .sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let region_exact: u64 = weights.iter().sum();
    // Kept: the tokens before the region (estimated) and a prefix of it (exact); not kept: the
    // rest of the row (estimated) and the rest of the region (exact).
    let (head, tail) = (base.bounds(), row.less(base).less(region).bounds());
    let tail = tail.plus(Bounds::exact(region_exact));
    match walk_region(&s.region, head, tail, split) {
        Walk::Found(threshold) => InBand::Found(threshold),
        Walk::Open => InBand::Open(floor),
    }
}

/// What the walk through the region finds.
enum Walk {
    Found(Threshold),
    Open,
}

/// The first token of `region` (exact weights, rank order) at which the kept mass reaches the
/// target: `head` is the mass ranked before the region, `rest` the mass of the region and of
/// everything ranked after it.
fn walk_region(region: &[(u32, u32, u64)], head: Bounds, rest: Bounds, split: Split) -> Walk {
    let mut exact = 0u64;
    for &(key, id, w) in region {
        if w == 0 {
            continue;
        }
        exact += w;
        let kept = head.plus(Bounds::exact(exact));
        let rest = Bounds {
            value: rest.value - exact as f64,
            error: rest.error,
        };
        if split.certainly(kept, rest) {
            return Walk::Found(Threshold { key, id });
        }
        if !split.certainly_not(kept, rest) {
            return Walk::Open;
        }
    }
    // Unreachable when the region's last bin certainly reaches the target.
    Walk::Open
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::lcg::Lcg;

    /// Normal logits N(0, σ²) with a few hostile values.
    pub(super) fn normal_row(lcg: &mut Lcg, v: usize, sigma: f32) -> Vec<f32> {
        (0..v)
            .map(|_| {
                let (u, w) = (lcg.unit().max(1e-7), lcg.unit());
                sigma * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * w).cos()
            })
            .collect()
    }

    /// Rows that mislead the strided sample placing the band, so that the band misses the
    /// threshold and is widened: `below`, the sampled runs hold near-zero weights, one token at
    /// logit 6 each and one token at 4, the rest of the row normal logits (the sample sees almost
    /// no mass below 6, the threshold lies in the normal bulk below the band); `above`, the sampled runs hold logit 3,
    /// and 256 tokens off the runs logit 8 (the sample sees no heavy tokens, the threshold lies
    /// among them, above the band). The token is still the exact path's: top-k `V − 1` on a row
    /// whose last-ranked token (−inf) weighs 0 keeps the same tokens as no top-k, and takes the
    /// path that weighs every token exactly. `below` takes the first pass's total (the sample
    /// does not pin it), `above` the levels (its sample is uniform): a miss on each path.
    #[test]
    fn a_band_the_sample_misplaced_is_widened() {
        let mut lcg = Lcg(11);
        let v = 65_536;
        let runs = SAMPLES / SAMPLE_RUN;
        let step = v / runs;
        let sampled = |i: usize| i % step < SAMPLE_RUN;
        let below: Vec<f32> = normal_row(&mut lcg, v, 1.0)
            .iter()
            .enumerate()
            .map(|(i, &l)| match (i, i % step) {
                (1, _) => 4.0,
                (_, 0) => 6.0,
                (_, j) if j < SAMPLE_RUN => -30.0,
                _ => l,
            })
            .collect();
        let mut above: Vec<f32> = (0..v)
            .map(|i| if sampled(i) { 3.0 } else { -30.0 })
            .collect();
        for run in 0..runs {
            above[run * step + SAMPLE_RUN + 7] = 8.0 + 0.01 * lcg.unit();
            above[run * step + SAMPLE_RUN + 300] = 8.0 - 0.01 * lcg.unit();
        }
        for (name, mut row) in [("below", below), ("above", above)] {
            row[SAMPLE_RUN + 1] = f32::NEG_INFINITY;
            let lanes = lanes_of(&row, 1.0);
            let pinned = Sample::of(&lanes, &row, &mut Vec::new());
            let levels = pinned.spread() <= CONFIDENT * pinned.total;
            assert_eq!(levels, name == "above", "{name}: the path");
            let (mut decided, mut cases) = (0, 0);
            let before = BAND_MISSES.with(|m| m.get());
            for top_p in [0.9f32, 0.5] {
                for i in 0..4u64 {
                    let r = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let exact = super::super::sample_logit_row(&row, 1.0, v as i32 - 1, top_p, r);
                    if let Some(token) = sample(&row, 1.0, top_p, r, RowHints::default()) {
                        assert_eq!(token, exact, "{name}, top_p {top_p}, r {r}");
                        decided += 1;
                    }
                    cases += 1;
                }
            }
            let misses = BAND_MISSES.with(|m| m.get()) - before;
            assert!(misses >= cases, "{name}: {misses} misses in {cases} rows");
            assert!(
                decided * 10 >= cases * 9,
                "{name}: decided {decided} of {cases}"
            );
        }
    }

    /// The band the first pass's levels leave: its ends move to the levels whose rough mass is
    /// short of or past the target by [`LEVEL_SLACK`]; a level whose mass is the target (or
    /// within the slack of it) bounds nothing, so the band keeps the slices on both sides of it;
    /// equal masses, levels out of order and NaN levels (a band too narrow to cut) are handled.
    #[test]
    fn the_levels_narrow_the_band_only_where_their_masses_are_clear() {
        let band = Band {
            low: 0.0,
            high: 4.0,
        };
        let levels = [3.0, 2.0, 1.0];
        let (total, p) = (1000.0, top_p_fixed(0.5)); // the target: 500
        let slack = LEVEL_SLACK * total;
        let ends = |masses: [f64; LEVELS]| {
            let b = band.narrowed(&levels, &masses, total, p);
            (b.low, b.high)
        };
        assert_eq!(ends([100.0, 300.0, 800.0]), (1.0, 2.0));
        assert_eq!(
            ends([100.0, 500.0, 800.0]),
            (1.0, 3.0),
            "a mass on the target"
        );
        assert_eq!(ends([100.0, 500.0 + slack / 2.0, 800.0]), (1.0, 3.0));
        assert_eq!(ends([100.0, 500.0 - slack / 2.0, 800.0]), (1.0, 3.0));
        assert_eq!(ends([100.0, 500.0 + 2.0 * slack, 800.0]), (2.0, 3.0));
        assert_eq!(ends([100.0, 100.0, 800.0]), (1.0, 2.0), "equal masses");
        assert_eq!(ends([600.0, 600.0, 800.0]), (3.0, 4.0), "all past");
        assert_eq!(ends([1.0, 2.0, 3.0]), (0.0, 1.0), "all short");
        assert_eq!(ends([800.0, 100.0, 100.0]), (0.0, 4.0), "out of order");
        let uncut = band.narrowed(&[f32::NAN; LEVELS], &[0.0, 0.0, 1000.0], total, p);
        assert_eq!((uncut.low, uncut.high), (0.0, 4.0), "NaN levels");
        // Levels cut the band (clamped to the row) strictly inside it, or are NaN.
        let lanes = RowLanes::new(5.0, row_scale(1.0), true).expect("lanes");
        assert_eq!(band.levels(&lanes), levels);
        let whole = Band {
            low: -f32::MAX,
            high: f32::INFINITY,
        };
        let cut = whole.levels(&lanes);
        assert!(cut[0] < 5.0 && cut[2] > 5.0 - lanes.dcap, "{cut:?}");
        let thin = Band {
            low: 1.0,
            high: 1.0f32.next_up(),
        };
        assert!(thin.levels(&lanes).iter().all(|l| l.is_nan()));
    }

    /// The sample pins the total of rows whose mass is spread over many tokens (the rows
    /// `tests/shaped_rows.rs` narrows at the levels: σ 0.874 at T 1, σ 0.0437 at T 0.05, plain
    /// or rounded to eighths) and not of rows where a few heavy tokens carry it (σ 3, σ 3.5 at
    /// T 0.8): those take the first pass's total.
    #[test]
    fn the_sample_pins_the_total_of_spread_rows_only() {
        let mut lcg = Lcg(47);
        let mut s = Scratch::default();
        let shapes = [
            (0.874f32, 1.0f32, true),
            (0.0437, 0.05, true),
            (3.0, 1.0, false),
            (3.5, 0.8, false),
        ];
        for (v, (sigma, t, pinned)) in [65_536, 151_936]
            .into_iter()
            .flat_map(|v| shapes.map(|shape| (v, shape)))
        {
            for eighths in [false, true] {
                let mut row = normal_row(&mut lcg, v, sigma);
                if eighths {
                    row.iter_mut().for_each(|l| *l = (*l * 8.0).round() / 8.0);
                }
                let lanes = lanes_of(&row, t);
                let sample = Sample::of(&lanes, &row, &mut s.sampled);
                let spread = sample.spread() / sample.total;
                assert_eq!(
                    spread <= CONFIDENT,
                    pinned,
                    "{v}: σ {sigma}, T {t}: {spread}"
                );
            }
        }
    }

    /// Rows with large groups of tokens exactly on the levels (and one f32 step either side), the
    /// top-p threshold inside a group, on its first or its last token, or just past it, with NaN
    /// and −inf among them, at T 1 and 0.05: the band the levels narrow gives the exact path's
    /// token; and whole bf16 rows (ties everywhere) too.
    #[test]
    fn thresholds_on_the_levels_sample_as_the_exact_path() {
        let mut lcg = Lcg(43);
        let v = 65_536;
        let mut narrowed = 0;
        for (t, sigma) in [(1.0f32, 1.5f32), (0.05, 0.08)] {
            let mut row = normal_row(&mut lcg, v, sigma);
            // The band [0, 4σ) below the maximum (4.5σ), its levels at about 3σ, 2σ and σ;
            // groups on and beside them.
            row[20] = 4.5 * sigma;
            let band = Band {
                low: 0.0,
                high: 4.0 * sigma,
            };
            let lanes = lanes_of(&row, t);
            let levels = band.levels(&lanes);
            assert!((levels[0] - 3.0 * sigma).abs() < 1e-5, "{levels:?}");
            for (i, l) in row.iter_mut().enumerate().skip(64) {
                let level = levels[i % LEVELS];
                *l = match i % 23 {
                    0..=2 => level,
                    3 => level.next_up(),
                    4 => level.next_down(),
                    _ => *l,
                };
            }
            row[5] = f32::NAN;
            row[9] = f32::NEG_INFINITY;
            let (raw_max, clean) = max_and_clean(&row);
            assert!(!clean);
            let lanes = RowLanes::new(sanitize_logit(raw_max), row_scale(t), clean).expect("lanes");
            assert_eq!(band.levels(&lanes), levels);
            // The share of the row's weight at or above `x` (f64: close to the exact one).
            let weight = |l: f32| f64::from((l - raw_max) / t).exp();
            let total: f64 = row.iter().filter(|l| !l.is_nan()).map(|&l| weight(l)).sum();
            let share = |x: f32, strict: bool| {
                let kept = |l: f32| if strict { l > x } else { l >= x };
                row.iter()
                    .filter(|&&l| kept(l))
                    .map(|&l| weight(l))
                    .sum::<f64>()
                    / total
            };
            let mut shares = Vec::new();
            for &level in &levels {
                let (above, through) = (share(level, true), share(level, false));
                shares.extend([above, (above + through) / 2.0, through, through + 1e-6]);
            }
            let passes = Passes::unhinted(&row, lanes, Segments::of(row.len(), 1));
            let mut s = Scratch::default();
            let mut decided = 0;
            for &top_p in &shares {
                let top_p = (top_p as f32).clamp(0.01, 0.999);
                let p = top_p_fixed(top_p);
                let (total, masses) = passes.estimate_tokens(&mut s.estimates, &levels);
                let cut = band.narrowed(&levels, &masses, total, p);
                narrowed += usize::from(cut.low > band.low || cut.high < band.high);
                for i in 0..4u64 {
                    let r = (i + 3).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let exact = super::super::sample_logit_row(&row, t, v as i32 - 1, top_p, r);
                    if let Some(token) = sample_in_band(&passes, p, r, &mut s, band) {
                        assert_eq!(token, exact, "T {t}, top_p {top_p}, r {r}");
                        decided += 1;
                    }
                }
            }
            assert!(
                decided * 10 >= shares.len() * 4 * 9,
                "T {t}: decided {decided}"
            );
            // The whole path on the row as bf16.
            let half: Vec<half::bf16> = row.iter().map(|&l| half::bf16::from_f32(l)).collect();
            for top_p in [0.5f32, 0.9, 0.95] {
                for r in [7u64, 1 << 63, u64::MAX] {
                    let exact = super::super::sample_logit_row(&half, t, v as i32 - 1, top_p, r);
                    if let Some(token) = sample(&half, t, top_p, r, RowHints::default()) {
                        assert_eq!(token, exact, "bf16, T {t}, top_p {top_p}, r {r}");
                    }
                }
            }
        }
        assert!(narrowed >= 8, "the levels narrowed {narrowed} bands");
    }

    /// The packed compare of `Threshold::keeps` is the rank order's test (a larger key, or the
    /// same key and an id at most the threshold's), at the extremes of keys and ids.
    #[test]
    fn keeps_is_the_rank_order_test() {
        let mut lcg = Lcg(17);
        let edges = [
            0u32,
            1,
            2,
            0x7fff_ffff,
            0x8000_0000,
            0x8000_0001,
            u32::MAX - 1,
            u32::MAX,
        ];
        let mut values: Vec<u32> = edges.to_vec();
        values.extend((0..24).map(|_| lcg.next_u64() as u32));
        for &(tk, ti) in &[
            (0x8000_0000, 5),
            (0, 0),
            (u32::MAX, u32::MAX),
            (0x9abc_def0, 0),
        ] {
            let threshold = Threshold { key: tk, id: ti };
            for &key in values
                .iter()
                .chain(&[tk, tk.wrapping_add(1), tk.wrapping_sub(1)])
            {
                for &id in values
                    .iter()
                    .chain(&[ti, ti.wrapping_add(1), ti.wrapping_sub(1)])
                {
                    let expected = key > tk || (key == tk && id <= ti);
                    assert_eq!(
                        threshold.keeps(key, id),
                        expected,
                        "{key:#x} {id} vs {tk:#x} {ti}"
                    );
                }
            }
        }
    }

    /// `sums_above` (compiled for this CPU's vector unit) gives the scalar sums, on NaN, signed
    /// zeros, infinities and raw bit patterns, at floors from 0 to the largest key.
    #[test]
    fn sums_above_are_the_scalar_sums() {
        let mut lcg = Lcg(91);
        let specials = [
            f32::NAN,
            -0.0,
            0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -1.5,
            2.25,
        ];
        for floor in [
            0,
            1,
            key_select(-1.5),
            key_select(0.0),
            key_select(2.25),
            u32::MAX,
        ] {
            for n in [0, 1, 7, 255, 256] {
                let chunk: Vec<f32> = (0..n)
                    .map(|i| match i % 3 {
                        0 => specials[i % specials.len()],
                        _ => f32::from_bits(lcg.next_u64() as u32),
                    })
                    .collect();
                let weights: Vec<u64> = (0..n).map(|_| lcg.next_u64() >> 24).collect();
                let all: u64 = weights.iter().sum();
                let above: u64 = chunk
                    .iter()
                    .zip(&weights)
                    .filter(|&(&l, _)| key_select(l) >= floor)
                    .map(|(_, &w)| w)
                    .sum();
                assert_eq!(sums_above(&chunk, &weights, floor), (all, above));
            }
        }
    }

    /// `kept_estimate` gives the bits of the product it replaced (the estimate widened, times
    /// 1.0 or 0.0) for the estimates a row stores: zero, subnormal, ordinary and the largest.
    #[test]
    fn kept_estimate_is_the_product_it_replaced() {
        let mut lcg = Lcg(23);
        let mut estimates = vec![0.0f32, f32::from_bits(1), f32::MIN_POSITIVE, 1.0, f32::MAX];
        estimates.extend((0..64).map(|_| f32::from_bits(lcg.next_u64() as u32 & 0x7f7f_ffff)));
        for e in estimates {
            for keeps in [false, true] {
                let product = f64::from(u8::from(keeps)) * f64::from(e);
                assert_eq!(
                    kept_estimate(keeps, e).to_bits(),
                    product.to_bits(),
                    "{e} {keeps}"
                );
            }
        }
    }

    /// The vector classify loops (listing each step of [`LIST_STEP`] tokens after its loop) find
    /// the same band tokens, histogram counts, tokens above the band and per-chunk masses (up to
    /// the order of the f64 sums) as the token-by-token loop, on rows whose band tokens sit at
    /// every step and chunk edge, with NaN and infinities among them, split in one and two parts.
    #[test]
    fn the_vector_classify_lists_what_the_scalar_one_does() {
        let mut lcg = Lcg(31);
        let v = 3 * LIST_STEP + 5 * CHUNK + 17;
        let mut row = normal_row(&mut lcg, v, 2.0);
        for edge in (0..v).step_by(CHUNK) {
            for at in [edge.saturating_sub(1), edge, edge + 1] {
                row[at.min(v - 1)] = 0.5 + 0.001 * (at % 7) as f32;
            }
        }
        // Whole groups and a whole step's first chunk in the band (every lane packed).
        for at in (LIST_STEP..LIST_STEP + CHUNK).chain(40..104) {
            row[at] = 0.75;
        }
        let max = row.iter().copied().fold(f32::MIN, f32::max);
        for (at, value) in [
            (3, f32::NAN),
            (LIST_STEP, f32::NAN),
            (11, f32::NEG_INFINITY),
        ] {
            row[at] = value;
        }
        let lanes = RowLanes::new(max, row_scale(1.0), true).expect("lanes");
        let mut estimates = vec![0.0f32; v];
        estimate_store(&row, &lanes, &mut estimates);
        let band = Band {
            low: 0.25,
            high: 1.5,
        };
        // `None`: the scalar loop.
        let run = |parts: usize, vector: Option<StepLoop>| {
            let (mut tokens, mut histogram) = (Vec::new(), Histogram::default());
            histogram.span(band, f32::INFINITY);
            let mut masses = vec![0.0; v.div_ceil(CHUNK)];
            let mut found = Found {
                tokens: &mut tokens,
                histogram: &mut histogram,
            };
            // Parts of whole chunks, as `Segments` cuts long rows.
            let len = v.div_ceil(parts).div_ceil(CHUNK) * CHUNK;
            let mut counted = Counted::default();
            for (i, part) in row.chunks(len).enumerate() {
                let at = i * len;
                let (ests, masses) = (&estimates[at..], &mut masses[at / CHUNK..]);
                let full = part.len() / CHUNK * CHUNK;
                let (head, tail) = part.split_at(full);
                let (m_head, m_tail) = masses.split_at_mut(full / CHUNK);
                let step = match vector {
                    Some(step_loop) => {
                        classify_steps(step_loop, head, ests, at, band, m_head, &mut found)
                    }
                    None => classify_chunks(head, ests, at, band, m_head, &mut found),
                };
                let rest =
                    classify_chunks(tail, &ests[full..], at + full, band, m_tail, &mut found);
                counted = counted.plus(step).plus(rest);
            }
            let listed: Vec<_> = tokens
                .iter()
                .map(|t| (t.key, t.id, t.estimate.to_bits()))
                .collect();
            let counts: Vec<u32> = histogram.bins.iter().map(|b| b.1).collect();
            (listed, counts, counted.above_tokens, masses)
        };
        let scalar = run(1, None);
        assert!(
            scalar.0.len() > 3 * v / CHUNK,
            "band of {} tokens",
            scalar.0.len()
        );
        let loops: Vec<StepLoop> = step_loops().into_iter().flatten().collect();
        println!("{} vector loops on this CPU", loops.len());
        for (l, &step_loop) in loops.iter().enumerate() {
            for parts in [1, 2] {
                let vector = run(parts, Some(step_loop));
                let at = format!("loop {l}, {parts} parts");
                assert_eq!(vector.0, scalar.0, "{at}: band tokens");
                assert_eq!(vector.1, scalar.1, "{at}: histogram counts");
                assert_eq!(vector.2, scalar.2, "{at}: tokens above the band");
                for (c, (a, b)) in vector.3.iter().zip(&scalar.3).enumerate() {
                    assert!(
                        (a - b).abs() <= a.abs() * 1e-12,
                        "{at}, chunk {c}: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// The one- and two-section paths of a top_p = 1 row split in two agree bit for bit: the
    /// row's constants and every chunk estimate, on normal rows and on rows with NaN, infinities
    /// or huge values in either half; and `sample` gives the same token on one and two parts.
    #[test]
    fn the_fused_section_matches_two_sections() {
        let mut lcg = Lcg(21);
        let v = 40_000;
        let mut rows = vec![normal_row(&mut lcg, v, 3.0), normal_row(&mut lcg, v, 0.5)];
        for (at, value) in [
            (5, f32::NAN),
            (v - 3, f32::NAN),
            (v - 1, f32::INFINITY),
            (7, f32::NEG_INFINITY),
            (v / 2 + 100, 1e30),
            (30_000, 80.0),
        ] {
            let mut row = normal_row(&mut lcg, v, 3.0);
            row[at] = value;
            rows.push(row);
        }
        // The maximum in the second half only, and equal maxima in both.
        let mut row = vec![-2.0f32; v];
        row[v - 10] = 4.0;
        rows.push(row.clone());
        row[10] = 4.0;
        rows.push(row);
        for (i, row) in rows.iter().enumerate() {
            let segments = Segments::of(row.len(), 2);
            assert_eq!(segments.count, 2);
            let (raw_max, clean) = segments.max_and_clean(row);
            let two = RowLanes::new(sanitize_logit(raw_max), row_scale(0.7), clean);
            let mut fused_masses = Vec::new();
            let one = fused::max_then_chunks(row, 0.7, segments, &[], &mut fused_masses);
            assert_eq!(one, two, "row {i}: constants");
            if let Some(lanes) = two {
                let passes = Passes::unhinted(row, lanes, segments);
                let mut masses = Vec::new();
                passes.estimate_chunks(&mut masses);
                let bits = |m: &[f64]| m.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&fused_masses),
                    bits(&masses),
                    "row {i}: chunk estimates"
                );
            }
            for r in [0, 1 << 63, u64::MAX, lcg.next_u64()] {
                let hints = |parts| RowHints { parts, next: &[] };
                assert_eq!(
                    sample(row, 0.7, 1.0, r, hints(2)),
                    sample(row, 0.7, 1.0, r, hints(1)),
                    "row {i}, r {r}"
                );
            }
        }
    }

    /// The least wall time of `reps` calls of `f` (after one to warm it), in µs: a loaded
    /// machine preempts some calls, not all.
    /// The lanes of `row` at temperature `t` (its maximum and cleanliness from one pass).
    fn lanes_of(row: &[f32], t: f32) -> RowLanes {
        let (raw_max, clean) = max_and_clean(row);
        RowLanes::new(sanitize_logit(raw_max), row_scale(t), clean).expect("lanes")
    }

    fn least_us(reps: usize, f: &mut dyn FnMut()) -> f64 {
        f();
        let mut ns = f64::INFINITY;
        for _ in 0..reps {
            let start = std::time::Instant::now();
            f();
            ns = ns.min(start.elapsed().as_secs_f64() * 1e9);
        }
        ns / 1e3
    }

    /// The pieces of one warm batch-1 top_p = 1 row split over two threads, least wall time of
    /// many calls each, with random draws (run with `--ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn row_times() {
        let mut lcg = Lcg(9);
        let mut rows = vec![("flat", normal_row(&mut lcg, 151_936, 3.0))];
        // A row whose mass is spread over ~100k tokens (nearly flat logits).
        rows.push(("sigma 0.87", normal_row(&mut lcg, 151_936, 0.874)));
        let reps = 400;
        let least = |f: &mut dyn FnMut()| least_us(reps, f);
        println!(
            "empty rayon::join: {:.1} µs",
            least(&mut || {
                rayon::join(|| std::hint::black_box(1), || std::hint::black_box(2));
            })
        );
        for (name, row) in &rows {
            let segments = Segments::of(row.len(), 2);
            let max_pass = least(&mut || {
                std::hint::black_box(segments.max_and_clean(row));
            });
            let lanes = lanes_of(row, 1.0);
            let passes = Passes::unhinted(row, lanes, segments);
            let mut masses = Vec::new();
            let estimate_pass = least(&mut || passes.estimate_chunks(&mut masses));
            let fused_pass = least(&mut || {
                std::hint::black_box(fused::max_then_chunks(row, 1.0, segments, &[], &mut masses));
            });
            let mut draw_ns = f64::INFINITY;
            let mut draw_worst = 0.0f64;
            for _ in 0..reps {
                let r = lcg.next_u64();
                let start = std::time::Instant::now();
                let token = draw_by_chunks(row, &lanes, &masses, ESTIMATED, r, |_, _| true);
                let us = start.elapsed().as_secs_f64() * 1e6;
                std::hint::black_box(token);
                draw_ns = draw_ns.min(us);
                draw_worst = draw_worst.max(us);
            }
            let mut whole = |parts: usize| {
                let mut best = f64::INFINITY;
                for _ in 0..reps {
                    let r = lcg.next_u64();
                    let hints = RowHints { parts, next: &[] };
                    let start = std::time::Instant::now();
                    std::hint::black_box(sample(row, 1.0, 1.0, r, hints));
                    best = best.min(start.elapsed().as_secs_f64() * 1e6);
                }
                best
            };
            let (one, two) = (whole(1), whole(2));
            println!(
                "{name}: max section {max_pass:.1} µs, estimate section {estimate_pass:.1} µs, \
                 fused section {fused_pass:.1} µs, draw {draw_ns:.1} µs (worst {draw_worst:.1}), \
                 sample on 1 thread {one:.1} µs, on 2 (fused) {two:.1} µs"
            );
        }
    }

    /// This thread's CPU time in ns (Linux), or wall time elsewhere.
    fn cpu_ns() -> u64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// The CPU time of each pass over one warm row (run with `--ignored --nocapture`;
    /// `SPECULA_PROBE_SIGMA` the spread of its logits, 3 unless set): what a loaded machine cannot
    /// hide.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn pass_costs() {
        let mut lcg = Lcg(9);
        let sigma: f32 = probe_setting("SPECULA_PROBE_SIGMA", 3.0);
        let row = normal_row(&mut lcg, 151_936, sigma);
        let lanes = RowLanes::new(
            row.iter().copied().fold(f32::MIN, f32::max),
            row_scale(1.0),
            true,
        )
        .expect("lanes");
        let mut masses = vec![0.0; row.len() / CHUNK + 1];
        let mut stored = vec![0.0f32; row.len()];
        let mut exact = vec![0u64; row.len()];
        let mut band = Vec::new();
        let (band_lo, band_hi) = (6.0, 6.5);
        let reps = 200;
        let time = |name: &str, f: &mut dyn FnMut()| {
            let us = least_us(reps, f);
            println!(
                "{name:<22} {us:>8.1} µs/row {:>6.3} ns/token",
                us * 1e3 / row.len() as f64
            );
        };
        time("read (sum)", &mut || {
            std::hint::black_box(row.iter().map(|x| x.to_bits() as u64).sum::<u64>());
        });
        time("max_and_clean", &mut || {
            std::hint::black_box(max_and_clean(std::hint::black_box(&row)));
        });
        time("estimate_block_sums", &mut || {
            std::hint::black_box(estimate_block_sums(&row, &lanes, &mut masses));
        });
        time("estimate_store", &mut || {
            std::hint::black_box(estimate_store(&row, &lanes, &mut stored));
        });
        time("classify", &mut || {
            band.clear();
            let b = Band {
                low: band_lo,
                high: band_hi,
            };
            let mut histogram = Histogram::default();
            histogram.span(b, f32::INFINITY);
            let found = Found {
                tokens: &mut band,
                histogram: &mut histogram,
            };
            std::hint::black_box(classify_part(&row, &stored, 0, b, &mut masses, found));
        });
        time("exact_weights", &mut || {
            exact_weights(&row, &lanes, &mut exact);
            std::hint::black_box(&exact);
        });
        println!("band tokens: {}", band.len());
        let mut scratch = Scratch::default();
        time("sample", &mut || {
            std::hint::black_box(Sample::of(&lanes, &row, &mut scratch.sampled));
        });
        let passes = Passes::unhinted(&row, lanes, Segments::of(row.len(), 1));
        let mut s = Scratch::default();
        time("sample_top_p (all)", &mut || {
            std::hint::black_box(sample_top_p(&passes, top_p_fixed(0.9), 7, &mut s));
        });
        time("sample_whole (all)", &mut || {
            std::hint::black_box(sample_whole(&passes, 7, &mut s, true));
        });
    }

    /// The whole top-p stage after the maximum (`sample_top_p`) on one warm row per bench shape,
    /// the mean of many calls with fresh draws, one thread (run with `--ignored --nocapture`;
    /// `SPECULA_PROBE_CALLS`, 3000). `top_p_stage_costs`' `all` (the least of 100 calls inside
    /// that probe) moved by 10–30 µs between builds of the same code; this mean did not.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn top_p_whole_costs() {
        let calls: usize = probe_setting("SPECULA_PROBE_CALLS", 3000);
        let mut lcg = Lcg(9);
        for (name, sigma, t) in BENCH_SHAPES {
            let row = normal_row(&mut lcg, 151_936, sigma);
            let lanes = lanes_of(&row, t);
            let passes = Passes::unhinted(&row, lanes, Segments::of(row.len(), 1));
            let mut s = Scratch::default();
            let p = top_p_fixed(0.9);
            let start = std::time::Instant::now();
            for _ in 0..calls {
                std::hint::black_box(sample_top_p(&passes, p, lcg.next_u64(), &mut s));
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / calls as f64;
            println!("{name:<16} top-p 0.9, whole stage: {us:5.1} µs a call");
        }
    }

    /// The row shapes of `specula bench` as normal logits rows: name, σ of the logits, temperature.
    const BENCH_SHAPES: [(&str, f32, f32); 7] = [
        ("sigma 3.5 T 0.8", 3.5, 0.8),
        ("flat", 3.0, 1.0),
        ("kept~10", 5.1, 1.0),
        ("kept~100", 4.49, 1.0),
        ("kept~1k", 3.76, 1.0),
        ("kept~10k", 2.79, 1.0),
        ("kept~100k", 0.874, 1.0),
    ];

    /// How wide the bands are, how often they miss and how often the bounds leave a decision to
    /// the exact pass (and what a row with one costs), per bench shape, one thread, warm
    /// (`SPECULA_PROBE_ROWS`, `SPECULA_PROBE_P`).
    #[test]
    #[ignore]
    fn band_widths() {
        let rows_n: usize = probe_setting("SPECULA_PROBE_ROWS", 200);
        let top_p: f32 = probe_setting("SPECULA_PROBE_P", 0.9);
        let mut lcg = Lcg(77);
        for (name, sigma, t) in BENCH_SHAPES {
            let rows: Vec<Vec<f32>> = (0..rows_n)
                .map(|_| normal_row(&mut lcg, 151_936, sigma))
                .collect();
            BAND_TOKENS.with(|b| b.set((0, 0)));
            let misses0 = BAND_MISSES.with(|m| m.get());
            let exact0 = EXACT_PASSES.load(std::sync::atomic::Ordering::Relaxed);
            let hints = RowHints {
                parts: 1,
                next: &[],
            };
            let start = std::time::Instant::now();
            let (mut with_exact, mut n_exact) = (0.0, 0);
            for (i, r) in rows.iter().enumerate() {
                let e0 = EXACT_PASSES.load(std::sync::atomic::Ordering::Relaxed);
                let t0 = std::time::Instant::now();
                std::hint::black_box(sample(
                    r,
                    t,
                    top_p,
                    (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    hints,
                ));
                if EXACT_PASSES.load(std::sync::atomic::Ordering::Relaxed) > e0 {
                    with_exact += t0.elapsed().as_secs_f64() * 1e6;
                    n_exact += 1;
                }
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / rows_n as f64;
            println!(
                "  rows with an exact pass: {n_exact}, {:.1} us each",
                with_exact / n_exact.max(1) as f64
            );
            let (tokens, passes) = BAND_TOKENS.with(|b| b.get());
            let misses = BAND_MISSES.with(|m| m.get()) - misses0;
            let exact = EXACT_PASSES.load(std::sync::atomic::Ordering::Relaxed) - exact0;
            println!(
                "{name:16} band {:7.0} tokens/pass  passes/row {:.3} misses {misses} exact {exact}  {us:6.1} us/row",
                tokens as f64 / passes.max(1) as f64,
                passes as f64 / rows_n as f64
            );
        }
    }

    /// What the exact pass costs a row: its exact weights alone, and `exact_above` (the weights
    /// and their sums), one thread, warm.
    #[test]
    #[ignore]
    fn exact_costs() {
        let mut lcg = Lcg(78);
        for (name, sigma, t) in BENCH_SHAPES {
            let row = normal_row(&mut lcg, 151_936, sigma);
            let lanes = lanes_of(&row, t);
            let mut masses = vec![0.0; row.len().div_ceil(CHUNK)];
            let mut w = vec![0u64; CHUNK];
            let weights_only = least_us(200, &mut || {
                for chunk in row.chunks(CHUNK) {
                    exact_weights(chunk, &lanes, &mut w[..chunk.len()]);
                    std::hint::black_box(&w);
                }
            });
            let above = least_us(200, &mut || {
                std::hint::black_box(exact_above(&row, &lanes, key_select(0.0), &mut masses));
            });
            println!("{name:16} exact weights {weights_only:6.1} us, exact_above {above:6.1} us");
        }
    }

    /// A probe's setting from the environment variable `name`, else `default`.
    fn probe_setting<T: std::str::FromStr>(name: &str, default: T) -> T {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// The stages of one warm top_p 0.9 row on one thread, per row shape of `specula bench`,
    /// least wall time of many calls each (run with `--ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn top_p_stage_costs() {
        let mut lcg = Lcg(9);
        let reps = 100;
        let least = |f: &mut dyn FnMut()| least_us(reps, f);
        let p = top_p_fixed(0.9);
        for (name, sigma, t) in BENCH_SHAPES {
            let row = normal_row(&mut lcg, 151_936, sigma);
            let lanes = lanes_of(&row, t);
            let passes = Passes::unhinted(&row, lanes, Segments::of(row.len(), 1));
            let mut s = Scratch::default();
            let read = least(&mut || {
                std::hint::black_box(row.iter().map(|x| x.to_bits() as u64).sum::<u64>());
            });
            let mut sample = Sample::of(&lanes, &row, &mut s.sampled);
            let sample_us = least(&mut || sample = Sample::of(&lanes, &row, &mut s.sampled));
            let share = 1.0 - p as f64 / (1u64 << TOP_P_BITS) as f64;
            let limits = (
                share * (sample.total - sample.spread()),
                share * (sample.total + sample.spread()),
            );
            let slack = SLACK * sample.total;
            let mut sampled = place_band(&lanes, &s.sampled, &sample, limits, slack, &mut s.sample);
            let place = least(&mut || {
                sampled = place_band(&lanes, &s.sampled, &sample, limits, slack, &mut s.sample);
            });
            let confident = sample.spread() / sample.total;
            let levels = sampled.levels(&lanes);
            let mut pass = (0.0, [0.0; LEVELS]);
            let store = least(&mut || pass = passes.estimate_tokens(&mut s.estimates, &levels));
            // The first pass without levels, as before them.
            let plain_store = least(&mut || {
                std::hint::black_box(estimate_store(&row, &lanes, &mut s.estimates));
            });
            let (total, masses) = pass;
            // The band `sample_top_p` hands the second pass: narrowed by the levels where the
            // sample pins the total, else placed with the first pass's total.
            let levels_path = sample.spread() <= CONFIDENT * sample.total;
            let band = if levels_path {
                sampled.narrowed(&levels, &masses, total, p)
            } else {
                let below = share * total;
                place_band(
                    &lanes,
                    &s.sampled,
                    &sample,
                    (below, below),
                    SLACK * total,
                    &mut s.sample,
                )
            };
            let path = if levels_path { "levels" } else { "total" };
            let in_band = |b: Band| row.iter().filter(|&&l| l >= b.low && l < b.high).count();
            let (sampled_tokens, band_tokens) = (in_band(sampled), in_band(band));
            let bins_us = least(&mut || {
                std::hint::black_box(band_bins(
                    &s.sample,
                    37.0,
                    (total * 0.1, total * 0.1),
                    0.0,
                    BAND_SIGMAS,
                ));
            });
            // The second pass over `band`, into the scratch buffers.
            let second = |s: &mut Scratch, band: Band| {
                let found = Found {
                    tokens: &mut s.band,
                    histogram: &mut s.histogram,
                };
                classify(&passes, &s.estimates, band, &mut s.masses, found)
            };
            let classify_us = least(&mut || {
                second(&mut s, band);
            });
            let empty = Band {
                low: band.high,
                high: band.high,
            };
            let unlisted_us = least(&mut || {
                second(&mut s, empty);
            });
            let counted = second(&mut s, band);
            let scan_us = least(&mut || {
                let low = s.band.len() as u32 / 3;
                std::hint::black_box(s.band.iter().filter(|t| t.id > low).count());
            });
            let (row_m, above) = counted.masses(row.len());
            let split = Split::top_p(p);
            let mut threshold = None;
            let threshold_us = least(&mut || {
                threshold = match threshold_in_band(&row, &lanes, &mut s, (row_m, above), split) {
                    InBand::Found(t) => Some(t),
                    _ => None,
                };
            });
            // The threshold stage on the band the first pass's total places (the levels path's
            // band is narrower): the cost of a wide band's region scan.
            let below = share * total;
            let limits = (below, below);
            let wide = place_band(
                &lanes,
                &s.sampled,
                &sample,
                limits,
                SLACK * total,
                &mut s.sample,
            );
            let wide_counted = second(&mut s, wide);
            let wide_tokens = s.band.len();
            let wide_us = least(&mut || {
                let masses = wide_counted.masses(row.len());
                std::hint::black_box(threshold_in_band(&row, &lanes, &mut s, masses, split));
            });
            println!(
                "{name:<16} threshold on the total's band ({wide_tokens} tokens) {wide_us:5.1} µs"
            );
            second(&mut s, band);
            let _ = threshold_in_band(&row, &lanes, &mut s, (row_m, above), split);
            let masses = s.masses.clone();
            let draw_us = threshold.map_or(f64::NAN, |threshold| {
                least(&mut || {
                    s.masses.copy_from_slice(&masses);
                    let r = lcg.next_u64();
                    std::hint::black_box(draw_kept(&row, &lanes, &mut s, threshold, r));
                })
            });
            let whole = least(&mut || {
                std::hint::black_box(sample_top_p(&passes, p, lcg.next_u64(), &mut s));
            });
            println!(
                "{name:<16} read {read:5.1} store {store:5.1} (w/o levels {plain_store:5.1}) \
                 sample {sample_us:4.1} place {place:5.1} (bins {bins_us:4.1}) spread \
                 {confident:.3} ({path}) sample band {sampled_tokens} handed on {band_tokens} | \
                 classify \
                 {classify_us:5.1} threshold {threshold_us:5.1} draw {draw_us:5.1} | all \
                 {whole:5.1} µs | classify w/o band {unlisted_us:5.1}, band scan {scan_us:4.1} | band {} region {} above {}",
                s.band.len(),
                s.region.len(),
                counted.above_tokens
            );
        }
    }

    /// The band's and the region's sizes, per row shape (run with `--ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn band_sizes() {
        let mut lcg = Lcg(5);
        for (sigma, t) in [
            (3.0f32, 1.0f32),
            (3.5, 0.8),
            (5.1, 1.0),
            (2.79, 1.0),
            (0.874, 1.0),
        ] {
            let row = normal_row(&mut lcg, 151_936, sigma);
            let mut s = Scratch::default();
            let lanes = lanes_of(&row, t);
            let passes = Passes::unhinted(&row, lanes, Segments::of(row.len(), 1));
            let start = cpu_ns();
            let token = sample_top_p(&passes, top_p_fixed(0.9), 7, &mut s);
            let us = (cpu_ns() - start) as f64 / 1e3;
            println!(
                "σ {sigma} T {t}: band {} tokens, region {} tokens, {us:.0} µs, token {token:?}",
                s.band.len(),
                s.region.len()
            );
        }
    }

    /// Samples one row of each shape many times on one thread, for a profiler
    /// (`SPECULA_PROFILE_SIGMA` picks σ; run with `--ignored`).
    #[test]
    #[ignore = "a load for a profiler, not a check"]
    fn profile_rows() {
        let sigma = std::env::var("SPECULA_PROFILE_SIGMA")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.874f32);
        let mut lcg = Lcg(5);
        let row = normal_row(&mut lcg, 151_936, sigma);
        for i in 0..400 {
            std::hint::black_box(sample(&row, 1.0, 0.9, i, RowHints::default()));
        }
    }

    /// How often the bounds decide, per row shape (run with `--ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn decision_rates() {
        let mut lcg = Lcg(7);
        for (sigma, t) in [
            (3.0f32, 1.0f32),
            (3.5, 0.8),
            (5.1, 1.0),
            (3.76, 1.0),
            (2.79, 1.0),
            (0.874, 1.0),
        ] {
            for top_p in [0.9f32, 1.0] {
                let rows = 100;
                let mut decided = 0;
                EXACT_PASSES.store(0, std::sync::atomic::Ordering::Relaxed);
                let start = std::time::Instant::now();
                for _ in 0..rows {
                    let row = normal_row(&mut lcg, 151_936, sigma);
                    let hints = RowHints::default();
                    decided += usize::from(sample(&row, t, top_p, lcg.next_u64(), hints).is_some());
                }
                println!(
                    "σ {sigma} T {t} top_p {top_p}: decided {decided}/{rows}, {} on exact masses ({:.0} µs/row incl. generation)",
                    EXACT_PASSES.load(std::sync::atomic::Ordering::Relaxed),
                    start.elapsed().as_secs_f64() * 1e6 / rows as f64
                );
            }
        }
    }

    /// Batch probe (issue 28, session 11): 64 cold rows of one shape sampled as the op samples
    /// them (two halves on two threads, each in row order), wall and process CPU time per batch
    /// (all threads: robust to preemption, where wall time is not), next to a two-thread read of
    /// the same rows. Run with `--ignored --nocapture`; `SPECULA_PROBE_ROUNDS` (9),
    /// `SPECULA_PROBE_P` (0.9), `SPECULA_PROBE_V` (151936), `SPECULA_PROBE_MODE`: `warm` samples one row 64 times (in cache),
    /// `max` runs only the maximum pass on the cold rows, `l3` samples 16 rows four times each,
    /// read just before (in L3, not in L2). A wall time equal to the CPU time means
    /// the second thread did not get its vCPU (another process had it).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn batch_costs() {
        fn cpu_total_ns() -> u64 {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: a valid timespec pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        }
        let rounds: usize = probe_setting("SPECULA_PROBE_ROUNDS", 9);
        let top_p: f32 = probe_setting("SPECULA_PROBE_P", 0.9);
        let vocab: usize = probe_setting("SPECULA_PROBE_V", 151_936);
        let timed = std::env::var("SPECULA_PROBE_STAGES").is_ok();
        stage::ON.store(timed, std::sync::atomic::Ordering::Relaxed);
        let evict = crate::sampling::probe::evictor();
        let mut lcg = Lcg(9);
        // The shapes whose band work is large (not the two narrowest).
        let shapes = BENCH_SHAPES
            .into_iter()
            .filter(|(name, ..)| !matches!(*name, "kept~10" | "kept~100"));
        for (name, sigma, t) in shapes {
            let rows: Vec<Vec<f32>> = (0..64)
                .map(|_| normal_row(&mut lcg, vocab, sigma))
                .collect();
            let mode = std::env::var("SPECULA_PROBE_MODE").unwrap_or_default();
            let rows: Vec<&[f32]> = if mode == "warm" {
                vec![&rows[0][..]; rows.len()]
            } else if mode == "l3" {
                (0..rows.len()).map(|i| &rows[i % 16][..]).collect()
            } else {
                rows.iter().map(|r| &r[..]).collect()
            };
            let (mut wall, mut cpu, mut floor) = (vec![], vec![], vec![]);
            let mut stages = [0u64; stage::COUNT_OF];
            for round in 0..rounds {
                std::hint::black_box(evict.iter().fold(0u64, |a, &b| a.wrapping_add(b)));
                let start = std::time::Instant::now();
                let sum: u32 = rows
                    .par_iter()
                    .map(|r| r.iter().fold(0u32, |a, x| a ^ x.to_bits()))
                    .reduce(|| 0, |a, b| a ^ b);
                std::hint::black_box(sum);
                floor.push(start.elapsed().as_secs_f64() * 1e3);
                if mode != "l3" {
                    std::hint::black_box(evict.iter().fold(0u64, |a, &b| a.wrapping_add(b)));
                }
                let (start, c0) = (std::time::Instant::now(), cpu_total_ns());
                // Two halves on two threads, each in row order, as the op's pool runs a batch.
                let half = |rows: &[&[f32]], first: usize| {
                    let hints = RowHints {
                        parts: 1,
                        next: &[],
                    };
                    let seed =
                        |i: usize| ((first + i) as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    stage::NS.with(|c| c.set([0; stage::COUNT_OF]));
                    let drawn = rows
                        .iter()
                        .enumerate()
                        .map(|(i, r)| {
                            if mode == "max" {
                                std::hint::black_box(max_and_clean(r));
                                return None;
                            }
                            sample(r, t, top_p, seed(i) ^ round as u64, hints)
                        })
                        .collect::<Vec<_>>();
                    (drawn, stage::NS.with(|c| c.get()))
                };
                let (a, b) = rows.split_at(rows.len() / 2);
                let ((_, ns_a), (_, ns_b)) =
                    std::hint::black_box(rayon::join(|| half(a, 0), || half(b, a.len())));
                wall.push(start.elapsed().as_secs_f64() * 1e3);
                cpu.push((cpu_total_ns() - c0) as f64 / 1e6);
                for (k, total) in stages.iter_mut().enumerate() {
                    *total += ns_a[k] + ns_b[k];
                }
            }
            if timed {
                let names = [
                    "max",
                    "sample",
                    "store",
                    "place",
                    "classify",
                    "(list",
                    "(count",
                    "threshold",
                    "kept",
                    "walk",
                ];
                let line: Vec<String> = names
                    .iter()
                    .zip(stages)
                    .map(|(n, ns)| {
                        format!("{n} {:.1}", ns as f64 / 1e3 / (rounds * rows.len()) as f64)
                    })
                    .collect();
                println!("{name:<16} µs a row (wall, per stage): {}", line.join("  "));
            }
            let med = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                (v[v.len() / 2], v[0])
            };
            let ((w, wmin), (c, cmin), (f, fmin)) =
                (med(&mut wall), med(&mut cpu), med(&mut floor));
            println!(
                "{name:<16} p {top_p}: wall {w:6.2} ms (min {wmin:6.2}) cpu {c:6.2} ms (min {cmin:6.2}) floor {f:5.2} ms (min {fmin:5.2}) ratio {:.2} (min/min {:.2})",
                w / f,
                wmin / fmin
            );
        }
    }
}

//! The top-p set of a probability row whatever its size (`docs/semantics.md` §5.6), exactly, in
//! two passes over the row and work on a narrow band of its tokens: the path of the rows whose kept
//! set is too large for the candidates of the fast path (flat rows, top-p sets of tens of
//! thousands of tokens).
//!
//! The weights of a probability row are exact and cheap (`floor(p · 2^40)` from the value's bits),
//! so every decision here is made on exact integers:
//!
//! 1. a sample of the row (runs of consecutive tokens spread over it) estimates the mass below
//!    each level of the rank key, which places a **band** of keys around the top-p threshold
//!    (where the mass below it is `W − P · W / 2^24`), a few standard deviations of the estimate
//!    wide;
//! 2. one pass sums, per block of [`BLOCK`] tokens, the exact weight of the tokens above the
//!    band, and lists the band's tokens with a histogram of their keys weighted exactly;
//! 3. walking the histogram from the top from the mass above the band finds the bin where the
//!    target is reached; only that bin's tokens are put in rank order, which gives the threshold
//!    `(key, id)` and the kept mass `C` exactly;
//! 4. the draw `t = ⌊R · C / 2^64⌋` finds its block from the blocks' kept masses (above the band
//!    plus the kept band tokens), and that block is walked in id order.
//!
//! A band that turns out to lie wholly above or below the threshold is widened to the top or the
//! bottom of the row and the pass repeated; `None` only if even that fails (it cannot on a row of
//! positive total weight, but the caller has the histogram path to fall back on).
//!
//! A row whose sample predicts a wide kept set skips the scan of the fast path: [`one_pass`]
//! places the band for a total of `2^40` and learns the exact total in the classify pass itself,
//! so that the row is read once; this two-pass path decides the rows where that band missed.

use specula_backend_api::FloatElement;
use specula_backend_api::fixed_point::{scale_draw, top_p_target_mass};

use super::histogram::MIN_WEIGHT_KEY;
use super::scan::{compiled_for, dispatch, dispatched, key_of, weight_of_key};
#[cfg(target_arch = "x86_64")]
use super::scan::{has_avx2, has_avx512};

#[cfg(target_arch = "x86_64")]
mod lanes;
mod one_pass;
mod sample;

pub(crate) use one_pass::{OnePass, sample_top_p_one_pass};
use sample::band_from;

/// Tokens per block of the above-band masses and of the draw's walk.
const BLOCK: usize = 256;
/// Tokens sampled to place the band (here and in the logits path without top-k).
pub(crate) const SAMPLES: usize = 4096;
/// Consecutive tokens per run of the sample.
pub(crate) const SAMPLE_RUN: usize = 32;
/// The margin of the band's placement besides [`SIGMAS`] standard deviations of the sample's
/// estimate, as a share of the row's mass.
pub(crate) const SLACK: f64 = 0.002;
/// How many standard deviations of the sample's estimate of the mass below a level place the
/// band's ends (a band that misses costs this path a second classify pass).
pub(crate) const SIGMAS: f64 = 4.0;
/// Bins of the band's histogram of keys.
pub(crate) const BAND_BINS: usize = 2048;
/// The key of `2^-13` (its bits read as a u32): a vector whose raw bits are all below it holds
/// values in `[+0, 2^-13)` only — no sign, no NaN, nothing above 1, so its bits are its sanitized
/// keys — whose weights are below `2^27`, so that a lane's sums in a block fit 32 bits. The
/// classify loops sum such vectors in 32-bit lanes when the row has few others
/// ([`Scratch::light`]).
const SMALL_KEY: u32 = 0x3900_0000;
/// A row is light ([`Scratch::light`]) when at most this many of its sampled tokens reach
/// [`SMALL_KEY`]: a few dozen row tokens, each a mispredicted branch of the light loop.
const LIGHT_SAMPLED: u32 = 1;

/// Per-thread buffers, reused from row to row.
#[derive(Default)]
struct Scratch {
    /// Per block: the exact mass above the band, then the kept mass.
    masses: Vec<u64>,
    /// The band's tokens, in id order.
    band: Listing,
    /// The band's histogram: exact mass per bin, of keys from `bin_low` on, `2^bin_shift` keys per
    /// bin.
    bins: Vec<u64>,
    bin_low: u32,
    bin_shift: u32,
    /// The sample's bins: sum and sum of squares of the sampled weights.
    sample: Vec<(f64, f64)>,
    /// The sample's keys.
    keys: sample::SampleKeys,
    /// The tokens of the threshold's bin.
    crossing: Vec<(u32, u32)>,
    /// The sampled keys above a narrow row's first guess at its floor (`sample::narrow_floor`).
    upper_keys: Vec<u32>,
    /// The sample saw at most [`LIGHT_SAMPLED`] values of [`SMALL_KEY`] or more: the classify
    /// pass takes the loop that sums small values in 32-bit lanes.
    light: bool,
}

/// The band's tokens in id order: their keys, the first `len` of `keys` (which holds a whole row,
/// so that the vector loops store whole vectors), and a bit per token of the row marking them
/// (`marks`). Their ids are read from the marks only where they are needed — the threshold's bin
/// and the draw's block — instead of being listed beside the keys.
#[derive(Default)]
struct Listing {
    keys: Vec<u32>,
    len: usize,
    marks: Vec<u64>,
}

/// Marks per block: [`BLOCK`] bits.
const MARK_WORDS: usize = BLOCK / 64;

impl Listing {
    /// Empties the listing, with room for `tokens` tokens (the buffers only grow) and their marks
    /// cleared.
    fn reset(&mut self, tokens: usize) {
        if self.keys.len() < tokens {
            self.keys.resize(tokens, 0);
        }
        self.marks.clear();
        self.marks.resize(tokens.div_ceil(64), 0);
        self.len = 0;
    }

    /// The listed keys.
    fn keys(&self) -> &[u32] {
        &self.keys[..self.len]
    }

    /// The marks of block `b`.
    fn block_marks(&self, b: usize) -> &[u64] {
        let start = (b * MARK_WORDS).min(self.marks.len());
        &self.marks[start..(start + MARK_WORDS).min(self.marks.len())]
    }

    /// How many of the band's tokens block `b` holds.
    fn count_in_block(&self, b: usize) -> usize {
        let marks = self.block_marks(b);
        marks.iter().map(|word| word.count_ones() as usize).sum()
    }

    /// The ids of the band's tokens in block `b`, in order.
    fn ids_in_block(&self, b: usize) -> impl Iterator<Item = u32> + '_ {
        let first = b * BLOCK;
        let words = self.block_marks(b).iter().enumerate();
        words.flat_map(move |(w, &word)| {
            set_bits(word).map(move |bit| (first + w * 64 + bit) as u32)
        })
    }

    /// The id of the listed token at `at` (`0` past the last): the marks' counts summed eight
    /// words at a time up to the words holding it, then its bit there.
    fn id_of(&self, at: usize) -> u32 {
        const WORDS: usize = 8;
        let count = |words: &[u64]| words.iter().map(|w| w.count_ones() as usize).sum::<usize>();
        let mut before = 0;
        for (c, chunk) in self.marks.chunks(WORDS).enumerate() {
            let here = count(chunk);
            if before + here <= at {
                before += here;
                continue;
            }
            for (w, &word) in chunk.iter().enumerate() {
                let here = word.count_ones() as usize;
                if before + here > at {
                    let bit = set_bits(word).nth(at - before).unwrap_or(0);
                    return ((c * WORDS + w) * 64 + bit) as u32;
                }
                before += here;
            }
        }
        0
    }

    /// The listed ids (tests).
    #[cfg(test)]
    fn ids(&self) -> Vec<u32> {
        let words = self.marks.iter().enumerate();
        words
            .flat_map(|(w, &word)| set_bits(word).map(move |bit| (w * 64 + bit) as u32))
            .collect()
    }

    /// Appends a token after the last one (room for it was made by [`Listing::reset`]).
    #[cfg(test)]
    fn push_key(&mut self, key: u32, id: u32) {
        self.keys[self.len] = key;
        self.marks[id as usize / 64] |= 1 << (id % 64);
        self.len += 1;
    }

    /// Appends the keys of the marked tokens of `row`, the row's tokens from `first` on (a
    /// multiple of 64), from `row`.
    fn push_marked<T: FloatElement>(&mut self, row: &[T], first: usize) {
        let words = &self.marks[first / 64..(first + row.len()).div_ceil(64)];
        for (w, &word) in words.iter().enumerate() {
            for bit in set_bits(word) {
                self.keys[self.len] = key_of(row[w * 64 + bit]);
                self.len += 1;
            }
        }
    }
}

/// The set bits of `word`, lowest first.
fn set_bits(mut word: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        let bit = (word != 0).then(|| word.trailing_zeros() as usize);
        word &= word.wrapping_sub(1);
        bit
    })
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// A band of rank keys `[low, high)`: tokens with a key at or above `high` are above it.
#[derive(Clone, Copy, Debug)]
struct Band {
    low: u32,
    high: u32,
}

/// The `high` of a band with nothing above it: one past the key of 1.0, the largest key of a
/// sanitized value.
const TOP: u32 = super::scan::ONE_KEY + 1;

impl Band {
    /// Every token from `low` on: the kept set of a narrow row, a few thousand tokens at most,
    /// which the vector loops list only where a vector holds one (`lanes`).
    fn from_floor(low: u32) -> Band {
        Band { low, high: TOP }
    }

    /// Whether the band is one of [`Band::from_floor`]'s.
    fn is_floor(&self) -> bool {
        self.high == TOP
    }
}

/// The token drawn by `draw` from a probability row of exact total weight `total > 0` under top-p
/// `p_fixed` (below `2^24`) without top-k, or `None` (see the module doc).
pub(crate) fn sample_top_p<T: FloatElement>(
    row: &[T],
    total: u64,
    p_fixed: u64,
    draw: u64,
) -> Option<usize> {
    with_scratch(|s| sample_with(row, total, p_fixed, draw, s))
}

/// Runs `f` with this thread's scratch, moved out of its cell for the duration.
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut s = SCRATCH.with(|cell| cell.take());
    let result = f(&mut s);
    SCRATCH.with(|cell| *cell.borrow_mut() = s);
    result
}

fn sample_with<T: FloatElement>(
    row: &[T],
    total: u64,
    p_fixed: u64,
    draw: u64,
    s: &mut Scratch,
) -> Option<usize> {
    let target = top_p_target_mass(p_fixed, total);
    let scale = take_sample(row, s);
    let below = (total - target) as f64;
    let mut band = band_from(&s.sample, scale, below, SLACK * total as f64);
    loop {
        let (above, _) = classify(row, band, s);
        if above >= target {
            // The threshold may lie above the band.
            if band.high == u32::MAX {
                return None;
            }
            band.high = u32::MAX;
            continue;
        }
        match threshold(s, above, target) {
            Some((key, id, kept)) => return draw_kept(row, s, (key, id), kept, draw),
            None if band.low <= MIN_WEIGHT_KEY => return None,
            None => band.low = MIN_WEIGHT_KEY,
        }
    }
}

/// Takes the sample that places the band: its keys into `s.keys`, their weights summed per level
/// of the key into `s.sample` ([`sample`]). Returns how many row
/// tokens each sampled token stands for.
fn take_sample<T: FloatElement>(row: &[T], s: &mut Scratch) -> f64 {
    let scale = take_keys(row, s);
    sample::bin_keys(s.keys.keys(), &mut s.sample);
    scale
}

/// The sample's keys into `s.keys`, and whether the row is light ([`Scratch::light`]); returns
/// how many row tokens each sampled token stands for.
fn take_keys<T: FloatElement>(row: &[T], s: &mut Scratch) -> f64 {
    let scale = sample::take_keys(row, &mut s.keys);
    s.light = s.keys.sampled_from(SMALL_KEY) <= LIGHT_SAMPLED;
    scale
}

/// The ends of a band from a sample's bins of levels (per bin, in rising order, the sampled
/// weights' sum and sum of squares; each sampled token stands for `scale`): the first bin past
/// the levels whose estimated mass below is certainly under `low_below`, and the first past the
/// levels whose estimated mass below certainly reaches `high_below` — "certainly" meaning by
/// `sigmas` standard deviations of the estimate and `slack` (`None`: no such level).
pub(crate) fn band_bins(
    bins: &[(f64, f64)],
    scale: f64,
    (low_below, high_below): (f64, f64),
    slack: f64,
    sigmas: f64,
) -> (Option<usize>, Option<usize>) {
    let (mut mass, mut squares) = (0.0f64, 0.0f64);
    let mut low_bin = None;
    // `x ≥ k · scale · √S` as `x ≥ 0 ∧ x² ≥ k² · scale² · S` (`k` = `sigmas`): no square root
    // (its latency, once per bin, was most of the walk).
    let k2 = sigmas * sigmas;
    let beyond = |x: f64, squares: f64| x >= 0.0 && x * x >= k2 * scale * scale * squares;
    for (b, &(m, q)) in bins.iter().enumerate() {
        if m == 0.0 {
            continue;
        }
        if beyond(low_below - slack - (mass + m) * scale, squares + q) {
            low_bin = Some(b + 1);
        }
        mass += m;
        squares += q;
        if beyond(mass * scale - high_below - slack, squares) {
            // No later bin is below `low_below` by the spread (the mass and the spread grow).
            return (low_bin, Some(b + 1));
        }
    }
    (low_bin, None)
}

/// The pass over the row: the exact weight above the band per block into `s.masses`, the band's
/// tokens and their histogram into `s.band` and `s.bins`; returns the exact weight above the band
/// and the row's exact total weight.
fn classify<T: FloatElement>(row: &[T], band: Band, s: &mut Scratch) -> (u64, u64) {
    s.masses.clear();
    s.masses.resize(row.len().div_ceil(BLOCK), 0);
    s.band.reset(row.len());
    let range = band.high.saturating_sub(band.low);
    let shift = (32 - range.leading_zeros()).saturating_sub(BAND_BINS.trailing_zeros());
    s.bins.clear();
    s.bins.resize((range >> shift) as usize + 1, 0);
    (s.bin_low, s.bin_shift) = (band.low, shift);
    let total = classify_row(row, (band, s.light), &mut s.masses, &mut s.band);
    histogram(s.band.keys(), band.low, shift, &mut s.bins);
    total
}

dispatched!(
    /// Adds the weight of each of `keys` (all in the band, from `low` on) to its bin of `bins`,
    /// `2^shift` keys per bin, with the loop compiled for the CPU's vector unit.
    fn histogram [] (keys: &[u32], low: u32, shift: u32, bins: &mut [u64]) -> ()
        = histogram_generic []
);

/// [`histogram`]: the bins and weights of a chunk of keys first (a loop the compiler vectorizes),
/// then the additions.
#[inline(always)]
fn histogram_generic(keys: &[u32], low: u32, shift: u32, bins: &mut [u64]) {
    const CHUNK: usize = 64;
    for chunk in keys.chunks(CHUNK) {
        let (mut at, mut weights) = ([0u32; CHUNK], [0u64; CHUNK]);
        for ((&key, at), weight) in chunk.iter().zip(&mut at).zip(&mut weights) {
            *at = key.wrapping_sub(low) >> shift;
            *weight = weight_of_key(key);
        }
        for (&at, &weight) in at.iter().zip(&weights).take(chunk.len()) {
            bins[at as usize] += weight;
        }
    }
}

/// The vector part of [`classify`] on the best loop for this CPU and element type: the
/// hand-written ones of [`lanes`] for the full blocks of an f32 row (they list the band's tokens
/// as they go), else the generic loop (marks, listed after it).
/// `light`: the row's sample saw few values of [`SMALL_KEY`] or more ([`Scratch::light`]).
fn classify_row<T: FloatElement>(
    row: &[T],
    (band, light): (Band, bool),
    masses: &mut [u64],
    listing: &mut Listing,
) -> (u64, u64) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = light;
    #[cfg(target_arch = "x86_64")]
    if let (specula_backend_api::DType::F32, Ok(values)) =
        (T::DTYPE, bytemuck::try_cast_slice::<T, f32>(row))
        && let Some(full_blocks) = lanes_for(band, light)
    {
        return with_full_blocks(values, band, (masses, listing), |blocks, band| {
            // SAFETY: `lanes_for` chose a loop whose features the CPU supports.
            unsafe { full_blocks(blocks, band) }
        });
    }
    classify_listed(row, 0, band, masses, listing)
}

/// A hand-written classify loop over the full blocks of an f32 row ([`lanes`]).
#[cfg(target_arch = "x86_64")]
type FullBlocks = unsafe fn(lanes::Blocks<'_>, Band) -> (u64, u64);

/// The hand-written loop for `band` on this CPU: the sparse one for a band from a floor to the
/// top ([`Band::from_floor`]), else the one that lists every vector — its light form for a
/// `light` row; `None` without AVX2.
#[cfg(target_arch = "x86_64")]
fn lanes_for(band: Band, light: bool) -> Option<FullBlocks> {
    use lanes::{avx2, avx512};
    let sparse = band.is_floor();
    if has_avx512() {
        return Some(match (sparse, light) {
            (true, _) => avx512::classify_sparse_full_blocks,
            (false, true) => avx512::classify_full_blocks::<true>,
            (false, false) => avx512::classify_full_blocks::<false>,
        });
    }
    if has_avx2() {
        return Some(match (sparse, light) {
            (true, _) => avx2::classify_sparse_full_blocks,
            (false, true) => avx2::classify_full_blocks::<true>,
            (false, false) => avx2::classify_full_blocks::<false>,
        });
    }
    None
}

/// The generic loop over `row` (the row's tokens from `first` on, a multiple of [`BLOCK`]): the
/// band's tokens marked, then listed from the marks.
fn classify_listed<T: FloatElement>(
    row: &[T],
    first: usize,
    band: Band,
    masses: &mut [u64],
    listing: &mut Listing,
) -> (u64, u64) {
    let marks = &mut listing.marks[first / 64..(first + row.len()).div_ceil(64)];
    let total = dispatch!(classify_blocks::<T>(row, band, masses, marks)
        via classify_blocks_avx512, classify_blocks_avx2);
    listing.push_marked(row, first);
    total
}

#[cfg(target_arch = "x86_64")]
/// The classify pass of an f32 row with `full_blocks` over its full blocks (and their masses;
/// they list their band tokens) and the generic loop over the rest.
fn with_full_blocks(
    values: &[f32],
    band: Band,
    (masses, listing): (&mut [u64], &mut Listing),
    full_blocks: impl FnOnce(lanes::Blocks<'_>, Band) -> (u64, u64),
) -> (u64, u64) {
    let full = values.len() / BLOCK;
    let (head, tail) = values.split_at(full * BLOCK);
    let (head_masses, tail_masses) = masses.split_at_mut(full);
    let blocks = lanes::Blocks {
        row: head,
        masses: head_masses,
        listing: &mut *listing,
    };
    let (above, total) = full_blocks(blocks, band);
    let (tail_above, tail_total) = classify_listed(tail, head.len(), band, tail_masses, listing);
    (above + tail_above, total + tail_total)
}

compiled_for!(avx512, fn classify_blocks_avx512 [T: FloatElement]
    (row: &[T], band: Band, masses: &mut [u64], bitmaps: &mut [u64]) -> (u64, u64)
    = classify_blocks [T]);
compiled_for!(avx2, fn classify_blocks_avx2 [T: FloatElement]
    (row: &[T], band: Band, masses: &mut [u64], bitmaps: &mut [u64]) -> (u64, u64)
    = classify_blocks [T]);

/// The vector part of [`classify`]: per block the exact weight above the band, per word of 64
/// tokens the bitmap of the band's tokens (no call in the loop); returns the weight above the
/// band and the exact weight of the whole segment.
#[inline(always)]
fn classify_blocks<T: FloatElement>(
    row: &[T],
    band: Band,
    masses: &mut [u64],
    bitmaps: &mut [u64],
) -> (u64, u64) {
    let (mut total, mut every) = (0u64, 0u64);
    let words = bitmaps.chunks_mut(BLOCK / 64);
    for ((block, mass), bits) in row.chunks(BLOCK).zip(masses.iter_mut()).zip(words) {
        let (above, all, block_bits) = classify_block(block, band);
        *mass = above;
        total += above;
        every += all;
        bits.copy_from_slice(&block_bits[..bits.len()]);
    }
    (total, every)
}

/// One block: the exact weight of its tokens above the band, the exact weight of all its tokens,
/// and a bitmap of its band tokens. Written without branches, so that the compiler vectorizes it.
#[inline]
fn classify_block<T: FloatElement>(block: &[T], band: Band) -> (u64, u64, [u64; BLOCK / 64]) {
    let mut bits = [0u64; BLOCK / 64];
    let (mut above, mut all) = (0u64, 0u64);
    for (w, word) in block.chunks(64).enumerate() {
        let mut mask = 0u64;
        for (j, &v) in word.iter().enumerate() {
            let key = key_of(v);
            let weight = weight_of_key(key);
            let is_above = key >= band.high;
            above += if is_above { weight } else { 0 };
            all += weight;
            mask |= u64::from(!is_above & (key >= band.low)) << j;
        }
        bits[w] = mask;
    }
    (above, all, bits)
}

/// The threshold `(key, id)` and the kept mass: the bins walked from the top from the mass above
/// the band to the one where the target is reached, that bin's tokens in rank order; `None` when
/// the band's tokens do not reach the target.
fn threshold(s: &mut Scratch, above: u64, target: u64) -> Option<(u32, u32, u64)> {
    let (crossing, mut running) = crossing_bin(&s.bins, above, target)?;
    s.crossing.clear();
    bin_tokens(&s.band, (s.bin_low, s.bin_shift), crossing, &mut s.crossing);
    // Rank order: key descending, then id ascending — the listing's order, which is the ids'.
    s.crossing
        .sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(key, at) in &s.crossing {
        running += weight_of_key(key);
        if running >= target {
            return Some((key, s.band.id_of(at as usize), running));
        }
    }
    None
}

/// The bin where the target is reached, walking `bins` from the top from `above`, and the mass
/// above it; `None` when they do not reach it. Eight bins at a time: their sum first.
fn crossing_bin(bins: &[u64], above: u64, target: u64) -> Option<(usize, u64)> {
    const CHUNK: usize = 8;
    let mut running = above;
    let mut end = bins.len();
    for chunk in bins.rchunks(CHUNK) {
        let start = end - chunk.len();
        let sum: u64 = chunk.iter().sum();
        if running + sum < target {
            running += sum;
        } else {
            for (b, &mass) in chunk.iter().enumerate().rev() {
                if running + mass >= target {
                    return Some((start + b, running));
                }
                running += mass;
            }
        }
        end = start;
    }
    None
}

dispatched!(
    /// Appends the band's tokens whose key falls in bin `bin` (of `2^shift` keys from `low`) to
    /// `out`, in id order: their keys and places in the listing. The band's keys are looked at sixteen at a time (a loop the compiler
    /// vectorizes); only chunks that hold one of them are walked.
    fn bin_tokens [] (band: &Listing, at: (u32, u32), bin: usize, out: &mut Vec<(u32, u32)>) -> ()
        = bin_tokens_generic []
);

/// [`bin_tokens`], compiled for each vector unit.
#[inline(always)]
fn bin_tokens_generic(
    band: &Listing,
    (low, shift): (u32, u32),
    bin: usize,
    out: &mut Vec<(u32, u32)>,
) {
    const CHUNK: usize = 16;
    let in_bin = |key: u32| (key.wrapping_sub(low) >> shift) as usize == bin;
    for (c, keys) in band.keys().chunks(CHUNK).enumerate() {
        if keys.iter().fold(false, |hit, &key| hit | in_bin(key)) {
            let tokens = keys.iter().enumerate().filter(|&(_, &key)| in_bin(key));
            out.extend(tokens.map(|(j, &key)| (key, (c * CHUNK + j) as u32)));
        }
    }
}

/// The draw among the kept tokens: the blocks are walked in id order, each block's kept mass its
/// mass above the band plus its kept band tokens (the band is listed in id order), until the
/// block holding `t`, which is walked in id order.
fn draw_kept<T: FloatElement>(
    row: &[T],
    s: &mut Scratch,
    (tkey, tid): (u32, u32),
    kept: u64,
    draw: u64,
) -> Option<usize> {
    // Rank order as one integer: key descending, then id ascending; kept up to the threshold.
    let rank = |key: u32, id: u32| (u64::from(key) << 32) | u64::from(!id);
    let least = rank(tkey, tid);
    let kept_weight = |key: u32, id: u32| {
        let weight = weight_of_key(key);
        if rank(key, id) >= least { weight } else { 0 }
    };
    let t = scale_draw(draw, kept);
    let mut before = 0u64;
    let mut keys = s.band.keys();
    let threshold_block = tid as usize / BLOCK;
    for (b, &above) in s.masses.iter().enumerate() {
        let end = (b + 1) * BLOCK;
        let (block_keys, next_keys) = keys.split_at(s.band.count_in_block(b).min(keys.len()));
        keys = next_keys;
        let band_mass: u64 = if b == threshold_block {
            let ids = s.band.ids_in_block(b);
            let tokens = block_keys.iter().zip(ids);
            tokens.map(|(&k, id)| kept_weight(k, id)).sum()
        } else {
            // A token tied with the threshold's key is kept when its block comes first.
            let tied_id = if b < threshold_block { 0 } else { u32::MAX };
            block_keys.iter().map(|&k| kept_weight(k, tied_id)).sum()
        };
        let mass = above + band_mass;
        if before + mass <= t {
            before += mass;
            continue;
        }
        let start = b * BLOCK;
        for (j, &v) in row[start..row.len().min(end)].iter().enumerate() {
            before += kept_weight(key_of(v), (start + j) as u32);
            if before > t {
                return Some(start + j);
            }
        }
        return None;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::top_k_top_p_sample::sample_prob_row_histogram;
    use crate::sampling::lcg::Lcg;
    use specula_backend_api::fixed_point::{top_p_fixed, weight};

    /// Softmax rows of normal logits N(0, σ²) (top-p sets of a few to most of the tokens), with
    /// ties (values rounded) and hostile entries in some.
    fn rows(lcg: &mut Lcg, v: usize) -> Vec<Vec<f32>> {
        [0.3f32, 0.9, 2.0, 3.0, 4.5, 0.0]
            .iter()
            .enumerate()
            .map(|(i, &sigma)| {
                let logits: Vec<f32> = (0..v)
                    .map(|_| {
                        let (u, w) = (lcg.unit().max(1e-7), lcg.unit());
                        sigma * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * w).cos()
                    })
                    .collect();
                let sum: f32 = logits.iter().map(|l| l.exp()).sum();
                let mut row: Vec<f32> = logits.iter().map(|l| l.exp() / sum).collect();
                if i % 2 == 1 {
                    row.iter_mut()
                        .for_each(|p| *p = (*p * 4096.0 * v as f32).round() / (4096.0 * v as f32));
                }
                if i == 3 {
                    row[5] = f32::NAN;
                    row[7] = -1.0;
                    row[v - 1] = 0.0;
                }
                row
            })
            .collect()
    }

    /// The classify pass of every loop this CPU runs against the generic one (on the baseline
    /// target) and its listing against the band's tokens picked one by one, on rows with hostile
    /// values (NaN, negatives, infinity, subnormals, ties), with bands from empty to the whole row
    /// and lengths that are not a multiple of a block; f16 and bf16 rows through the generic loop.
    #[test]
    fn the_vector_classify_loops_equal_the_generic_one() {
        let mut lcg = Lcg(2028);
        // 1024 and 1283: the floor bands' listing behind the pass (`lanes::LIST_BEHIND` blocks) at
        // exactly that many full blocks and one more.
        // The second scale: nearly every vector holds only values below `SMALL_KEY` (the light
        // loops' 32-bit sums), a few hold the hostile values below.
        for (v, scale) in [64, 300, 1024, 1283, 5000, 40_000 + 17]
            .into_iter()
            .flat_map(|v| [(v, 0.01), (v, 1e-5)])
        {
            let mut row: Vec<f32> = (0..v).map(|_| lcg.unit().powi(8) * scale).collect();
            row[3] = f32::NAN;
            row[9] = -0.5;
            row[20] = 1.5;
            row[33] = f32::INFINITY;
            row[40] = 1e-40;
            row[v - 1] = 0.0;
            // Ties: a run of equal values, and a value repeated over the row.
            let tied = row[2];
            row[44..60].fill(tied);
            for i in (50..v).step_by(37) {
                row[i] = row[1];
            }
            let keys: Vec<u32> = row.iter().map(|&p| key_of(p)).collect();
            let mut sorted = keys.clone();
            sorted.sort_unstable();
            let at = |q: usize| sorted[(q * (v - 1)) / 100];
            let bands = [
                (MIN_WEIGHT_KEY, u32::MAX),
                (0, 0),
                (0, u32::MAX),
                (at(10), at(90)),
                (at(50), at(51)),
                (at(99), u32::MAX),
                (at(30), 0x3f80_0000),
                (0x3f80_0000, 0x3f80_0001),
                (key_of(row[1]), key_of(row[1]) + 1),
                // From a floor to the top (`Band::from_floor`: the sparse loops).
                (0, TOP),
                (MIN_WEIGHT_KEY, TOP),
                (at(90), TOP),
                (at(99), TOP),
                (TOP, TOP),
            ];
            for (low, high) in bands {
                let band = Band { low, high };
                let (blocks, words) = (v.div_ceil(BLOCK), v.div_ceil(64));
                let (mut masses, mut bitmaps) = (vec![0; blocks], vec![0; words]);
                let expected = classify_blocks(&row, band, &mut masses, &mut bitmaps);
                let want: u64 = keys
                    .iter()
                    .filter(|&&k| k >= high)
                    .map(|&k| weight_of_key(k))
                    .sum();
                let every: u64 = keys.iter().map(|&k| weight_of_key(k)).sum();
                assert_eq!(expected, (want, every), "v {v} band {band:?}");
                let (want_keys, want_ids): (Vec<u32>, Vec<u32>) = (0..v as u32)
                    .map(|id| (keys[id as usize], id))
                    .filter(|&(k, _)| (low..high).contains(&k))
                    .unzip();
                let mut bitmap_listing = Listing::default();
                bitmap_listing.reset(v);
                bitmap_listing.marks.copy_from_slice(&bitmaps);
                bitmap_listing.push_marked(&row, 0);
                assert_eq!(
                    bitmap_listing.keys(),
                    want_keys,
                    "bitmaps v {v} band {band:?}"
                );
                assert_eq!(
                    bitmap_listing.ids(),
                    want_ids,
                    "bitmaps v {v} band {band:?}"
                );
                let isas = [
                    "avx512",
                    "avx512 light",
                    "avx2",
                    "avx2 light",
                    "avx512 sparse",
                    "avx2 sparse",
                    "generic",
                    "best",
                    "best light",
                ];
                for isa in isas {
                    let mut m = vec![u64::MAX; blocks];
                    // A listing used before, its buffers full of stale tokens and marks.
                    let mut listing = Listing {
                        keys: vec![u32::MAX; v + 5],
                        len: 9,
                        marks: vec![u64::MAX; words + 3],
                    };
                    listing.reset(v);
                    let parts = (&mut m[..], &mut listing);
                    let got = match isa {
                        #[cfg(target_arch = "x86_64")]
                        "avx512" if has_avx512() => {
                            with_full_blocks(&row, band, parts, |blocks, band| {
                                // SAFETY: AVX-512F is present.
                                unsafe {
                                    lanes::avx512::classify_full_blocks::<false>(blocks, band)
                                }
                            })
                        }
                        #[cfg(target_arch = "x86_64")]
                        "avx512 light" if has_avx512() && !band.is_floor() => {
                            with_full_blocks(&row, band, parts, |blocks, band| {
                                // SAFETY: AVX-512F is present.
                                unsafe { lanes::avx512::classify_full_blocks::<true>(blocks, band) }
                            })
                        }
                        #[cfg(target_arch = "x86_64")]
                        "avx2 light" if has_avx2() && !band.is_floor() => {
                            with_full_blocks(&row, band, parts, |blocks, band| {
                                // SAFETY: AVX2 is present.
                                unsafe { lanes::avx2::classify_full_blocks::<true>(blocks, band) }
                            })
                        }
                        #[cfg(target_arch = "x86_64")]
                        "avx2" if has_avx2() => {
                            with_full_blocks(&row, band, parts, |blocks, band| {
                                // SAFETY: AVX2 is present.
                                unsafe { lanes::avx2::classify_full_blocks::<false>(blocks, band) }
                            })
                        }
                        #[cfg(target_arch = "x86_64")]
                        "avx512 sparse" if has_avx512() && band.is_floor() => {
                            with_full_blocks(&row, band, parts, |blocks, band| {
                                // SAFETY: AVX-512F is present.
                                unsafe { lanes::avx512::classify_sparse_full_blocks(blocks, band) }
                            })
                        }
                        #[cfg(target_arch = "x86_64")]
                        "avx2 sparse" if has_avx2() && band.is_floor() => {
                            with_full_blocks(&row, band, parts, |blocks, band| {
                                // SAFETY: AVX2 is present.
                                unsafe { lanes::avx2::classify_sparse_full_blocks(blocks, band) }
                            })
                        }
                        "generic" => classify_listed(&row, 0, band, parts.0, parts.1),
                        "best" => classify_row(&row, (band, false), parts.0, parts.1),
                        "best light" => classify_row(&row, (band, true), parts.0, parts.1),
                        _ => continue,
                    };
                    let what = format!("{isa} v {v} band {band:?}");
                    assert_eq!(got, expected, "{what}");
                    assert_eq!(m, masses, "{what}");
                    assert_eq!(listing.keys(), want_keys, "{what}");
                    assert_eq!(listing.ids(), want_ids, "{what}");
                }
                let f16: Vec<half::f16> = row.iter().map(|&p| half::f16::from_f32(p)).collect();
                let bf16: Vec<half::bf16> = row.iter().map(|&p| half::bf16::from_f32(p)).collect();
                check_listing(&f16, band);
                check_listing(&bf16, band);
            }
        }
    }

    /// [`classify_row`] on a row of another element type against its band's tokens picked one by
    /// one.
    fn check_listing<T: FloatElement>(row: &[T], band: Band) {
        let keys: Vec<u32> = row.iter().map(|&p| key_of(p)).collect();
        let (want_keys, want_ids): (Vec<u32>, Vec<u32>) = (0..row.len() as u32)
            .map(|id| (keys[id as usize], id))
            .filter(|&(k, _)| (band.low..band.high).contains(&k))
            .unzip();
        let mut masses = vec![0; row.len().div_ceil(BLOCK)];
        let mut listing = Listing::default();
        listing.reset(row.len());
        let (above, every) = classify_row(row, (band, false), &mut masses, &mut listing);
        let weights = |keep: &dyn Fn(u32) -> bool| -> u64 {
            keys.iter()
                .filter(|&&k| keep(k))
                .map(|&k| weight_of_key(k))
                .sum()
        };
        assert_eq!(above, weights(&|k| k >= band.high), "{band:?}");
        assert_eq!(every, weights(&|_| true), "{band:?}");
        assert_eq!(listing.keys(), want_keys, "{band:?}");
        assert_eq!(listing.ids(), want_ids, "{band:?}");
    }

    /// The band's histogram against its bins summed one token at a time, over chunk edges.
    #[test]
    fn the_histogram_sums_each_bin_exactly() {
        let mut lcg = Lcg(2029);
        for n in [0, 1, 63, 64, 65, 1000] {
            let (low, shift) = (0x3000_0000u32, 19);
            let keys: Vec<u32> = (0..n)
                .map(|_| low + (lcg.next_u64() % (1 << 26)) as u32)
                .collect();
            let mut want = vec![0u64; (1 << 26 >> shift) + 1];
            for &k in &keys {
                want[((k - low) >> shift) as usize] += weight_of_key(k);
            }
            let mut bins = vec![0u64; want.len()];
            histogram(&keys, low, shift, &mut bins);
            assert_eq!(bins, want, "n {n}");
            let mut bins = vec![0u64; want.len()];
            histogram_generic(&keys, low, shift, &mut bins);
            assert_eq!(bins, want, "generic, n {n}");
        }
    }

    /// The crossing bin and the tokens of a bin, a chunk at a time, against the walks one bin and
    /// one token at a time, at every target over bins of 0 to 37 (chunk edges, empty bins).
    #[test]
    fn the_chunked_walks_equal_the_plain_ones() {
        let mut lcg = Lcg(2030);
        for len in [1usize, 7, 8, 9, 16, 37] {
            let bins: Vec<u64> = (0..len)
                .map(|_| {
                    if lcg.unit() < 0.3 {
                        0
                    } else {
                        lcg.next_u64() % 1000
                    }
                })
                .collect();
            let above = lcg.next_u64() % 100;
            let total = above + bins.iter().sum::<u64>();
            for target in 0..=total + 1 {
                let mut running = above;
                let plain = (0..len).rev().find(|&b| {
                    let reached = running + bins[b] >= target;
                    running += if reached { 0 } else { bins[b] };
                    reached
                });
                let want = plain.map(|b| (b, running));
                assert_eq!(
                    crossing_bin(&bins, above, target),
                    want,
                    "len {len} target {target}"
                );
            }
        }
        let (low, shift) = (0x3000_0000u32, 20);
        let mut band = Listing::default();
        band.reset(3000);
        for id in 0..1000u32 {
            band.push_key(low + (lcg.next_u64() % (40 << shift)) as u32, id * 3);
        }
        assert_eq!(band.id_of(999), 2997);
        assert_eq!(band.id_of(1000), 0);
        for bin in [0, 1, 17, 39, 40] {
            let mut got = Vec::new();
            bin_tokens(&band, (low, shift), bin, &mut got);
            // Places in the listing, and their ids.
            let got: Vec<(u32, u32)> = got
                .iter()
                .map(|&(k, at)| (k, band.id_of(at as usize)))
                .collect();
            let want: Vec<(u32, u32)> = band
                .keys()
                .iter()
                .zip(band.ids())
                .filter(|&(&k, _)| ((k - low) >> shift) as usize == bin)
                .map(|(&k, id)| (k, id))
                .collect();
            assert_eq!(got, want, "bin {bin}");
            assert_eq!(want.is_empty(), bin == 40, "bin {bin}");
        }
    }

    #[test]
    fn the_band_path_equals_the_histogram_path() {
        let mut lcg = Lcg(77);
        for v in [5000, 40_000, 151_936] {
            for (i, row) in rows(&mut lcg, v).iter().enumerate() {
                let total: u64 = row.iter().map(|&p| weight(p)).sum();
                for top_p in [0.9f32, 0.5, 0.99, 0.999, 0.01] {
                    let draw = lcg.next_u64();
                    let expected = sample_prob_row_histogram(row, 0, top_p, draw);
                    let got = sample_top_p(row, total, top_p_fixed(top_p), draw);
                    assert_eq!(got, Some(expected), "v {v} row {i} top_p {top_p}");
                    let half: Vec<half::f16> =
                        row.iter().map(|&p| half::f16::from_f32(p)).collect();
                    let total: u64 = half.iter().map(|p| weight(p.to_f32())).sum();
                    if total > 0 {
                        let expected = sample_prob_row_histogram(&half, 0, top_p, draw);
                        let got = sample_top_p(&half, total, top_p_fixed(top_p), draw);
                        assert_eq!(got, Some(expected), "f16, v {v} row {i} top_p {top_p}");
                    }
                }
            }
        }
    }
}

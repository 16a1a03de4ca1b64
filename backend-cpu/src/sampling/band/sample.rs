//! The band's sample: runs of [`SAMPLE_RUN`] consecutive tokens spread over the row, whose rank
//! keys place the band and say whether the kept set is wide (`one_pass`).
//!
//! The keys are gathered first, in vector lanes ([`take_keys`]). A row the sample calls narrow
//! needs nothing more than a few compare-and-count passes over them, one masked sum and a walk of
//! the few keys near the top to place its floor ([`narrow_floor`]): no bins. Only a row that may be wide (or the two-pass band path) sums
//! the sampled weights into the bins of levels ([`bin_keys`]) from which [`band_from`] places the
//! band.

use specula_backend_api::FloatElement;

use super::{Band, SAMPLE_RUN, SAMPLES, SIGMAS, band_bins};
use crate::sampling::histogram::MIN_WEIGHT_KEY;
use crate::sampling::scan::{band_of, dispatched, key_of};
#[cfg(target_arch = "x86_64")]
use crate::sampling::scan::{has_avx2, has_avx512};

/// Bins of the band's sample: `2^SAMPLE_SHIFT` keys each, sixty-four per octave.
const SAMPLE_SHIFT: u32 = 17;
/// The first key of the sample's bins.
const FIRST_BIN: u32 = MIN_WEIGHT_KEY >> SAMPLE_SHIFT;
/// The index of the last bin (the keys from `1.0`'s on; sanitized keys are at most `1.0`'s).
const LAST_BIN: u32 = (1.0f32.to_bits() >> SAMPLE_SHIFT) - FIRST_BIN;
/// `2^40`, the scale of a probability's weight, in f32.
const WEIGHT_SCALE: f32 = (1u64 << 40) as f32;

/// The first key of bin `bin` (for `bin = LAST_BIN + 1`, a key above every sanitized key).
const fn bin_key(bin: u32) -> u32 {
    (bin + FIRST_BIN) << SAMPLE_SHIFT
}

/// The bin of a key of at least [`MIN_WEIGHT_KEY`].
fn bin_of(key: u32) -> usize {
    ((key >> SAMPLE_SHIFT) - FIRST_BIN).min(LAST_BIN) as usize
}

/// `weight_of_key(key)` as the passes compute it, in f64: exact in f32, widened exactly (`0` for
/// a key under [`MIN_WEIGHT_KEY`]).
#[inline(always)]
fn weight_f64(key: u32) -> f64 {
    f64::from((f32::from_bits(key) * WEIGHT_SCALE).floor())
}

/// The sample's keys in the order of the row, and their levels (`key >> SAMPLE_SHIFT`, which the
/// verdict counts in narrow lanes).
#[derive(Default)]
pub(super) struct SampleKeys {
    keys: Vec<u32>,
    levels: Vec<i16>,
    sampled: usize,
}

impl SampleKeys {
    /// The sampled keys.
    pub(super) fn keys(&self) -> &[u32] {
        &self.keys[..self.sampled]
    }

    /// The sampled tokens with a key at or above `key`, a bin boundary of the sample (or
    /// `MIN_WEIGHT_KEY`, or `u32::MAX`): the levels at or above its level, counted in lanes.
    pub(super) fn sampled_from(&self, key: u32) -> u32 {
        // At most `u32::MAX >> SAMPLE_SHIFT`, which fits.
        let level = (key >> SAMPLE_SHIFT) as i16;
        count_levels_from(&self.levels[..self.sampled], level)
    }
}

/// Gathers the rank keys of the sample's runs into `out`; returns how many row tokens each
/// sampled token stands for.
pub(super) fn take_keys<T: FloatElement>(row: &[T], out: &mut SampleKeys) -> f64 {
    if out.keys.len() < SAMPLES {
        out.keys.resize(SAMPLES, 0);
        out.levels.resize(SAMPLES, 0);
    }
    let runs = (row.len() / SAMPLE_RUN).clamp(1, SAMPLES / SAMPLE_RUN);
    let step = row.len() / runs;
    prefetch_runs(row, runs, step);
    out.sampled = gather_keys(row, (runs, step), &mut out.keys, &mut out.levels);
    row.len() as f64 / out.sampled.max(1) as f64
}

dispatched!(
    /// The sample's runs' keys into `keys`; returns the tokens sampled. Compiled for the widest
    /// vector unit of the CPU.
    fn gather_keys [T: FloatElement]
        (row: &[T], at: (usize, usize), keys: &mut [u32], levels: &mut [i16]) -> usize
        = gather_keys_generic [T]
);

/// [`gather_keys`]: `runs` runs of [`SAMPLE_RUN`] tokens, `step` tokens apart.
#[inline(always)]
fn gather_keys_generic<T: FloatElement>(
    row: &[T],
    (runs, step): (usize, usize),
    keys: &mut [u32],
    levels: &mut [i16],
) -> usize {
    let mut sampled = 0;
    for i in 0..runs {
        let run = &row[i * step..(i * step + SAMPLE_RUN).min(row.len())];
        let at = sampled..sampled + run.len();
        let (out, out_levels) = (&mut keys[at.clone()], &mut levels[at]);
        if let (Ok(run), Ok(out), Ok(out_levels)) = (
            <&[T; SAMPLE_RUN]>::try_from(run),
            <&mut [u32; SAMPLE_RUN]>::try_from(&mut *out),
            <&mut [i16; SAMPLE_RUN]>::try_from(&mut *out_levels),
        ) {
            // A known length: a few vector steps, no remainder loop.
            keys_of(run, out, out_levels);
        } else {
            keys_of(run, out, out_levels);
        }
        sampled += run.len();
    }
    sampled
}

/// The rank keys of `values` and their levels into `out` and `levels` (as long).
#[inline(always)]
fn keys_of<T: FloatElement>(values: &[T], out: &mut [u32], levels: &mut [i16]) {
    for ((key, level), &v) in out.iter_mut().zip(levels).zip(values) {
        *key = key_of(v);
        // Sanitized keys are at most `1.0`'s: the level fits (`0x1fc0`).
        *level = (*key >> SAMPLE_SHIFT) as i16;
    }
}

/// Asks for the sample's runs before they are read: scattered over the row, each is a miss the
/// hardware prefetcher does not foresee, and one after the other they cost a row that is not in
/// the caches a memory latency each (the one-pass path takes the sample before any pass). Into
/// the second-level cache, which takes more misses at once than the first (the stage probe: the
/// keys of a cold row in 3.6–5.4 µs instead of 5.3–7.4).
#[inline]
fn prefetch_runs<T>(row: &[T], runs: usize, step: usize) {
    #[cfg(target_arch = "x86_64")]
    for i in 0..runs {
        let run = &row[i * step..(i * step + SAMPLE_RUN).min(row.len())];
        let (start, bytes) = (run.as_ptr().cast::<i8>(), std::mem::size_of_val(run));
        for offset in (0..bytes).step_by(64).chain([bytes.saturating_sub(1)]) {
            // SAFETY: a prefetch is a hint that never faults; the address lies inside `run`.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    start.wrapping_add(offset),
                );
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (row, runs, step);
}

/// Sums the sampled weights per level of the key (sixty-four bins per octave) into `bins` (sum
/// and sum of squares); keys under [`MIN_WEIGHT_KEY`] weigh nothing. (The bins' counts are the
/// levels' [`SampleKeys::sampled_from`].)
pub(super) fn bin_keys(keys: &[u32], bins: &mut Vec<(f64, f64)>) {
    bins.clear();
    bins.resize(LAST_BIN as usize + 1, (0.0, 0.0));
    bin_keys_into(keys, bins);
}

dispatched!(
    /// The loop of [`bin_keys`], compiled for the widest vector unit of the CPU (the weights'
    /// floor and widening are single instructions there).
    fn bin_keys_into [] (keys: &[u32], bins: &mut [(f64, f64)]) -> () = bin_keys_generic []
);

/// [`bin_keys_into`]: per chunk of keys, the weights, their squares and their bins in vector
/// lanes, then the sums bin by bin in the order of the keys (the sums are those of one loop over
/// the keys, bit for bit).
#[inline(always)]
fn bin_keys_generic(keys: &[u32], bins: &mut [(f64, f64)]) {
    const CHUNK: usize = 256;
    let mut weights = [(0.0f64, 0.0f64); CHUNK];
    let mut at = [0u16; CHUNK];
    for chunk in keys.chunks(CHUNK) {
        for ((&key, w), bin) in chunk.iter().zip(&mut weights).zip(&mut at) {
            // A key under MIN_WEIGHT_KEY weighs 0 and adds nothing (`+ 0.0` keeps the sums' bits).
            let weight = weight_f64(key);
            *w = (weight, weight * weight);
            *bin = bin_of(key.max(MIN_WEIGHT_KEY)) as u16;
        }
        for (&(w, square), &bin) in weights.iter().zip(&at).take(chunk.len()) {
            let bin = &mut bins[usize::from(bin)];
            bin.0 += w;
            bin.1 += square;
        }
    }
}

/// Places the band from the sample's bins: it spans the levels whose estimated mass below is
/// within four standard deviations and `slack` of `below` (`W − target`).
pub(super) fn band_from(bins: &[(f64, f64)], scale: f64, below: f64, slack: f64) -> Band {
    let (low_bin, high_bin) = band_bins(bins, scale, (below, below), slack, SIGMAS);
    let key = |bin: usize| bin_key(bin as u32);
    Band {
        low: low_bin.map_or(MIN_WEIGHT_KEY, key),
        high: high_bin.map_or(u32::MAX, key),
    }
}

/// How far, relatively, the test of [`narrow_floor`] must clear four standard deviations: far
/// above the rounding of a sum of 4096 squares in another order (`4096 · 2^-53`).
const NARROW_MARGIN: f64 = 1e-9;

/// A floor for the kept set of a narrow row: `Some` when the band [`band_from`] would place from
/// the bins of `sample` (each sampled token standing for `scale` row tokens) starts above all but
/// fewer than `wide_from` row tokens' worth of the sampled tokens — the verdict "narrow" of
/// `one_pass` — decided without the bins; `None` leaves the verdict to them.
///
/// The band's low end is the first bin past the levels whose estimated mass below is certainly
/// under `below` (four standard deviations and `slack`); that test fails from some level on, as
/// the mass and its spread only grow. Let `c` be the highest bin from which the sampled tokens
/// stand for at least `wide_from` row tokens. The row is narrow exactly when the test still holds
/// at `c`: then the band starts above `c`. The mass through `c` is a sum of integers under
/// `2^53`, exact in any order, so it equals the bins' walk's; the sum of squares differs by
/// rounding only, which [`NARROW_MARGIN`] covers. So `Some` here means the bins would say narrow
/// too.
///
/// The floor returned is the highest key the same test passes at, walking the few sampled keys
/// above `c` ([`raise_floor`]; `upper` is scratch): the row's tokens at or above it are likely to
/// hold `1 − below` of the mass. Only likely — the caller checks it exactly.
pub(super) fn narrow_floor(
    sample: &SampleKeys,
    scale: f64,
    (below, slack): (f64, f64),
    wide_from: f64,
    upper: &mut Vec<u32>,
) -> Option<u32> {
    let wide = |bin: u32| f64::from(sample.sampled_from(bin_key(bin))) * scale >= wide_from;
    // `wide(low)` (once checked) and not `wide(high)`: `low` becomes `c`.
    let (mut low, mut high) = (0, LAST_BIN + 1);
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if wide(mid) {
            low = mid;
        } else {
            high = mid;
        }
    }
    let certainly_under = |mass: f64, squares: f64| {
        let x = below - slack - mass * scale;
        x >= 0.0 && x * x >= 16.0 * scale * scale * squares * (1.0 + NARROW_MARGIN)
    };
    if low == 0 && !wide(0) {
        // Every sampled token from the first level on stands for fewer than `wide_from`.
        let under = (0.0, 0.0);
        return Some(raise_floor(
            sample.keys(),
            MIN_WEIGHT_KEY,
            under,
            certainly_under,
            upper,
        ));
    }
    let start = bin_key(low + 1);
    let under = sums_under(sample.keys(), start);
    certainly_under(under.0, under.1)
        .then(|| raise_floor(sample.keys(), start, under, certainly_under, upper))
}

/// The highest floor from `start` up such that the sampled weight under it still passes
/// `certainly_under` (it does under `start`, whose sum and sum of squares are `under`): the keys
/// at or above `start` in rising order, equal keys together, each passing key moving the floor
/// just above it. At most the key of 1.0.
fn raise_floor(
    keys: &[u32],
    start: u32,
    (mut mass, mut squares): (f64, f64),
    certainly_under: impl Fn(f64, f64) -> bool,
    upper: &mut Vec<u32>,
) -> u32 {
    band_of(keys, start, u32::MAX, upper);
    upper.sort_unstable();
    let mut floor = start;
    for run in upper.chunk_by(|a, b| a == b) {
        let (w, n) = (weight_f64(run[0]), run.len() as f64);
        mass += w * n;
        squares += w * w * n;
        if !certainly_under(mass, squares) {
            break;
        }
        floor = run[0] + 1;
    }
    floor.min(crate::sampling::scan::ONE_KEY)
}

dispatched!(
    /// The levels at or above `from`, counted in 16-bit lanes (at most [`SAMPLES`] levels),
    /// compiled for the widest vector unit of the CPU.
    fn count_levels_from [] (levels: &[i16], from: i16) -> u32 = count_levels_generic []
);

/// [`count_levels_from`].
#[inline(always)]
fn count_levels_generic(levels: &[i16], from: i16) -> u32 {
    levels
        .chunks(SAMPLES)
        .map(|chunk| u32::from(chunk.iter().map(|&l| u16::from(l >= from)).sum::<u16>()))
        .sum()
}

dispatched!(
    /// [`sums_under_generic`], compiled for the widest vector unit of the CPU.
    fn sums_under [] (keys: &[u32], limit: u32) -> (f64, f64) = sums_under_generic []
);

/// The sum and the sum of squares of the weights of the keys under `limit`, in lanes.
#[inline(always)]
fn sums_under_generic(keys: &[u32], limit: u32) -> (f64, f64) {
    const LANES: usize = 16;
    let weight = |key: u32| if key < limit { weight_f64(key) } else { 0.0 };
    let (mut mass, mut squares) = ([0.0f64; LANES], [0.0f64; LANES]);
    let mut chunks = keys.chunks_exact(LANES);
    for chunk in &mut chunks {
        for ((m, q), &key) in mass.iter_mut().zip(&mut squares).zip(chunk) {
            let w = weight(key);
            *m += w;
            *q += w * w;
        }
    }
    for (j, &key) in chunks.remainder().iter().enumerate() {
        let w = weight(key);
        mass[j] += w;
        squares[j] += w * w;
    }
    (mass.iter().sum(), squares.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::lcg::Lcg;
    use crate::sampling::scan::weight_of_key;

    /// The gathered keys are the rows' keys at the runs, whatever the row's length and type.
    #[test]
    fn the_gathered_keys_are_the_runs_keys() {
        let mut lcg = Lcg(4040);
        for v in [1, 31, 32, 33, 4095, 4096, 4097, 5000, 151_936] {
            let row: Vec<f32> = (0..v)
                .map(|i| match i % 97 {
                    0 => f32::NAN,
                    1 => -0.25,
                    2 => 3.0,
                    _ => lcg.unit().powi(6),
                })
                .collect();
            let mut keys = SampleKeys::default();
            let scale = take_keys(&row, &mut keys);
            let n = keys.sampled;
            let runs = (v / SAMPLE_RUN).clamp(1, SAMPLES / SAMPLE_RUN);
            let step = v / runs;
            let expected: Vec<u32> = (0..runs)
                .flat_map(|i| &row[i * step..(i * step + SAMPLE_RUN).min(v)])
                .map(|&p| key_of(p))
                .collect();
            assert_eq!(keys.keys(), &expected[..], "v {v}");
            let levels: Vec<i16> = expected
                .iter()
                .map(|&k| (k >> SAMPLE_SHIFT) as i16)
                .collect();
            assert_eq!(&keys.levels[..n], &levels[..], "v {v}");
            assert_eq!(scale, v as f64 / n as f64, "v {v}");
            let half: Vec<half::f16> = row.iter().map(|&p| half::f16::from_f32(p)).collect();
            take_keys(&half, &mut keys);
            let expected: Vec<u32> = (0..runs)
                .flat_map(|i| &half[i * step..(i * step + SAMPLE_RUN).min(v)])
                .map(|&p| key_of(p))
                .collect();
            assert_eq!(keys.keys(), &expected[..], "f16 v {v}");
        }
    }

    /// The bins are those of one plain loop over the keys, bit for bit (the weightless keys
    /// skipped).
    #[test]
    fn the_bins_are_a_plain_loops_bit_for_bit() {
        let mut lcg = Lcg(4041);
        for v in [7, 5000, 151_936] {
            let row: Vec<f32> = (0..v)
                .map(|i| match i % 89 {
                    0 => f32::NAN,
                    1 => 0.0,
                    2 => 1e-20,
                    3 => 1.0,
                    _ => lcg.unit().powi(5) * 1e-3,
                })
                .collect();
            let mut keys = SampleKeys::default();
            take_keys(&row, &mut keys);
            let mut bins = Vec::new();
            bin_keys(keys.keys(), &mut bins);
            let mut expected = vec![(0.0f64, 0.0f64); LAST_BIN as usize + 1];
            for &key in keys.keys().iter().filter(|&&k| k >= MIN_WEIGHT_KEY) {
                let w = weight_of_key(key) as f64;
                let bin = &mut expected[bin_of(key)];
                bin.0 += w;
                bin.1 += w * w;
            }
            let bits = |b: &[(f64, f64)]| -> Vec<(u64, u64)> {
                b.iter().map(|&(m, q)| (m.to_bits(), q.to_bits())).collect()
            };
            assert_eq!(bits(&bins), bits(&expected), "v {v}");
        }
    }
}

//! Top-p without top-k on a probability row, in ONE pass over the row.
//!
//! The band path needs the row's exact total `W` only through `W − target`, the mass below the
//! top-p threshold. A normalised row sums to about 1, so `W` is about `2^40` before any pass
//! (less one unit at most per token, for the floors, and the rounding of the normalisation: both
//! far inside [`SLACK`]). So the band's sample is taken first and the band placed with `W`
//! assumed `2^40`:
//!
//! - a row whose sample predicts a wide kept set (more tokens than the candidates of the fast
//!   path hold) gets a band around the threshold, if it is narrow enough to list ([`MAX_BAND`]);
//! - a row predicted narrow gets a band from a floor to the top ([`Band::from_floor`]): the floor
//!   is the highest key under which the sampled mass is still certainly below `W − target`
//!   (`sample::narrow_floor`), so the band is the kept set and a few more tokens, and the pass
//!   lists them only where a vector holds one.
//!
//! One pass ([`super::classify`]) then computes the exact total together with the band's
//! classify: the mass above the band per block, the band's tokens and their histogram. The exact
//! checks follow with the exact total: the mass above the band is under the target and the
//! band's tokens reach it. A band that missed them (a row far from summing to 1, a sample that
//! misled) is decided by the two-pass band path, with the exact total now known; correctness
//! never depends on the guess.
//!
//! Rows whose band the sample cannot place return [`OnePass::Unplaced`]: the caller takes the
//! scan and candidates path unchanged.

use specula_backend_api::FloatElement;
use specula_backend_api::fixed_point::top_p_target_mass;

use super::sample::{bin_keys, narrow_floor};
use super::{
    Band, SLACK, Scratch, band_from, classify, draw_kept, sample_with, take_keys, threshold,
    with_scratch,
};

/// The one pass is taken when the sampled tokens at or above the band's low end stand for at
/// least this many row tokens: a kept set of about this size or more, which the candidates of the
/// fast path (4096 at most) would hold only in part or at a cost of a second full read.
const WIDE_FROM: f64 = 4096.0;
/// ... unless the band would hold more than about this many tokens (a sample that cannot place
/// it, e.g. one whose mass below the threshold sits in a few sampled tokens): listing them costs
/// more than the scan, and the scan's candidates may hold the kept set.
const MAX_BAND: f64 = 32768.0;

/// The assumed total weight of a normalised row, `2^40`.
const ASSUMED_TOTAL: u64 = 1 << 40;

/// What [`sample_top_p_one_pass`] did with a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnePass {
    /// The sample could not place a band the pass can list: nothing was decided.
    Unplaced,
    /// Decided in the one pass (`None`: a row that weighs nothing, left to the histogram path).
    Decided(Option<usize>),
    /// The band placed for an assumed total missed the threshold: decided by the two-pass band
    /// path with the exact total (`None`: as [`super::sample_top_p`]).
    FellBack(Option<usize>),
}

impl OnePass {
    /// The token, when the row was decided here; `None` for [`OnePass::Unplaced`] too.
    pub(crate) fn token(self) -> Option<usize> {
        match self {
            OnePass::Unplaced => None,
            OnePass::Decided(token) | OnePass::FellBack(token) => token,
        }
    }
}

/// Samples a probability row under top-p `p_fixed` (below `2^24`) without top-k in one pass when
/// its sample predicts a wide kept set (see the module doc).
pub(crate) fn sample_top_p_one_pass<T: FloatElement>(
    row: &[T],
    p_fixed: u64,
    draw: u64,
) -> OnePass {
    with_scratch(|s| match predict(row, p_fixed, s) {
        Some(band) => decide(row, band, p_fixed, draw, s),
        None => OnePass::Unplaced,
    })
}

/// The band for a total of `2^40`, placed from the sample: from a floor to the top when the
/// sample predicts a narrow kept set, around the threshold when it predicts a wide one and a band
/// of at most [`MAX_BAND`] tokens; `None` otherwise.
fn predict<T: FloatElement>(row: &[T], p_fixed: u64, s: &mut Scratch) -> Option<Band> {
    let scale = take_keys(row, s);
    // The floors lose under one unit per token; the normalisation's rounding is inside SLACK.
    let below = (ASSUMED_TOTAL - top_p_target_mass(p_fixed, ASSUMED_TOTAL)) as f64;
    let slack = SLACK * ASSUMED_TOTAL as f64 + row.len() as f64;
    let limits = (below, slack);
    if let Some(floor) = narrow_floor(&s.keys, scale, limits, WIDE_FROM, &mut s.upper_keys) {
        return Some(Band::from_floor(floor));
    }
    bin_keys(s.keys.keys(), &mut s.sample);
    let band = band_from(&s.sample, scale, below, slack);
    let (from_low, from_high) = (
        s.keys.sampled_from(band.low),
        s.keys.sampled_from(band.high),
    );
    if f64::from(from_low) * scale < WIDE_FROM {
        // Narrow by the bins (the verdict without them is cautious).
        return Some(Band::from_floor(band.low));
    }
    let listable = f64::from(from_low - from_high) * scale <= MAX_BAND;
    listable.then_some(band)
}

/// The one pass over the row with `band`, then the exact checks with the exact total; the
/// two-pass band path when the band missed.
fn decide<T: FloatElement>(
    row: &[T],
    band: Band,
    p_fixed: u64,
    draw: u64,
    s: &mut Scratch,
) -> OnePass {
    let (above, total) = classify(row, band, s);
    if total == 0 {
        return OnePass::Decided(None);
    }
    let target = top_p_target_mass(p_fixed, total);
    if above < target
        && let Some((key, id, kept)) = threshold(s, above, target)
    {
        return OnePass::Decided(draw_kept(row, s, (key, id), kept, draw));
    }
    OnePass::FellBack(sample_with(row, total, p_fixed, draw, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::top_k_top_p_sample::sample_prob_row_histogram;
    use crate::sampling::band::{SAMPLE_RUN, SAMPLES, TOP, take_sample};
    use crate::sampling::histogram::MIN_WEIGHT_KEY;
    use crate::sampling::lcg::Lcg;
    use crate::sampling::scan::{key_of, weight_of_key};
    use specula_backend_api::fixed_point::top_p_fixed;

    /// The vocabulary of the bench's rows.
    const V: usize = 151_936;

    /// The softmax (in f64, rounded to f32) of normal logits N(0, σ²) at temperature `t`.
    fn softmax_row(lcg: &mut Lcg, v: usize, sigma: f64, t: f64) -> Vec<f32> {
        let logits: Vec<f64> = (0..v)
            .map(|_| {
                let (u, w) = (f64::from(lcg.unit()).max(1e-12), f64::from(lcg.unit()));
                sigma * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * w).cos()
            })
            .collect();
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = logits.iter().map(|l| ((l - max) / t).exp()).sum();
        logits
            .iter()
            .map(|l| (((l - max) / t).exp() / sum) as f32)
            .collect()
    }

    /// The top-p set's threshold `(key, id)` and size, by a sort (the contract's definition).
    fn threshold_of(row: &[f32], top_p: f32) -> ((u32, u32), usize) {
        let mut ranked: Vec<(u32, u32)> = row
            .iter()
            .enumerate()
            .map(|(i, &p)| (key_of(p), i as u32))
            .collect();
        ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let total: u64 = ranked.iter().map(|&(k, _)| weight_of_key(k)).sum();
        let target = top_p_target_mass(top_p_fixed(top_p), total);
        let mut mass = 0u64;
        let at = ranked
            .iter()
            .position(|&(k, _)| {
                mass += weight_of_key(k);
                mass >= target
            })
            .expect("a positive row reaches its target");
        (ranked[at], at + 1)
    }

    /// The row's shapes of `specula bench` and the band the one pass takes at top-p 0.9:
    /// `Some(true)` around the threshold (a wide kept set), `Some(false)` from a floor (a narrow
    /// one), `None` either.
    fn bench_shapes() -> [(&'static str, f64, f64, Option<bool>); 7] {
        [
            ("sigma 3.5 T 0.8", 3.5, 0.8, Some(false)),
            ("flat", 3.0, 1.0, Some(true)),
            ("kept~10", 5.1, 1.0, Some(false)),
            ("kept~100", 4.49, 1.0, Some(false)),
            ("kept~1k", 3.76, 1.0, Some(false)),
            ("kept~10k", 2.79, 1.0, Some(true)),
            ("kept~100k", 0.874, 1.0, Some(true)),
        ]
    }

    /// Checks `row` (and its f16 and bf16 roundings) at several top-p against the histogram path,
    /// and returns the f32 outcome at top-p 0.9.
    fn check_row(row: &[f32], draws: &mut Lcg, what: &str) -> OnePass {
        let mut at_0_9 = OnePass::Unplaced;
        for top_p in [0.9f32, 0.5, 0.99] {
            let draw = draws.next_u64();
            let got = sample_top_p_one_pass(row, top_p_fixed(top_p), draw);
            if top_p == 0.9 {
                at_0_9 = got;
            }
            if got != OnePass::Unplaced {
                let expected = sample_prob_row_histogram(row, 0, top_p, draw);
                assert_eq!(got.token(), Some(expected), "{what}, top_p {top_p}");
            }
            let f16: Vec<half::f16> = row.iter().map(|&p| half::f16::from_f32(p)).collect();
            let bf16: Vec<half::bf16> = row.iter().map(|&p| half::bf16::from_f32(p)).collect();
            let got = sample_top_p_one_pass(&f16, top_p_fixed(top_p), draw);
            if let Some(token) = got.token() {
                let expected = sample_prob_row_histogram(&f16, 0, top_p, draw);
                assert_eq!(token, expected, "f16 {what}, top_p {top_p}");
            }
            let got = sample_top_p_one_pass(&bf16, top_p_fixed(top_p), draw);
            if let Some(token) = got.token() {
                let expected = sample_prob_row_histogram(&bf16, 0, top_p, draw);
                assert_eq!(token, expected, "bf16 {what}, top_p {top_p}");
            }
        }
        at_0_9
    }

    #[test]
    fn bench_shapes_take_the_predicted_path_and_decide_as_the_histogram_path() {
        let (mut lcg, mut draws) = (Lcg(2832), Lcg(99));
        for (name, sigma, t, wide) in bench_shapes() {
            let row = softmax_row(&mut lcg, V, sigma, t);
            let outcome = check_row(&row, &mut draws, name);
            assert!(matches!(outcome, OnePass::Decided(Some(_))), "{name}");
            let band = predict(&row, top_p_fixed(0.9), &mut Scratch::default());
            let floor = band.is_some_and(|band| band.is_floor());
            assert!(wide.is_none_or(|wide| wide != floor), "{name}: {band:?}");
        }
    }

    #[test]
    fn peaked_and_tie_heavy_rows_decide_as_the_histogram_path() {
        let (mut lcg, mut draws) = (Lcg(2833), Lcg(98));
        // One token holds half the mass over a flat rest.
        let mut peaked: Vec<f32> = softmax_row(&mut lcg, V, 0.5, 1.0)
            .iter()
            .map(|p| p * 0.5)
            .collect();
        peaked[V / 3] = 0.5;
        check_row(&peaked, &mut draws, "peaked");
        // Probabilities rounded to a few values: long runs of ties across the band.
        for sigma in [0.874, 2.79, 3.0] {
            let row: Vec<f32> = softmax_row(&mut lcg, V, sigma, 1.0)
                .iter()
                .map(|&p| (p * V as f32 * 8.0).round() / (V as f32 * 8.0))
                .collect();
            let outcome = check_row(&row, &mut draws, &format!("ties σ {sigma}"));
            assert_ne!(outcome, OnePass::Unplaced, "ties σ {sigma}");
        }
        // NaN, negative and zero entries weigh nothing; an infinity weighs as 1.0 (total ≈ 2).
        let mut hostile = softmax_row(&mut lcg, V, 2.79, 1.0);
        for i in (5..V).step_by(997) {
            hostile[i] = [f32::NAN, -1.0, 0.0, -0.0][i % 4];
        }
        check_row(&hostile, &mut draws, "NaN, negative");
        hostile[V / 2 + 11] = f32::INFINITY;
        let outcome = check_row(&hostile, &mut draws, "infinity");
        assert!(matches!(outcome, OnePass::FellBack(Some(_))), "{outcome:?}");
    }

    /// Rows whose total is not about 1 mislead the band placed for `2^40`: the two-pass band path
    /// must decide them, and decide them as the histogram path does.
    #[test]
    fn rows_far_from_summing_to_one_fall_back() {
        let (mut lcg, mut draws) = (Lcg(2834), Lcg(97));
        let row = softmax_row(&mut lcg, V, 2.79, 1.0);
        for factor in [0.5f32, 2.0] {
            let scaled: Vec<f32> = row.iter().map(|p| p * factor).collect();
            let outcome = check_row(&scaled, &mut draws, &format!("sum {factor}"));
            assert!(matches!(outcome, OnePass::FellBack(Some(_))), "{outcome:?}");
        }
        // A heavy token between the sample's runs: the sample sees a normalised row, the row
        // sums to 1.6.
        let mut heavy = row.clone();
        heavy[V / 128 * 5 + 100] = 0.6;
        let outcome = check_row(&heavy, &mut draws, "heavy unsampled token");
        assert!(matches!(outcome, OnePass::FellBack(Some(_))), "{outcome:?}");
    }

    /// Narrow rows take a band from a floor; one whose floor turns out too high (a row summing to
    /// 0.2, for which the floor placed for a total of 1 leaves too little above it) falls back to
    /// the two-pass band path. Both decide as the histogram path does.
    #[test]
    fn narrow_rows_decide_from_a_floor_and_fall_back_when_it_is_too_high() {
        let (mut lcg, mut draws) = (Lcg(2837), Lcg(95));
        for sigma in [4.49, 5.1] {
            let row = softmax_row(&mut lcg, V, sigma, 1.0);
            let band = predict(&row, top_p_fixed(0.9), &mut Scratch::default());
            assert!(band.is_some_and(|b| b.is_floor()), "σ {sigma}: {band:?}");
            let outcome = check_row(&row, &mut draws, &format!("σ {sigma}"));
            assert!(matches!(outcome, OnePass::Decided(Some(_))), "{outcome:?}");
            let low: Vec<f32> = row.iter().map(|p| p * 0.2).collect();
            let band = predict(&low, top_p_fixed(0.9), &mut Scratch::default());
            assert!(
                band.is_some_and(|b| b.is_floor()),
                "σ {sigma}, sum 0.2: {band:?}"
            );
            let outcome = check_row(&low, &mut draws, &format!("σ {sigma}, sum 0.2"));
            assert!(matches!(outcome, OnePass::FellBack(Some(_))), "{outcome:?}");
        }
    }

    /// A row whose mass below the threshold the sample cannot weigh (its sampled runs start with
    /// heavy tokens): the band would span the row, so the row is left to the scan, which decides
    /// it as the histogram path does.
    #[test]
    fn a_band_the_sample_cannot_place_is_left_to_the_scan() {
        let step = V / (SAMPLES / SAMPLE_RUN);
        let row: Vec<f32> = (0..V)
            .map(|i| {
                if i % step == 0 {
                    0.85 / 128.0
                } else {
                    0.15 / (V - 128) as f32
                }
            })
            .collect();
        let mut s = Scratch::default();
        let band = predict(&row, top_p_fixed(0.9), &mut s);
        assert!(band.is_none(), "{band:?}");
        // The sample alone would call it wide: the cap on the band decides.
        let scale = take_sample(&row, &mut s);
        let below = (ASSUMED_TOTAL - top_p_target_mass(top_p_fixed(0.9), ASSUMED_TOTAL)) as f64;
        let placed = band_from(&s.sample, scale, below, SLACK * ASSUMED_TOTAL as f64);
        assert!(f64::from(s.keys.sampled_from(placed.low)) * scale >= WIDE_FROM);
        assert_eq!(
            sample_top_p_one_pass(&row, top_p_fixed(0.9), 5),
            OnePass::Unplaced
        );
        for (top_p, draw) in [(0.9f32, 5u64), (0.5, 77), (0.99, 1 << 63)] {
            let got = crate::sampling::fast::sample_prob_row_fast(&row, 0, top_p, draw, 1);
            let expected = sample_prob_row_histogram(&row, 0, top_p, draw);
            assert_eq!(got.unwrap_or(expected), expected, "top_p {top_p}");
        }
    }

    /// Bands whose ends fall exactly on the threshold's key: a band that holds it decides in the
    /// one pass, one that ends just below or starts just above it falls back; so does a band from
    /// a floor just above it.
    #[test]
    fn a_band_edge_on_the_threshold_key() {
        let (mut lcg, mut draws) = (Lcg(2835), Lcg(96));
        // Rounded: the threshold key is shared by many tokens (its id decides).
        let row: Vec<f32> = softmax_row(&mut lcg, V, 2.79, 1.0)
            .iter()
            .map(|&p| (p * V as f32 * 4.0).round() / (V as f32 * 4.0))
            .collect();
        for top_p in [0.9f32, 0.5] {
            let ((key, id), _) = threshold_of(&row, top_p);
            assert!(
                row.iter().filter(|&&p| key_of(p) == key).count() > 1,
                "the threshold key is tied"
            );
            let cases = [
                (key, key + 1, true),
                (key, u32::MAX, true),
                (MIN_WEIGHT_KEY, key + 1, true),
                (key + 1, u32::MAX, false),
                (MIN_WEIGHT_KEY, key, false),
                // From a floor to the top (the narrow rows' band, listed by the sparse loops).
                (key, TOP, true),
                (MIN_WEIGHT_KEY, TOP, true),
                (key + 1, TOP, false),
            ];
            for (low, high, decided) in cases {
                let draw = draws.next_u64();
                let mut s = Scratch::default();
                let outcome = decide(&row, Band { low, high }, top_p_fixed(top_p), draw, &mut s);
                let expected = sample_prob_row_histogram(&row, 0, top_p, draw);
                let what = format!("top_p {top_p}, band [{low:#x}, {high:#x}), threshold {id}");
                assert_eq!(outcome.token(), Some(expected), "{what}");
                assert_eq!(
                    matches!(outcome, OnePass::Decided(_)),
                    decided,
                    "{what}: {outcome:?}"
                );
            }
        }
    }

    /// The verdict "narrow" without bins is the bins' verdict (the band's low end against
    /// [`WIDE_FROM`]), on rows from a few tokens kept to all of them, short rows, and rows with
    /// many entries that weigh nothing.
    #[test]
    fn the_verdict_without_bins_is_the_bins_verdict() {
        let mut lcg = Lcg(2836);
        let mut s = Scratch::default();
        let (mut narrow, mut wide) = (0, 0);
        for v in [100, 3000, 40_000, V] {
            for sigma in [0.3, 0.874, 1.5, 2.79, 3.0, 3.5, 3.76, 4.49, 5.1, 8.0] {
                let mut row = softmax_row(&mut lcg, v, sigma, 1.0);
                if sigma == 1.5 {
                    // Most entries weigh nothing: the sample may hold too few weighty tokens.
                    row.iter_mut()
                        .enumerate()
                        .filter(|(i, _)| i % 64 != 0)
                        .for_each(|(i, p)| *p = [0.0, -1.0, f32::NAN, 1e-30][i % 4]);
                }
                for top_p in [0.9f32, 0.5, 0.99, 0.1, 0.999] {
                    let p_fixed = top_p_fixed(top_p);
                    let scale = take_sample(&row, &mut s);
                    let below = (ASSUMED_TOTAL - top_p_target_mass(p_fixed, ASSUMED_TOTAL)) as f64;
                    let slack = SLACK * ASSUMED_TOTAL as f64 + row.len() as f64;
                    let band = band_from(&s.sample, scale, below, slack);
                    let from_low = f64::from(s.keys.sampled_from(band.low)) * scale;
                    let fast =
                        narrow_floor(&s.keys, scale, (below, slack), WIDE_FROM, &mut Vec::new())
                            .is_some();
                    let what = format!("v {v} σ {sigma} top_p {top_p}: from low {from_low}");
                    assert_eq!(fast, from_low < WIDE_FROM, "{what}");
                    if fast {
                        narrow += 1;
                    } else {
                        wide += 1;
                    }
                }
            }
        }
        assert!(narrow >= 40 && wide >= 40, "narrow {narrow}, wide {wide}");
    }

    /// What the sample predicts on the bench's shapes (run with `--ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn predictions_on_the_bench_shapes() {
        let mut lcg = Lcg(9);
        for (name, sigma, t, _) in bench_shapes() {
            for r in 0..4 {
                let row = softmax_row(&mut lcg, V, sigma, t);
                let mut s = Scratch::default();
                let scale = take_sample(&row, &mut s);
                let p_fixed = top_p_fixed(0.9);
                let below = (ASSUMED_TOTAL - top_p_target_mass(p_fixed, ASSUMED_TOTAL)) as f64;
                let slack = SLACK * ASSUMED_TOTAL as f64 + row.len() as f64;
                let band = band_from(&s.sample, scale, below, slack);
                let from_low = f64::from(s.keys.sampled_from(band.low)) * scale;
                let from_high = f64::from(s.keys.sampled_from(band.high)) * scale;
                let (_, kept) = threshold_of(&row, 0.9);
                let in_band = row
                    .iter()
                    .filter(|&&p| (band.low..band.high).contains(&key_of(p)))
                    .count();
                let outcome = sample_top_p_one_pass(&row, p_fixed, 7);
                println!(
                    "{name} row {r}: kept {kept}, sampled from low ×scale {from_low:.0}, \
                     from high {from_high:.0}, band tokens {in_band}, {outcome:?}"
                );
            }
        }
    }

    /// Times a call per row index over the rows read from memory: µs a row.
    type ColdTimer<'a> = dyn FnMut(&mut dyn FnMut(usize)) -> f64 + 'a;

    /// Runs `probe` on each bench shape's 32 rows with a timer of cold calls
    /// ([`cold_micros`](crate::sampling::probe::cold_micros): `f(i)` for each row `i`, µs a row)
    /// and that timer's figure for a plain read of the rows, the probes' yardstick.
    fn cold_probe(mut probe: impl FnMut(&str, &[Vec<f32>], &mut ColdTimer<'_>, f64)) {
        use crate::sampling::probe::{cold_micros, evictor};
        let mut lcg = Lcg(9);
        let evict = evictor();
        for (name, sigma, t, _) in bench_shapes() {
            let rows: Vec<Vec<f32>> = (0..32)
                .map(|_| softmax_row(&mut lcg, V, sigma, t))
                .collect();
            let mut cold = |f: &mut dyn FnMut(usize)| cold_micros(rows.len(), &evict, f);
            let read = cold(&mut |i| {
                std::hint::black_box(rows[i].iter().map(|x| x.to_bits() as u64).sum::<u64>());
            });
            probe(name, &rows, &mut cold, read);
        }
    }

    /// The stages of a narrow row (the sample, the scan, the rest of the fast path) beside a
    /// read, one thread, cold rows, and the band path's classify with the band from the sampled
    /// low end to the top (run with `--ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn narrow_stage_costs() {
        use crate::sampling::probe::least_us;
        use crate::sampling::scan::Need;
        let p_fixed = top_p_fixed(0.9);
        cold_probe(|name, rows, cold, read| {
            let mut s = Scratch::default();
            let sample = cold(&mut |i| {
                std::hint::black_box(predict(&rows[i], p_fixed, &mut s));
            });
            let ((scanned, w_scan), (whole, w_whole)) = fast_path_costs(rows, cold, Need::Both, 0);
            // The band from the sampled low end up.
            let lows: Vec<u32> = rows
                .iter()
                .map(|row| {
                    let scale = take_sample(row, &mut s);
                    let below = (ASSUMED_TOTAL - top_p_target_mass(p_fixed, ASSUMED_TOTAL)) as f64;
                    let slack = SLACK * ASSUMED_TOTAL as f64 + row.len() as f64;
                    band_from(&s.sample, scale, below, slack).low
                })
                .collect();
            let top = |i: usize| Band::from_floor(lows[i]);
            let classified = cold(&mut |i| {
                std::hint::black_box(classify(&rows[i], top(i), &mut s));
            });
            let w_classify = least_us(50, &mut || {
                std::hint::black_box(classify(&rows[0], top(0), &mut s));
            });
            let listed: usize = (0..rows.len())
                .map(|i| {
                    classify(&rows[i], top(i), &mut s);
                    s.band.len
                })
                .sum::<usize>()
                / rows.len();
            let (_, kept) = threshold_of(&rows[0], 0.9);
            // What the one pass does with the rows: (floor bands, wide bands, unplaced),
            // fallbacks, tokens listed.
            let (mut ways, mut fell, mut listed_now) = ([0; 3], 0, 0);
            for row in rows {
                match predict(row, p_fixed, &mut s) {
                    Some(band) if band.is_floor() => ways[0] += 1,
                    Some(_) => ways[1] += 1,
                    None => ways[2] += 1,
                }
                fell += usize::from(matches!(
                    sample_top_p_one_pass(row, p_fixed, 7),
                    OnePass::FellBack(_)
                ));
                listed_now += with_scratch(|s| s.band.len);
            }
            println!(
                "  floor/wide/unplaced {ways:?}, fell back {fell}, listed {}",
                listed_now / rows.len()
            );
            println!(
                "{name}: cold per row: read {read:.1}, sample {sample:.1}, scan {scanned:.1}, \
                 whole {whole:.1}, classify from the low end {classified:.1} ({listed} tokens, \
                 kept {kept}); warm: scan {w_scan:.1}, whole {w_whole:.1}, classify {w_classify:.1}"
            );
        });
    }

    /// The scan (`need`) and the whole fast path at top-k `top_k` / top-p 0.9 over `rows`: each
    /// cold (`cold`) and warm (the first row, least of 50 calls), in µs a row.
    fn fast_path_costs(
        rows: &[Vec<f32>],
        cold: &mut ColdTimer<'_>,
        need: crate::sampling::scan::Need,
        top_k: i32,
    ) -> ((f64, f64), (f64, f64)) {
        use crate::sampling::fast::sample_prob_row_fast;
        use crate::sampling::probe::least_us;
        use crate::sampling::scan::{GroupSample, block_counts, scan};
        let (nb, nk) = block_counts(V);
        let (mut bm, mut gk, mut gp) = (vec![0u64; nb], vec![0u32; nk], vec![0u8; nk]);
        let mut scan_row = |i: usize| {
            let sample = GroupSample {
                keys: &mut gk,
                pos: &mut gp,
            };
            std::hint::black_box(scan(&rows[i], &mut bm, sample, need));
        };
        let scanned = (cold(&mut scan_row), least_us(50, &mut || scan_row(0)));
        let mut sample = |i: usize| {
            std::hint::black_box(sample_prob_row_fast(&rows[i], top_k, 0.9, 7, 1));
        };
        let whole = (cold(&mut sample), least_us(50, &mut || sample(0)));
        (scanned, whole)
    }

    /// Top-k 50 on the bench's shapes, one thread: the scan (the sample of two keys per group)
    /// and the whole fast path, cold and warm, beside a read (run with `--ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn top_k_costs() {
        use crate::sampling::scan::Need;
        cold_probe(|name, rows, cold, read| {
            let ((scanned, w_scan), (whole, w_whole)) =
                fast_path_costs(rows, cold, Need::Sample, 50);
            println!(
                "{name}: cold per row: read {read:.1}, scan {scanned:.1}, whole {whole:.1}; \
                 warm: scan {w_scan:.1}, whole {w_whole:.1}"
            );
        });
    }

    /// The stages of the one pass on the bench's shapes, one thread: warm (one row, least of 50
    /// calls) and cold (32 rows after a 400 MiB read, each row's least of 7, averaged), with a
    /// read of the rows beside them (run with `--ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn stage_costs() {
        use crate::sampling::fast::sample_prob_row_fast;
        use crate::sampling::probe::least_us;
        let p_fixed = top_p_fixed(0.9);
        cold_probe(|name, rows, cold, read| {
            let mut s = Scratch::default();
            let sample = cold(&mut |i| {
                std::hint::black_box(predict(&rows[i], p_fixed, &mut s));
            });
            let keys_cold = cold(&mut |i| {
                std::hint::black_box(take_keys(&rows[i], &mut s));
            });
            // The sample binned whatever the verdict (as before the verdict without bins).
            let binned = cold(&mut |i| {
                let scale = take_sample(&rows[i], &mut s);
                std::hint::black_box(band_from(&s.sample, scale, 1e11, 2e9));
            });
            let whole = cold(&mut |i| {
                std::hint::black_box(sample_prob_row_fast(&rows[i], 0, 0.9, 7, 1));
            });
            let row = &rows[0];
            let band = predict(row, p_fixed, &mut s);
            let w_sample = least_us(50, &mut || {
                std::hint::black_box(predict(row, p_fixed, &mut s));
            });
            let w_whole = least_us(50, &mut || {
                std::hint::black_box(sample_prob_row_fast(row, 0, 0.9, 7, 1));
            });
            let scale = take_keys(row, &mut s);
            let below = (ASSUMED_TOTAL - top_p_target_mass(p_fixed, ASSUMED_TOTAL)) as f64;
            let limits = (below, SLACK * ASSUMED_TOTAL as f64 + row.len() as f64);
            let mut upper = Vec::new();
            let w_take = least_us(50, &mut || {
                std::hint::black_box(take_sample(row, &mut s));
            });
            let w_keys = least_us(50, &mut || {
                std::hint::black_box(take_keys(row, &mut s));
            });
            let w_verdict = least_us(50, &mut || {
                std::hint::black_box(narrow_floor(&s.keys, scale, limits, WIDE_FROM, &mut upper));
            });
            let w_runs = least_us(50, &mut || {
                bin_keys(s.keys.keys(), &mut s.sample);
            });
            let w_place = least_us(50, &mut || {
                std::hint::black_box(band_from(&s.sample, scale, 1e11, 2e9));
            });
            let narrow = narrow_floor(&s.keys, scale, limits, WIDE_FROM, &mut upper).is_some();
            println!(
                "  take {w_take:.1} (keys {w_keys:.1}, bins {w_runs:.1}), verdict {w_verdict:.1} \
                 ({}), place {w_place:.1}",
                if narrow { "narrow" } else { "to the bins" }
            );

            let mut line = format!(
                "{name}: cold per row: read {read:.1}, sample {sample:.1} (keys {keys_cold:.1}; \
                 binned always {binned:.1}), \
                 whole {whole:.1} us; \
                 warm: sample {w_sample:.1}, whole {w_whole:.1}"
            );
            if let Some(band) = band {
                let mut pass = (0, 0);
                let w_classify = least_us(50, &mut || pass = classify(row, band, &mut s));
                let w_lanes = least_us(50, &mut || {
                    s.band.reset(row.len());
                    std::hint::black_box(super::super::classify_row(
                        row,
                        (band, s.light),
                        &mut s.masses,
                        &mut s.band,
                    ));
                });
                let (above, total) = classify(row, band, &mut s);
                let target = top_p_target_mass(p_fixed, total);
                let mut found = None;
                let w_threshold = least_us(50, &mut || found = threshold(&mut s, above, target));
                let (key, id, kept) = found.expect("the band holds the threshold");
                let masses = s.masses.clone();
                let w_draw = least_us(50, &mut || {
                    s.masses.copy_from_slice(&masses);
                    std::hint::black_box(draw_kept(row, &mut s, (key, id), kept, 7));
                });
                line += &format!(
                    ", classify {w_classify:.1} (lanes {w_lanes:.1}), threshold {w_threshold:.1}, \
                     draw {w_draw:.1}; band {} tokens",
                    s.band.len
                );
            }
            println!("{line}");
        });
    }

    /// The bench's batch of 64 rows on a pool of two pinned threads, cold (after a 400 MiB
    /// write), beside a plain read of the same rows by the same pool: the median over 15 calls of
    /// each, and their ratio, per shape (run with `--ignored --nocapture`; `SPECULA_PROBE_SHAPES`
    /// picks shapes by name prefix, comma-separated; `SPECULA_PROBE_K` a top-k, 0 unless set).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn batch_costs() {
        use crate::sampling::fast::sample_prob_row_fast;
        use crate::sampling::probe::evictor;
        use rayon::prelude::*;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .start_handler(crate::affinity::pin_current_thread)
            .build()
            .expect("a pool");
        let mut evict = evictor();
        let only = std::env::var("SPECULA_PROBE_SHAPES").unwrap_or_default();
        let top_k: i32 =
            std::env::var("SPECULA_PROBE_K").map_or(0, |k| k.parse().expect("a top-k"));
        let mut lcg = Lcg(9);
        let median = |mut t: Vec<f64>| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        };
        for (name, sigma, t, _) in bench_shapes() {
            if !only.is_empty() && !only.split(',').any(|p| name.starts_with(p)) {
                continue;
            }
            let distinct: Vec<Vec<f32>> =
                (0..8).map(|_| softmax_row(&mut lcg, V, sigma, t)).collect();
            let mut matrix = Vec::with_capacity(64 * V);
            for r in 0..64 {
                matrix.extend_from_slice(&distinct[r % 8]);
            }
            // The bench's eviction: a running sum written over 400 MiB (dirty lines).
            let mut time = |f: &(dyn Fn(&[f32]) + Sync)| {
                let mut acc = 0u64;
                for w in evict.iter_mut() {
                    acc = acc.wrapping_add(*w);
                    *w = acc;
                }
                let start = std::time::Instant::now();
                pool.install(|| matrix.par_chunks_exact(V).for_each(f));
                start.elapsed().as_secs_f64() * 1e6
            };
            let (mut ops, mut reads) = (Vec::new(), Vec::new());
            for _ in 0..15 {
                ops.push(time(&|row| {
                    std::hint::black_box(sample_prob_row_fast(row, top_k, 0.9, 7, 1));
                }));
                reads.push(time(&|row| {
                    std::hint::black_box(row.iter().map(|x| x.to_bits() as u64).sum::<u64>());
                }));
            }
            let (op, read) = (median(ops), median(reads));
            println!(
                "{name}: batch 64 op {op:.0} us, read {read:.0} us, ratio {:.2}",
                op / read
            );
        }
    }

    /// The classify pass alone and the whole one pass, cold (one thread, 32 rows after a 400 MiB
    /// read, each row's least of 7, averaged), beside a read (run with `--ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn classify_cold_costs() {
        let p_fixed = top_p_fixed(0.9);
        cold_probe(|name, rows, cold, read| {
            let mut s = Scratch::default();
            let bands: Vec<Band> = rows
                .iter()
                .map(|row| predict(row, p_fixed, &mut s).expect("placed"))
                .collect();
            let classified = cold(&mut |i| {
                std::hint::black_box(classify(&rows[i], bands[i], &mut s));
            });
            let whole = cold(&mut |i| {
                std::hint::black_box(sample_top_p_one_pass(&rows[i], p_fixed, 7));
            });
            println!(
                "{name}: cold per row: read {read:.1}, classify {classified:.1}, whole {whole:.1}"
            );
        });
    }
}

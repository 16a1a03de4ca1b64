//! The contract's answers that no conformance golden case holds — those a draw decides, and rules
//! the golden cases do not reach — worked out by hand, on the reference device and on the CPU.
//!
//! The golden cases (`conformance/src/cases`, `golden::…`) run on every backend in the suite and on
//! the reference in `conformance/tests/golden_on_reference.rs`; they are not repeated here.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{
    HostStrategy, VerifyBatch, candidates, devices, logprobs, name, ngram, sample, softmax,
};
use specula_backend_api::Device;
use specula_backend_api::fixed_point::weight;
use specula_backend_api::rng::{Purpose, draw};

/// A seed whose `purpose` draw satisfies `want`.
fn seed_where(purpose: Purpose, want: impl Fn(u64) -> bool) -> u64 {
    (0u64..).find(|&s| want(draw(s, purpose))).unwrap()
}

#[test]
fn sampling_draws_walk_the_kept_set_in_id_order() {
    let seeds: Vec<u64> = (0..64).collect();
    let n = seeds.len();
    for dev in devices() {
        let dev = dev.as_ref();
        // A row that weighs nothing (every value below 2^-40, NaN): its first token in rank order.
        let row = [f32::NAN, 1e-13, 3e-13, 0.0];
        assert_eq!(
            sample(dev, &row, 4, &[0], &[0.5], &[2]),
            [2],
            "{}",
            name(dev)
        );

        // [0.25, 0.75]: rank order puts 1 first, but the draw walks ids in ascending order, so
        // token 0 is chosen iff t = floor(R · 2^40 / 2^64) < 2^38, i.e. R < 2^62.
        let probs: Vec<f32> = [0.25f32, 0.75].repeat(n);
        let got = sample(dev, &probs, 2, &vec![0; n], &vec![1.0; n], &seeds);
        for (&s, &token) in seeds.iter().zip(&got) {
            let r = draw(s, Purpose::Sample);
            assert_eq!(token, i32::from(r >= 1 << 62), "{}: seed {s}", name(dev));
        }
        assert!(got.contains(&0) && got.contains(&1));

        // top_p 0.7 of [0.1, 0.6, 0.3] keeps {1, 2} (0.6 < 0.7 ≤ 0.9): token 1 iff t < w(0.6).
        let probs: Vec<f32> = [0.1f32, 0.6, 0.3].repeat(n);
        let got = sample(dev, &probs, 3, &vec![0; n], &vec![0.7; n], &seeds);
        let (w1, w2) = (0.6f32 as f64 * 2f64.powi(40), 0.3f32 as f64 * 2f64.powi(40));
        let (w1, w2) = (w1.floor() as u128, w2.floor() as u128);
        for (&s, &token) in seeds.iter().zip(&got) {
            let t = (u128::from(draw(s, Purpose::Sample)) * (w1 + w2)) >> 64;
            assert_eq!(token, if t < w1 { 1 } else { 2 }, "{}: seed {s}", name(dev));
        }
    }
}

fn chi_square(observed: &[u64], expected_share: &[f64]) -> f64 {
    let n: u64 = observed.iter().sum();
    observed
        .iter()
        .zip(expected_share)
        .map(|(&o, &p)| {
            let e = p * n as f64;
            (o as f64 - e).powi(2) / e
        })
        .sum()
}

/// Over many seeds, the sampled tokens follow the kept weights (a chi-square test with fixed
/// seeds, so the verdict is deterministic).
#[test]
fn sampled_distribution_matches_the_kept_weights() {
    let row = [0.3f32, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02];
    let n = 40_000;
    let probs: Vec<f32> = row.repeat(n);
    let seeds: Vec<u64> = (0..n as u64).map(|i| 1_000_003 * i + 17).collect();
    // top_k 6 keeps 0.3 .. 0.08 (W = 0.93); top_p 0.9 needs 0.837: ids 0..=4 (0.85).
    let kept_mass: u64 = row[..5].iter().map(|&p| weight(p)).sum();
    let shares: Vec<f64> = row[..5]
        .iter()
        .map(|&p| weight(p) as f64 / kept_mass as f64)
        .collect();
    for dev in devices() {
        let dev = dev.as_ref();
        let tokens = sample(dev, &probs, row.len(), &vec![6; n], &vec![0.9; n], &seeds);
        let mut counts = [0u64; 5];
        for &t in &tokens {
            assert!((0..5).contains(&t), "{}: token {t} is not kept", name(dev));
            counts[t as usize] += 1;
        }
        // 4 degrees of freedom: the 0.999 quantile is 18.47.
        let chi2 = chi_square(&counts, &shares);
        assert!(
            chi2 < 18.47,
            "{}: chi-square {chi2} for {counts:?}",
            name(dev)
        );
    }
}

#[test]
fn candidates_lens_values_above_one_and_rows_without_weight() {
    let nan = f32::NAN;
    for dev in devices() {
        let dev = dev.as_ref();
        // C = 2 falls short of top_p 0.9: lens is the number of valid candidates.
        let row = [0.1f32, 0.4, 0.0, 0.3, 0.2, nan];
        let (ids, _, lens) = candidates(dev, &row, 6, &[0.9], 2);
        assert_eq!((ids, lens), (vec![1, 3], vec![2]), "{}", name(dev));
        // Values above 1 count as 1 (score 1); a device top_p of NaN counts as 1.0.
        let (ids, scores, lens) = candidates(dev, &[0.5, 7.0, 0.5], 3, &[nan], 3);
        assert_eq!(
            (ids, scores, lens),
            (vec![1, 0, 2], vec![1.0, 0.5, 0.5], vec![3]),
            "{}",
            name(dev)
        );
        // A row of weight 0: its first token in rank order (the largest tiny value), score 0,
        // lens 1.
        let (ids, scores, lens) = candidates(dev, &[1e-13, 3e-13, -1.0], 3, &[0.5], 2);
        assert_eq!(
            (ids, scores, lens),
            (vec![1, -1], vec![0.0, 0.0], vec![1]),
            "{}",
            name(dev)
        );
    }
}

#[test]
fn phase_two_tokens_and_the_topp_draw() {
    for dev in devices() {
        let dev = dev.as_ref();
        // An out-of-vocabulary target token in phase 2 is emitted as end_tokens[0].
        let batch = VerifyBatch::one_slot(&[1, 4], 100, HostStrategy::Greedy(vec![4, 100]));
        assert_eq!(batch.run(dev), (vec![4, 999], vec![2]), "{}", name(dev));
        // The phase-2 token that reaches max_dec_len becomes end_tokens[0].
        let mut batch = VerifyBatch::one_slot(&[1, 5], 100, HostStrategy::Greedy(vec![5, 30]));
        (batch.step_idx, batch.max_dec_len) = (vec![8], vec![10]);
        assert_eq!(batch.run(dev), (vec![5, 999], vec![2]), "{}", name(dev));

        // TOPP: draft 1 is among row 0's first 2 candidates; phase 2 draws among row 1's two
        // equal candidates: ids[0] iff t = floor(R · 2^40 / 2^64) < 2^39, i.e. R < 2^63.
        let topp = HostStrategy::TopP(vec![3, 1, 8, 9], vec![0.5; 4], vec![2, 2], 2);
        let batch = VerifyBatch::one_slot(&[0, 1], 10, topp);
        let r = draw(batch.seeds[1], Purpose::Candidate);
        let bonus = if r < 1 << 63 { 8 } else { 9 };
        assert_eq!(batch.run(dev), (vec![1, bonus], vec![2]), "{}", name(dev));
    }
}

/// REJECTION of draft `draft` after token 3 (V = 4, no top-k/top-p filter) with `seed` for the
/// draft's row: `(accept_tokens, accept_num)`.
fn rejection(
    dev: &dyn Device,
    target: &[f32],
    draft_row: &[f32],
    draft: i32,
    seed: u64,
) -> (Vec<i32>, Vec<i32>) {
    let strategy = HostStrategy::Rejection(
        target.to_vec(),
        draft_row.to_vec(),
        vec![0, 0],
        vec![1.0, 1.0],
    );
    let mut batch = VerifyBatch::one_slot(&[3, draft], 4, strategy);
    batch.seeds = vec![seed, seed + 4];
    batch.run(dev)
}

/// p = [½, ½, 0, 0] against q = [1, 0, 0, 0] (Wp = Wq = 2^40): `ρ = [0, 2^38, 0, 0]`, so every
/// resample is token 1 whatever the draw; row 1 is one-hot on 2. Draft 0: wq = 2^40, wp = 2^39:
/// accept iff U · 2^80 < 2^32 · 2^79, i.e. U < 2^31.
#[test]
fn rejection_accepts_by_the_accept_draw() {
    let target = [0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0];
    let q = [1.0, 0.0, 0.0, 0.0];
    let accepting = seed_where(Purpose::Accept, |r| r >> 32 < 1 << 31);
    let rejecting = seed_where(Purpose::Accept, |r| r >> 32 >= 1 << 31);
    for dev in devices() {
        let dev = dev.as_ref();
        let accepted = rejection(dev, &target, &q, 0, accepting);
        assert_eq!(accepted, (vec![0, 2], vec![2]), "{}", name(dev));
        let rejected = rejection(dev, &target, &q, 0, rejecting);
        assert_eq!(rejected, (vec![1, -1], vec![1]), "{}", name(dev));
    }
}

/// A target or draft row of total weight ≥ 2^41 is not a distribution: the draft is rejected and
/// the correction is the plain SAMPLE draw of the target row, even for a draft the target would
/// otherwise always accept.
#[test]
fn rejection_of_a_row_that_is_not_a_distribution_samples_the_target() {
    let cases: [(&[f32], &[f32], i32); 2] = [
        (&[1.0; 4], &[0.0, 1.0, 0.0, 0.0], 1),
        (&[0.5, 0.5, 0.0, 0.0], &[3.0, 1.0, 1.0, 1.0], 0),
    ];
    for dev in devices() {
        let dev = dev.as_ref();
        for (target, q, draft) in cases {
            let one_hot_2 = [0.0, 0.0, 1.0, 0.0];
            for seed in (0..16).map(|s| 0x9e37_79b9 * s + 5) {
                let (tokens, num) = rejection(dev, &[target, &one_hot_2].concat(), q, draft, seed);
                let expected = sample(dev, target, 4, &[0], &[1.0], &[seed]);
                assert_eq!(
                    (tokens[0], num),
                    (expected[0], vec![1]),
                    "{}: seed {seed}",
                    name(dev)
                );
            }
        }
    }
}

#[test]
fn ngram_matches_beyond_the_contract_examples() {
    for dev in devices() {
        let dev = dev.as_ref();
        let label = name(dev).to_owned();
        // No match anywhere: no drafts, this_time 1.
        let got = ngram(dev, (&[1, 2, 3], &[4, 5]), 3, 10);
        assert_eq!(got, (vec![-5, -5, -5], 1), "{label}");
        // Only the history matches (the self-match excluded): [8, 9] occurs at generated 0.
        let got = ngram(dev, (&[1, 2], &[8, 9, 4, 8, 9]), 3, 10);
        assert_eq!(got, (vec![4, 8, 9], 4), "{label}");
        // [5, 6] ends the prompt (no token after it there): the history match at 1 is used.
        let got = ngram(dev, (&[4, 5, 6], &[1, 5, 6, 9, 5, 6]), 2, 10);
        assert_eq!(got, (vec![9, 5, 6], 4), "{label}");
        // At step 2, n = 3 is skipped; [2, 3] (at 4, followed by 50) beats [3] (at 0).
        let got = ngram(dev, (&[3, 40, 0, 0, 2, 3, 50], &[2, 3]), 3, 10);
        assert_eq!(got, (vec![50, -5, -5], 2), "{label}");
        // max_dec_len − step_idx − 1 = 1 draft; none when the next token is the last allowed.
        let history = (&[1, 2, 3, 4, 5, 6, 7][..], &[1, 2][..]);
        assert_eq!(ngram(dev, history, 3, 4), (vec![3, -5, -5], 2), "{label}");
        assert_eq!(ngram(dev, history, 3, 3), (vec![-5, -5, -5], 1), "{label}");
    }
}

/// Softmax rows the golden cases leave out (`docs/semantics.md` §5.5): a +inf maximum at T = +inf,
/// a NaN device temperature, an all-NaN row at T = 0.
#[test]
fn softmax_special_rows_and_temperatures() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    for dev in devices() {
        let dev = dev.as_ref();
        let one_row = |row: &[f32], t: f32| softmax(dev, row, row.len(), &[t]);
        assert_eq!(
            one_row(&[inf, 1.0, 2.0], inf),
            [1.0, 0.0, 0.0],
            "{}",
            name(dev)
        );
        let row = [0.5, -1.0, 2.0];
        assert_eq!(one_row(&row, nan), one_row(&row, 1.0), "{}", name(dev));
        assert_eq!(one_row(&[nan; 3], 0.0), [1.0, 0.0, 0.0], "{}", name(dev));
    }
}

/// `accept_logprobs` of the special rows (the softmax rules, `docs/semantics.md` §5.11), with K
/// beyond V: a +inf row is uniform over its +inf entries, an all −inf / NaN row uniform over the
/// row; top-K is in logit order with NaN last, padded with −1 / −inf.
#[test]
fn logprobs_of_special_rows() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    #[rustfmt::skip]
    let rows = [
        inf, 1.0, inf, 0.0, nan,
        -inf, nan, -inf, -inf, -inf,
    ];
    let (half, fifth) = ((0.5f32).ln(), (0.2f32).ln());
    for dev in devices() {
        let dev = dev.as_ref();
        let out = logprobs(dev, &rows, 5, &[1.0, 1.0], &[0, 4], 7);
        assert_eq!(out.ranks, [1, 1], "{}", name(dev));
        #[rustfmt::skip]
        assert_eq!(out.top_ids, [0, 2, 1, 3, 4, -1, -1, 0, 2, 3, 4, 1, -1, -1], "{}", name(dev));
        let want = [half, fifth];
        #[rustfmt::skip]
        let want_top = [
            half, half, -inf, -inf, -inf, -inf, -inf,
            fifth, fifth, fifth, fifth, fifth, -inf, -inf,
        ];
        for (got, want) in [
            (&out.logprobs[..], &want[..]),
            (&out.top_logprobs, &want_top),
        ] {
            let close = |(a, b): (&f32, &f32)| a == b || (a - b).abs() < 1e-6;
            let all_close = got.len() == want.len() && got.iter().zip(want).all(close);
            assert!(all_close, "{}: {got:?}, want {want:?}", name(dev));
        }
    }
}

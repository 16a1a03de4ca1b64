//! `top_k_top_p_sample` and `top_p_candidates` against a naive sort-based reference, the sampled
//! distribution against the kept-set weights (chi-square, fixed seeds), REJECTION's preservation of
//! the target distribution, and batch invariance.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use half::{bf16, f16};
use specula_backend_api::fixed_point::{rank_key, reaches_top_p, scale_draw, top_p_fixed, weight};
use specula_backend_api::ops::*;
use specula_backend_api::rng::{Purpose, draw};
use specula_backend_api::{Buffer, DType, Device, DeviceExt, Element};
use specula_backend_cpu::CpuDevice;

fn device() -> CpuDevice {
    CpuDevice::with_threads(2).unwrap()
}

/// A small deterministic generator for test data (not the sampling RNG).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 29) as f32 / (1u64 << 24) as f32
    }
}

/// Rows with ties, zeros, NaN, negatives, values above 1 and all-zero rows.
fn hostile_row(g: &mut Lcg, vocab: usize, style: u64) -> Vec<f32> {
    (0..vocab)
        .map(|_| {
            let u = g.unit();
            match style % 5 {
                0 => u * u * u / vocab as f32,
                1 => (u * 4.0).floor() / 16.0,
                2 => match g.next() % 9 {
                    0 => f32::NAN,
                    1 => -u,
                    2 => 0.0,
                    3 => f32::INFINITY,
                    4 => 1.5,
                    _ => u / 50.0,
                },
                3 => 0.0,
                _ => 1e-13 * u, // below 2^-40: every weight is 0, the keys still rank
            }
        })
        .collect()
}

/// The rank order by a full sort: the definition the selection must agree with.
fn rank_order(row: &[f32]) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..row.len()).collect();
    ids.sort_by(|&a, &b| rank_key(row[b]).cmp(&rank_key(row[a])).then(a.cmp(&b)));
    ids
}

/// Contract §4.3 written the obvious way, with a sort.
fn reference_sample(row: &[f32], top_k: i32, top_p: f32, seed: u64) -> i32 {
    let order = rank_order(row);
    let v = row.len();
    let survivors = if top_k > 0 && (top_k as usize) < v {
        &order[..top_k as usize]
    } else {
        &order[..]
    };
    let total: u64 = survivors.iter().map(|&i| weight(row[i])).sum();
    if total == 0 {
        return order[0] as i32;
    }
    let p = top_p_fixed(top_p);
    let mut mass = 0;
    let mut kept = Vec::new();
    for &i in survivors {
        kept.push(i);
        mass += weight(row[i]);
        if reaches_top_p(mass, p, total) {
            break;
        }
    }
    kept.sort();
    let t = scale_draw(draw(seed, Purpose::Sample), mass);
    let mut cumulative = 0;
    for i in kept {
        cumulative += weight(row[i]);
        if cumulative > t {
            return i as i32;
        }
    }
    unreachable!("the draw is below the kept mass")
}

fn sample<T: Element>(
    dev: &CpuDevice,
    probs: &[T],
    vocab: usize,
    top_k: &[i32],
    top_p: &[f32],
    seed: &[u64],
) -> Vec<i32> {
    let rows = top_k.len();
    let probs = dev.upload(probs).unwrap();
    let (k, p, s) = (
        dev.upload(top_k).unwrap(),
        dev.upload(top_p).unwrap(),
        dev.upload(seed).unwrap(),
    );
    let mut tokens = dev.alloc::<i32>(rows).unwrap();
    dev.top_k_top_p_sample(
        &SampleInputs {
            probs: &probs,
            top_k: &k,
            top_p: &p,
            seed: &s,
        },
        &mut tokens,
        &SampleParams {
            shape: RowShape { rows, vocab },
            host_top_p: None,
        },
    )
    .unwrap();
    dev.download(&tokens).unwrap()
}

#[test]
fn sampling_matches_the_sort_based_reference() {
    let dev = device();
    let mut g = Lcg(7);
    for (case, &vocab) in [1usize, 2, 7, 97, 1000, 4099].iter().enumerate() {
        let top_ks = [0, 1, 5, vocab as i32, vocab as i32 + 3, -2];
        let top_ps = [0.0, 0.1, 0.5, 0.9, 1.0, f32::NAN, 0.999];
        let rows = 60;
        let mut probs = Vec::new();
        let (mut ks, mut ps, mut seeds) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rows {
            probs.extend(hostile_row(&mut g, vocab, (r + case) as u64));
            ks.push(top_ks[r % top_ks.len()]);
            ps.push(top_ps[(r / 2) % top_ps.len()]);
            seeds.push(g.next() ^ ((r as u64) << 60));
        }
        let expected: Vec<i32> = (0..rows)
            .map(|r| reference_sample(&probs[r * vocab..(r + 1) * vocab], ks[r], ps[r], seeds[r]))
            .collect();
        assert_eq!(
            sample(&dev, &probs, vocab, &ks, &ps, &seeds),
            expected,
            "f32, vocab {vocab}"
        );
        // f16 and bf16 inputs are widened exactly: the reference runs on the widened values.
        let half: Vec<f16> = probs.iter().map(|&p| f16::from_f32(p)).collect();
        let widened: Vec<f32> = half.iter().map(|p| p.to_f32()).collect();
        let expected: Vec<i32> = (0..rows)
            .map(|r| reference_sample(&widened[r * vocab..(r + 1) * vocab], ks[r], ps[r], seeds[r]))
            .collect();
        assert_eq!(
            sample(&dev, &half, vocab, &ks, &ps, &seeds),
            expected,
            "f16, vocab {vocab}"
        );
        let brain: Vec<bf16> = probs.iter().map(|&p| bf16::from_f32(p)).collect();
        let widened: Vec<f32> = brain.iter().map(|p| p.to_f32()).collect();
        let expected: Vec<i32> = (0..rows)
            .map(|r| reference_sample(&widened[r * vocab..(r + 1) * vocab], ks[r], ps[r], seeds[r]))
            .collect();
        assert_eq!(
            sample(&dev, &brain, vocab, &ks, &ps, &seeds),
            expected,
            "bf16, vocab {vocab}"
        );
    }
}

#[test]
fn hand_computed_samples() {
    let dev = device();
    let row = [0.1f32, 0.6, 0.3];
    let seeds: Vec<u64> = (0..64).map(|i| i * 4 + 1).collect();
    // top_k = 1 and a small top_p both keep only the most probable token.
    let n = seeds.len();
    let probs: Vec<f32> = row.iter().copied().cycle().take(3 * n).collect();
    assert!(
        sample(&dev, &probs, 3, &vec![1; n], &vec![1.0; n], &seeds)
            .iter()
            .all(|&t| t == 1)
    );
    assert!(
        sample(&dev, &probs, 3, &vec![0; n], &vec![0.5; n], &seeds)
            .iter()
            .all(|&t| t == 1)
    );
    // top_p 0.7 keeps {1, 2} (0.6 < 0.7 <= 0.9): token 0 never appears, both others do.
    let got = sample(&dev, &probs, 3, &vec![0; n], &vec![0.7; n], &seeds);
    assert!(got.iter().all(|&t| t == 1 || t == 2));
    assert!(got.contains(&1) && got.contains(&2));
    // The draw position for one seed, by hand: t = floor(R * C / 2^64) over ids in ascending order.
    let c = weight(0.6) + weight(0.3);
    let t = scale_draw(draw(5, Purpose::Sample), c);
    let expected = if t < weight(0.6) { 1 } else { 2 };
    assert_eq!(sample(&dev, &row, 3, &[0], &[0.7], &[5]), vec![expected]);
    // A row that weighs nothing gives the first token in rank order.
    assert_eq!(
        sample(
            &dev,
            &[0.0f32, f32::NAN, 1e-20, -1.0],
            4,
            &[0],
            &[0.9],
            &[3]
        ),
        vec![2]
    );
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

#[test]
fn sampled_distribution_matches_the_kept_weights() {
    let dev = device();
    let row = [0.3f32, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02];
    let n = 40_000;
    let probs: Vec<f32> = row.iter().copied().cycle().take(row.len() * n).collect();
    let seeds: Vec<u64> = (0..n as u64).map(|i| 1_000_003 * i + 17).collect();
    // top_k 6 keeps 0.3 .. 0.08 (W = 0.93); top_p 0.9 needs 0.837: ids 0..=4 (0.85).
    let tokens = sample(&dev, &probs, row.len(), &vec![6; n], &vec![0.9; n], &seeds);
    let mut counts = [0u64; 5];
    for &t in &tokens {
        assert!((0..5).contains(&t), "token {t} is outside the kept set");
        counts[t as usize] += 1;
    }
    let kept_mass: u64 = row[..5].iter().map(|&p| weight(p)).sum();
    let shares: Vec<f64> = row[..5]
        .iter()
        .map(|&p| weight(p) as f64 / kept_mass as f64)
        .collect();
    // 4 degrees of freedom: the 0.999 quantile is 18.47.
    let chi2 = chi_square(&counts, &shares);
    assert!(chi2 < 18.47, "chi-square {chi2} for counts {counts:?}");
}

/// Verifies one draft per slot with REJECTION and returns the first emitted token of each slot.
fn rejection_first_tokens(
    target: &[f32],
    draft: &[f32],
    drafts: &[i32],
    top_k: i32,
    top_p: f32,
) -> Vec<i32> {
    let dev = device();
    let vocab = target.len();
    let n = drafts.len();
    let s = 2;
    let draft_tokens: Vec<i32> = drafts.iter().flat_map(|&d| [0, d]).collect();
    let rows = 2 * n;
    let target_probs: Vec<f32> = target.iter().copied().cycle().take(rows * vocab).collect();
    let draft_probs: Vec<f32> = draft.iter().copied().cycle().take(n * vocab).collect();
    let cu: Vec<i32> = (0..=n as i32).map(|b| 2 * b).collect();
    let seeds: Vec<u64> = (0..rows as u64).map(|r| 0x9e37_79b9 * r + 5).collect();
    let up = |v: &[i32]| -> Buffer { dev.upload(v).unwrap() };
    let zeros8 = dev.alloc::<u8>(n).unwrap();
    let zeros = dev.alloc::<i32>(n).unwrap();
    let this_time = up(&vec![2; n]);
    let max_dec = up(&vec![1000; n]);
    let end = up(&[-5]);
    let (tp, dp) = (
        dev.upload(&target_probs).unwrap(),
        dev.upload(&draft_probs).unwrap(),
    );
    let (k, p) = (
        up(&vec![top_k; rows]),
        dev.upload(&vec![top_p; rows]).unwrap(),
    );
    let (dt, cu, seeds) = (up(&draft_tokens), up(&cu), dev.upload(&seeds).unwrap());
    let mut accept_tokens = dev.alloc::<i32>(n * s).unwrap();
    let mut accept_num = dev.alloc::<i32>(n).unwrap();
    dev.verify_draft_tokens(
        &VerifyInputs {
            draft_tokens: &dt,
            lens: SlotLens {
                seq_lens_this_time: &this_time,
                seq_lens_encoder: &zeros,
            },
            cu_seqlens_q_output: &cu,
            state: VerifySlotState {
                stop_flags: &zeros8,
                is_block_step: &zeros8,
                reasoning_status: &zeros,
                step_idx: &zeros,
                max_dec_len: &max_dec,
                end_tokens: &end,
            },
            seeds: &seeds,
            strategy: StrategyInputs::Rejection {
                target_probs: &tp,
                draft_probs: &dp,
                top_k: &k,
                top_p: &p,
            },
        },
        &mut VerifyOutputs {
            accept_tokens: &mut accept_tokens,
            accept_num: &mut accept_num,
        },
        &VerifyParams {
            dims: BatchDims {
                max_bsz: n,
                real_bsz: n,
                max_step_tokens: s,
            },
            rows,
            vocab,
            accept_all: false,
            reject_all: false,
            host: None,
        },
    )
    .unwrap();
    let tokens = dev.download::<i32>(&accept_tokens).unwrap();
    (0..n).map(|b| tokens[b * s]).collect()
}

#[test]
fn rejection_preserves_the_target_distribution() {
    let target = [0.35f32, 0.25, 0.2, 0.1, 0.06, 0.04];
    let draft = [0.1f32, 0.1, 0.3, 0.3, 0.1, 0.1];
    let n = 40_000;
    // Drafts drawn from the draft distribution by inverse CDF with an unrelated generator.
    let mut g = Lcg(99);
    let drafts: Vec<i32> = (0..n)
        .map(|_| {
            let u = g.unit();
            let mut acc = 0.0;
            draft
                .iter()
                .position(|&q| {
                    acc += q;
                    u < acc
                })
                .unwrap_or(draft.len() - 1) as i32
        })
        .collect();
    for (top_k, kept) in [(0, 6usize), (3, 3)] {
        let first = rejection_first_tokens(&target, &draft, &drafts, top_k, 1.0);
        let mut counts = vec![0u64; kept];
        for &t in &first {
            assert!(
                (t as usize) < kept,
                "token {t} outside the filtered target (top_k {top_k})"
            );
            counts[t as usize] += 1;
        }
        let mass: f64 = target[..kept].iter().map(|&p| f64::from(p)).sum();
        let shares: Vec<f64> = target[..kept]
            .iter()
            .map(|&p| f64::from(p) / mass)
            .collect();
        // 0.999 quantiles: 20.52 (5 degrees of freedom), 13.82 (2).
        let limit = if kept == 6 { 20.52 } else { 13.82 };
        let chi2 = chi_square(&counts, &shares);
        assert!(
            chi2 < limit,
            "top_k {top_k}: chi-square {chi2} for {counts:?}"
        );
    }
    // The draft really is tested: some drafts are rejected, most likely ones accepted more.
    let first = rejection_first_tokens(&target, &draft, &drafts, 0, 1.0);
    let differing = first.iter().zip(&drafts).filter(|(a, b)| a != b).count();
    assert!(
        differing > n / 10 && differing < n / 2,
        "{differing} corrections"
    );
}

#[test]
fn a_row_does_not_depend_on_its_batch() {
    let dev = device();
    let vocab = 1000;
    let mut g = Lcg(3);
    let target_row = hostile_row(&mut g, vocab, 0);
    let alone = sample(&dev, &target_row, vocab, &[40], &[0.9], &[12345]);
    for batch in [2usize, 5, 33] {
        for position in [0, batch / 2, batch - 1] {
            let mut probs = Vec::new();
            let (mut ks, mut ps, mut seeds) = (Vec::new(), Vec::new(), Vec::new());
            for r in 0..batch {
                if r == position {
                    probs.extend(&target_row);
                    ks.push(40);
                    ps.push(0.9);
                    seeds.push(12345);
                } else {
                    probs.extend(hostile_row(&mut g, vocab, r as u64));
                    ks.push(g.next() as i32 % 100);
                    ps.push(g.unit());
                    seeds.push(g.next());
                }
            }
            let got = sample(&dev, &probs, vocab, &ks, &ps, &seeds);
            assert_eq!(
                got[position], alone[0],
                "batch {batch}, position {position}"
            );
        }
    }
}

/// Contract §4.4 written the obvious way, with a sort.
fn reference_candidates(row: &[f32], top_p: f32, c: usize) -> (Vec<i32>, Vec<f32>, i32) {
    let order = rank_order(row);
    let total: u64 = row.iter().map(|&p| weight(p)).sum();
    let mut ids = vec![-1; c];
    let mut scores = vec![0.0; c];
    if total == 0 {
        ids[0] = order[0] as i32;
        return (ids, scores, 1);
    }
    let valid: Vec<usize> = order
        .into_iter()
        .filter(|&i| weight(row[i]) > 0)
        .take(c)
        .collect();
    let mut lens = valid.len() as i32;
    let mut mass = 0;
    for (k, &i) in valid.iter().enumerate() {
        ids[k] = i as i32;
        scores[k] = f32::from_bits(rank_key(row[i]));
        mass += weight(row[i]);
        if reaches_top_p(mass, top_p_fixed(top_p), total) && lens == valid.len() as i32 {
            lens = lens.min(k as i32 + 1);
        }
    }
    (ids, scores, lens)
}

#[test]
fn candidates_match_the_sort_based_reference() {
    let dev = device();
    let mut g = Lcg(11);
    for &(vocab, c) in &[(1usize, 1usize), (5, 8), (97, 3), (1000, 64), (4099, 128)] {
        let rows = 40;
        let mut probs = Vec::new();
        let mut ps = Vec::new();
        for r in 0..rows {
            probs.extend(hostile_row(&mut g, vocab, r as u64));
            ps.push([0.1f32, 0.5, 0.9, 1.0, 0.0][r % 5]);
        }
        // The last row is padding.
        let mut batch_id: Vec<i32> = (0..rows as i32).collect();
        batch_id[rows - 1] = -1;
        let probs_buf = dev.upload(&probs).unwrap();
        let (top_p, batch_buf) = (dev.upload(&ps).unwrap(), dev.upload(&batch_id).unwrap());
        let mut ids = dev.alloc::<i32>(rows * c).unwrap();
        let mut scores = dev.alloc::<f32>(rows * c).unwrap();
        let mut lens = dev.alloc::<i32>(rows).unwrap();
        dev.top_p_candidates(
            &CandidatesInputs {
                probs: &probs_buf,
                top_p: &top_p,
                batch_id_per_token_output: Some(&batch_buf),
            },
            &mut CandidatesOutputs {
                ids: &mut ids,
                scores: &mut scores,
                lens: &mut lens,
            },
            &CandidatesParams {
                shape: RowShape { rows, vocab },
                candidates: c,
                host_top_p: None,
            },
        )
        .unwrap();
        let (ids, scores, lens) = (
            dev.download::<i32>(&ids).unwrap(),
            dev.download::<f32>(&scores).unwrap(),
            dev.download::<i32>(&lens).unwrap(),
        );
        for r in 0..rows {
            let (e_ids, e_scores, e_lens) = if r == rows - 1 {
                (vec![-1; c], vec![0.0; c], 0)
            } else {
                reference_candidates(&probs[r * vocab..(r + 1) * vocab], ps[r], c)
            };
            assert_eq!(
                ids[r * c..(r + 1) * c],
                e_ids[..],
                "ids, vocab {vocab} row {r}"
            );
            assert_eq!(
                scores[r * c..(r + 1) * c],
                e_scores[..],
                "scores, vocab {vocab} row {r}"
            );
            assert_eq!(lens[r], e_lens, "lens, vocab {vocab} row {r}");
        }
    }
}

#[test]
fn every_float_dtype_is_supported() {
    let dev = device();
    for dtype in DType::FLOATS {
        assert!(
            dev.capabilities()
                .supports(specula_backend_api::Op::TopKTopPSample, dtype)
        );
    }
}

#[test]
fn rejection_of_a_row_that_is_not_a_distribution_samples_the_target() {
    // Total weight 4 · 2^40 >= 2^41: every draft is rejected and the correction is the plain SAMPLE
    // draw of the target row, even for a draft the target would otherwise always accept.
    let target = [1.0f32; 4];
    let n = 64;
    let first = rejection_first_tokens(&target, &[0.0, 1.0, 0.0, 0.0], &vec![1; n], 0, 1.0);
    for (b, &token) in first.iter().enumerate() {
        let seed = 0x9e37_79b9 * (2 * b as u64) + 5;
        assert_eq!(token, reference_sample(&target, 0, 1.0, seed), "slot {b}");
    }
    // A draft row that is not a distribution is rejected the same way.
    let target = [0.5f32, 0.5, 0.0, 0.0];
    let first = rejection_first_tokens(&target, &[3.0, 1.0, 1.0, 1.0], &vec![0; n], 0, 1.0);
    for (b, &token) in first.iter().enumerate() {
        let seed = 0x9e37_79b9 * (2 * b as u64) + 5;
        assert_eq!(token, reference_sample(&target, 0, 1.0, seed), "slot {b}");
    }
}

#[test]
fn zero_rows_are_a_valid_no_op() {
    let dev = device();
    let shape = RowShape { rows: 0, vocab: 32 };
    let empty_f32 = dev.alloc::<f32>(0).unwrap();
    let (empty_i32, empty_u64) = (dev.alloc::<i32>(0).unwrap(), dev.alloc::<u64>(0).unwrap());
    let mut tokens = dev.alloc::<i32>(0).unwrap();
    dev.top_k_top_p_sample(
        &SampleInputs {
            probs: &empty_f32,
            top_k: &empty_i32,
            top_p: &empty_f32,
            seed: &empty_u64,
        },
        &mut tokens,
        &SampleParams {
            shape,
            host_top_p: None,
        },
    )
    .unwrap();
    dev.argmax(&empty_f32, &mut tokens, &shape).unwrap();
    let mut probs = dev.alloc::<f32>(0).unwrap();
    dev.softmax(
        &empty_f32,
        &empty_f32,
        &mut probs,
        &SoftmaxParams {
            shape,
            host_temperature: None,
        },
    )
    .unwrap();
    let (mut ids, mut scores, mut lens) = (
        dev.alloc::<i32>(0).unwrap(),
        dev.alloc::<f32>(0).unwrap(),
        dev.alloc::<i32>(0).unwrap(),
    );
    dev.top_p_candidates(
        &CandidatesInputs {
            probs: &empty_f32,
            top_p: &empty_f32,
            batch_id_per_token_output: None,
        },
        &mut CandidatesOutputs {
            ids: &mut ids,
            scores: &mut scores,
            lens: &mut lens,
        },
        &CandidatesParams {
            shape,
            candidates: 4,
            host_top_p: None,
        },
    )
    .unwrap();
}

//! `process_logits`, the `fallback` input of the sampling ops and the token counts of
//! `update_state`, compared bit for bit with `specula_reference::ReferenceDevice` on random and
//! hostile inputs (garbage layouts, offsets, bad-word entries, ids, NaN / inf / subnormal
//! parameters and scores) from `specula_reference::fixtures`, under several launch shapes.
//! Without an OpenCL device every test is reported as ignored with the reason, and fails under
//! `SPECULA_REQUIRE=xpu-sim`.

mod common;

use common::open;

use std::process::ExitCode;

use specula_backend_api::DType;
use specula_backend_api::named_tests;
use specula_backend_api::ops::RowShape;
use specula_backend_api::testing::TestFn;
use specula_backend_xpu_sim::LaunchConfig;
use specula_reference::ReferenceDevice;
use specula_reference::fixtures::{
    self, ProcessCase, Rng, SampleCase, Shape, Spec, StateCase, compare_process, compare_sampling,
    compare_state,
};

type TestResult = Result<(), String>;

fn main() -> ExitCode {
    let tests: Vec<(&str, TestFn)> = named_tests![
        process_logits_matches_the_reference,
        process_logits_launch_shapes_agree,
        sampling_fallback_matches_the_reference,
        token_counts_match_the_reference,
    ];
    common::run_all_on_xpu_sim(tests)
}

/// A random case over `vocab` (a random small batch, `hostile` or not) seeded with `seed`.
fn generate(seed: u64, vocab: usize, dtype: DType, logits: bool, hostile: bool) -> ProcessCase {
    let rng = &mut Rng(seed);
    let shape = Shape::random(rng, vocab);
    ProcessCase::random(
        rng,
        &Spec {
            shape,
            dtype,
            logits,
            hostile,
            layout: None,
        },
    )
}

const VOCABS: [usize; 8] = [1, 2, 5, 31, 32, 33, 100, 1031];

fn process_logits_matches_the_reference() -> TestResult {
    let device = open(LaunchConfig::default())?;
    let reference = ReferenceDevice::new();
    let mut seed = 1u64;
    for vocab in VOCABS {
        for dtype in DType::FLOATS {
            for logits in [true, false] {
                for hostile in [false, true] {
                    for _ in 0..3 {
                        seed += 1;
                        let c = generate(seed, vocab, dtype, logits, hostile);
                        let what = format!("seed {seed} {}", c.label());
                        compare_process(&device, &reference, &c, &what)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Launch shapes with fewer work-groups and work-items than the rows and the vocabulary.
fn process_logits_launch_shapes_agree() -> TestResult {
    let reference = ReferenceDevice::new();
    for launch in [LaunchConfig::new(3, 5), LaunchConfig::new(2, 16)] {
        let device = open(launch)?;
        for (k, vocab) in [7usize, 33, 1031, 40_003].into_iter().enumerate() {
            for logits in [true, false] {
                for hostile in [false, true] {
                    let seed = 1000 + k as u64 * 10 + u64::from(logits) * 2 + u64::from(hostile);
                    let c = generate(seed, vocab, DType::F32, logits, hostile);
                    let what = format!("launch {launch}: seed {seed} {}", c.label());
                    compare_process(&device, &reference, &c, &what)?;
                }
            }
        }
    }
    Ok(())
}

/// The reference's processed rows and fallbacks feed both devices' sampling ops: all-masked rows
/// (fallback -1), rows whose unmasked tokens are all -inf, and garbage fallbacks.
fn sampling_fallback_matches_the_reference() -> TestResult {
    let device = open(LaunchConfig::default())?;
    let reference = ReferenceDevice::new();
    let mut seed = 5000u64;
    for vocab in [1usize, 5, 33, 300] {
        for logits in [true, false] {
            for hostile in [false, true] {
                for _ in 0..4 {
                    seed += 1;
                    let c = generate(seed, vocab, DType::F32, logits, hostile);
                    if c.rows == 0 {
                        continue;
                    }
                    let (processed, fallback) = fixtures::run_process(&reference, &c)
                        .map_err(|e| format!("reference process_logits: {e}"))?;
                    let values = processed.iter().map(|&b| f32::from_bits(b)).collect();
                    let shape = RowShape {
                        rows: c.rows,
                        vocab,
                    };
                    let s = SampleCase::new(
                        &mut Rng(seed),
                        values,
                        DType::F32,
                        logits,
                        shape,
                        fallback,
                        Some(c.batch_id[..c.rows].to_vec()),
                        hostile,
                    );
                    compare_sampling(&device, &reference, &s, &format!("seed {seed}"))?;
                }
            }
        }
    }
    Ok(())
}

fn token_counts_match_the_reference() -> TestResult {
    let device = open(LaunchConfig::default())?;
    let reference = ReferenceDevice::new();
    for seed in 0..200u64 {
        let c = StateCase::random(&mut Rng(seed));
        compare_state(&device, &reference, &c, &format!("seed {seed}"))?;
    }
    Ok(())
}

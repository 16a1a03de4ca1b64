//! Logits processing on the adapter against the reference device, bit for bit: `process_logits`
//! (`docs/semantics.md` §4c) over random and hostile inputs of every float dtype, the `fallback`
//! input of `top_k_top_p_sample` and `top_p_candidates`, and the token counts of `update_state`.
//! The cases come from `specula_reference::fixtures`, shared with the other backends' tests.
//!
//! Without a usable adapter the tests are listed as ignored with the reason, and fail under
//! `SPECULA_REQUIRE=wgpu` (`specula_backend_api::testing`).

use std::process::ExitCode;
use std::sync::Arc;

use specula_backend_api::ops::RowShape;
use specula_backend_api::testing::{self, Needs, TestFn};
use specula_backend_api::{DType, Device, Error};
use specula_reference::ReferenceDevice;
use specula_reference::fixtures::{
    self, ProcessCase, Rng, SampleCase, Shape, Spec, StateCase, compare_process, compare_sampling,
    compare_state,
};

/// Random and hostile cases of every mixed shape, dtype and layout.
fn process_logits_matches_the_reference(wgpu: Arc<dyn Device>) -> Result<(), String> {
    let mut rng = Rng(0x5eed_0001);
    let reference = ReferenceDevice::new();
    for round in 0..8 {
        for (i, &shape) in Shape::MIXED.iter().enumerate() {
            for dtype in DType::FLOATS {
                for logits in [true, false] {
                    for hostile in [false, true] {
                        let spec = Spec {
                            shape,
                            dtype,
                            logits,
                            hostile,
                            layout: None,
                        };
                        let c = ProcessCase::random(&mut rng, &spec);
                        let what = format!(
                            "round {round} shape {i} {dtype:?} logits {logits} hostile {hostile}"
                        );
                        compare_process(wgpu.as_ref(), &reference, &c, &what)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The sampling ops on rows where some weigh nothing, with fallbacks -1, 0 and tokens.
fn sampling_ops_yield_the_fallback(wgpu: Arc<dyn Device>) -> Result<(), String> {
    let mut rng = Rng(0x5eed_0002);
    let reference = ReferenceDevice::new();
    for vocab in [1usize, 5, 40, 300] {
        for dtype in DType::FLOATS {
            for logits in [true, false] {
                let rows = 12;
                let values = fixtures::weightless_rows(&mut rng, rows, vocab, logits);
                let fallback: Vec<i32> = (0..rows)
                    .map(|r| [-1, 0, (vocab - 1) as i32, 2.min(vocab as i32 - 1)][r % 4])
                    .collect();
                let shape = RowShape { rows, vocab };
                let c = SampleCase::new(
                    &mut rng, values, dtype, logits, shape, fallback, None, false,
                );
                let what = format!("vocab {vocab} {dtype:?} logits {logits}");
                compare_sampling(wgpu.as_ref(), &reference, &c, &what)?;
            }
        }
    }
    Ok(())
}

/// `process_logits` then the sampling ops with its `fallback`, on processed rows of random cases
/// (masked rows, min_p-dropped tokens): the adapter's samples and candidates equal the reference's.
fn processed_rows_sample_like_the_reference(wgpu: Arc<dyn Device>) -> Result<(), String> {
    let mut rng = Rng(0x5eed_0004);
    let reference = ReferenceDevice::new();
    for round in 0..6 {
        for (i, &shape) in Shape::MIXED.iter().enumerate() {
            for logits in [true, false] {
                let hostile = round % 2 == 1;
                let spec = Spec {
                    shape,
                    dtype: DType::F32,
                    logits,
                    hostile,
                    layout: None,
                };
                let c = ProcessCase::random(&mut rng, &spec);
                let what = format!("round {round} shape {i} logits {logits}");
                let (processed, fallback) = fixtures::run_process(wgpu.as_ref(), &c)
                    .map_err(|e| format!("{what}: wgpu: {e}"))?;
                let values: Vec<f32> = processed.iter().map(|&b| f32::from_bits(b)).collect();
                let shape = RowShape {
                    rows: c.rows,
                    vocab: c.vocab,
                };
                let batch_id = rng.chance(1, 2).then(|| c.batch_id[..c.rows].to_vec());
                let s = SampleCase::new(
                    &mut rng,
                    values,
                    DType::F32,
                    logits,
                    shape,
                    fallback,
                    batch_id,
                    hostile,
                );
                compare_sampling(wgpu.as_ref(), &reference, &s, &what)?;
            }
        }
    }
    Ok(())
}

fn update_state_counts_the_appended_tokens(wgpu: Arc<dyn Device>) -> Result<(), String> {
    let mut rng = Rng(0x5eed_0003);
    let reference = ReferenceDevice::new();
    for round in 0..60 {
        let c = StateCase::random(&mut rng);
        compare_state(wgpu.as_ref(), &reference, &c, &format!("round {round}"))?;
    }
    Ok(())
}

fn hand_made_rows_match_the_reference(wgpu: Arc<dyn Device>) -> Result<(), String> {
    let c = fixtures::hand_case();
    let reference = ReferenceDevice::new();
    compare_process(wgpu.as_ref(), &reference, &c, "hand case")?;
    let (processed, fallback) = fixtures::run_process(&reference, &c).map_err(|e| e.to_string())?;
    // Row 2 is all masked; row 3's unmasked tokens (0 and 1) are all -inf.
    if fallback[2] != -1 || fallback[3] != 0 {
        return Err(format!("reference fallback {fallback:?}"));
    }
    // Row 1 (history 3, 4, 7) bans 8; row 0 (history 3, 4) does not.
    let neg_inf = f32::NEG_INFINITY.to_bits();
    if processed[c.vocab + 8] != neg_inf || processed[8] == neg_inf {
        return Err(format!("bad word rows: {processed:?}"));
    }
    Ok(())
}

/// A test body.
type Body = fn(Arc<dyn Device>) -> Result<(), String>;

fn main() -> ExitCode {
    let opened = specula_backend_wgpu::open(0);
    let availability = match &opened {
        Err(Error::Unavailable { reason, .. }) => Err(reason.clone()),
        Ok(d) if !d.desc().capabilities.processing => {
            Err("the adapter binds too few storage buffers for logits processing".to_owned())
        }
        _ => Ok(()),
    };
    let needs = Needs::new("wgpu", availability);
    let device = opened.map_err(|e| format!("opening wgpu: {e}"));
    let tests: [(&str, Body); 5] = [
        (
            "process_logits_matches_the_reference",
            process_logits_matches_the_reference,
        ),
        (
            "hand_made_rows_match_the_reference",
            hand_made_rows_match_the_reference,
        ),
        (
            "processed_rows_sample_like_the_reference",
            processed_rows_sample_like_the_reference,
        ),
        (
            "sampling_ops_yield_the_fallback",
            sampling_ops_yield_the_fallback,
        ),
        (
            "update_state_counts_the_appended_tokens",
            update_state_counts_the_appended_tokens,
        ),
    ];
    let tests: Vec<(&str, TestFn)> = tests
        .into_iter()
        .map(|(name, body)| {
            let device = device.clone();
            let test: TestFn = Box::new(move || body(device?));
            (name, test)
        })
        .collect();
    testing::run(&needs, tests)
}

//! The known answers of `docs/semantics.md` §4b on the adapter: `top_p_candidates` over the contract's logits
//! row at its four temperatures reports, for every token of nonzero weight, the exact share
//! `q · 2^-40` of the contract's integer weights (`q = floor(w · 2^40 / W)` cut to 24 significant
//! bits), in rank order.
//!
//! Without a usable adapter the test is listed as ignored with the reason, and fails under
//! `SPECULA_REQUIRE=wgpu` (`specula_backend_api::testing`).

mod common;

use std::process::ExitCode;
use std::sync::Arc;

use specula_backend_api::ops::{
    CandidatesInputs, CandidatesOutputs, CandidatesParams, RowShape, Scores,
};
use specula_backend_api::{Device, DeviceExt};

/// The logits row of the contract's known answers.
const KNOWN: [f32; 8] = [2.0, 1.0, 0.0, -1.5, f32::NEG_INFINITY, f32::NAN, 2.0, -30.0];
const FULL: u64 = 1 << 40;

/// The temperatures of the known answers and the weights the contract gives for them.
fn known_answers() -> [(f32, [u64; 8]); 4] {
    [
        (
            1.0,
            [
                FULL,
                404_487_729_152,
                148_802_721_408,
                33_202_374_448,
                0,
                0,
                FULL,
                0,
            ],
        ),
        (
            0.7,
            [
                FULL,
                263_499_105_408,
                63_147_831_776,
                7_408_450_640,
                0,
                0,
                FULL,
                0,
            ],
        ),
        (
            2.5,
            [
                FULL,
                737_024_699_904,
                494_042_421_504,
                271_136_238_848,
                0,
                0,
                FULL,
                3_035_501,
            ],
        ),
        (0.0, [FULL, 0, 0, 0, 0, 0, 0, 0]),
    ]
}

/// The score of weight `w` in a row of total `total`: `q = floor(w · 2^40 / total)` cut to its 24
/// most significant bits, as `q · 2^-40`.
fn share(w: u64, total: u64) -> f32 {
    let q = ((u128::from(w) << 40) / u128::from(total)) as u64;
    let low = (64 - q.leading_zeros()).saturating_sub(24);
    let q = q >> low << low;
    (q as f64 / FULL as f64) as f32
}

/// The expected ids and scores of one row: nonzero weights in rank order (weight descending, id
/// ascending; the contract's row ranks so), padded to 8 with -1 / 0.
fn expected(weights: &[u64; 8]) -> (Vec<i32>, Vec<f32>) {
    let total: u64 = weights.iter().sum();
    let mut order: Vec<usize> = (0..8).filter(|&i| weights[i] > 0).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(weights[i]), i));
    let mut ids: Vec<i32> = order.iter().map(|&i| i as i32).collect();
    let mut scores: Vec<f32> = order.iter().map(|&i| share(weights[i], total)).collect();
    ids.resize(8, -1);
    scores.resize(8, 0.0);
    (ids, scores)
}

fn candidate_scores_are_the_contract_shares(wgpu: Arc<dyn Device>) -> Result<(), String> {
    let answers = known_answers();
    let rows = answers.len();
    let logits: Vec<f32> = (0..rows).flat_map(|_| KNOWN).collect();
    let temperature: Vec<f32> = answers.iter().map(|a| a.0).collect();
    let top_p = vec![1.0f32; rows];
    let run = || -> specula_backend_api::Result<(Vec<i32>, Vec<f32>, Vec<i32>)> {
        let l = wgpu.upload(&logits)?;
        let t = wgpu.upload(&temperature)?;
        let p = wgpu.upload(&top_p)?;
        let mut ids = wgpu.alloc::<i32>(rows * 8)?;
        let mut scores = wgpu.alloc::<f32>(rows * 8)?;
        let mut lens = wgpu.alloc::<i32>(rows)?;
        wgpu.top_p_candidates(
            &CandidatesInputs::new(Scores::logits(&l, &t), &p),
            &mut CandidatesOutputs {
                ids: &mut ids,
                scores: &mut scores,
                lens: &mut lens,
            },
            &CandidatesParams {
                shape: RowShape { rows, vocab: 8 },
                candidates: 8,
                host_top_p: None,
            },
        )?;
        wgpu.synchronize()?;
        Ok((
            wgpu.download(&ids)?,
            wgpu.download(&scores)?,
            wgpu.download(&lens)?,
        ))
    };
    let (ids, scores, lens) = run().map_err(|e| e.to_string())?;
    for (r, (t, weights)) in answers.iter().enumerate() {
        let (want_ids, want_scores) = expected(weights);
        let got_ids = &ids[r * 8..(r + 1) * 8];
        let got_scores = &scores[r * 8..(r + 1) * 8];
        if got_ids != want_ids.as_slice() {
            return Err(format!("T = {t}: ids {got_ids:?}, expected {want_ids:?}"));
        }
        let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        if bits(got_scores) != bits(&want_scores) {
            return Err(format!(
                "T = {t}: scores {got_scores:?}, expected {want_scores:?}"
            ));
        }
        // top_p = 1 keeps every token of nonzero weight.
        let valid = want_ids.iter().filter(|&&id| id >= 0).count() as i32;
        if lens[r] != valid {
            return Err(format!("T = {t}: lens {}, expected {valid}", lens[r]));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    common::run_on_wgpu(
        "candidate_scores_are_the_contract_shares",
        candidate_scores_are_the_contract_shares,
    )
}

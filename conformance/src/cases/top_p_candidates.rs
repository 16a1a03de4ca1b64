//! Cases of `top_p_candidates` (`docs/semantics.md` §5.7).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;

use super::generate::{
    FLOAT_DTYPES, HOSTILE_TOP_P, Rng, f32s, float_tensor, hostile_logit_rows, hostile_prob_rows, i32s,
    logit_row, pick_temperature, prob_row, rows_with_ties, weightless_even_rows, with_score_rows,
};
use super::top_k_top_p_sample::pick_top_p;
use super::{Size, row_gens};
use crate::Result;
use crate::case::{TensorSpec, Want, scores_specs};
use crate::cases::Case;
use crate::exec::{OpCase, Runner};
use crate::tensor::HostTensor;

/// The parameters of a `top_p_candidates` case (the JSON header of a case file, beside `"op"`).
/// Inputs `probs`, `top_p`, optional `batch_id_per_token_output`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Rows.
    pub rows: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Candidates per row.
    pub candidates: usize,
    /// Logits with per-row temperatures (tensors `logits`, `temperature`) instead of `probs`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logits: bool,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let rows = self.rows;
        let mut specs = scores_specs(self.logits, ("probs", "logits"), rows, self.vocab);
        specs.extend([
            TensorSpec::new("top_p", Want::Is(DType::F32), rows),
            TensorSpec::i32("batch_id_per_token_output", rows).optional(),
            TensorSpec::i32("fallback", rows).optional(),
        ]);
        specs
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let Params {
            rows,
            vocab,
            candidates,
            ..
        } = *self;
        let device = r.device();
        let host_top_p = r.host::<f32>("top_p")?;
        let rows_in = r.scores(self.logits, "probs", "logits")?;
        let [top_p] = r.inputs(["top_p"])?;
        let batch_id = r.optional("batch_id_per_token_output")?;
        let fallback = r.optional("fallback")?;
        let [ids, scores, lens] = r.outputs([
            ("ids", DType::I32, &[rows, candidates]),
            ("scores", DType::F32, &[rows, candidates]),
            ("lens", DType::I32, &[rows]),
        ])?;
        device.top_p_candidates(
            &CandidatesInputs::new(rows_in.scores(), &top_p).with_batch_id(batch_id.as_ref()).with_fallback(fallback.as_ref()),
            &mut CandidatesOutputs { ids, scores, lens },
            &CandidatesParams {
                shape: RowShape { rows, vocab },
                candidates,
                host_top_p: host_top_p.as_deref(),
            },
        )?;
        Ok(())
    }
}

/// The candidate counts `C` the random cases cycle through, one per row shape.
const CANDIDATE_COUNTS: [usize; 5] = [1, 8, 20, 64, 128];

/// A case of `probs` in `dtype`, one row per entry of `top_p`.
pub(crate) fn case(
    name: String,
    dtype: DType,
    vocab: usize,
    candidates: usize,
    probs: &[f32],
    top_p: &[f32],
    batch_id: Option<&[i32]>,
) -> Case {
    rows_case(
        name,
        dtype,
        vocab,
        candidates,
        (probs, None),
        top_p,
        batch_id,
    )
}

/// A case of `logits` in `dtype` at the per-row `temperature`, one row per entry of `top_p`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn logits_case(
    name: String,
    dtype: DType,
    vocab: usize,
    candidates: usize,
    logits: &[f32],
    temperature: &[f32],
    top_p: &[f32],
    batch_id: Option<&[i32]>,
) -> Case {
    let scores = (logits, Some(temperature));
    rows_case(name, dtype, vocab, candidates, scores, top_p, batch_id)
}

/// A case of score rows (probabilities, or logits with their temperatures), one row per entry of
/// `top_p`.
fn rows_case(
    name: String,
    dtype: DType,
    vocab: usize,
    candidates: usize,
    (scores, temperature): (&[f32], Option<&[f32]>),
    top_p: &[f32],
    batch_id: Option<&[i32]>,
) -> Case {
    let rows = top_p.len();
    let params = Params {
        rows,
        vocab,
        candidates,
        logits: temperature.is_some(),
    };
    let case = with_score_rows(
        Case::new(name, params),
        dtype,
        [rows, vocab],
        scores,
        temperature,
    )
    .with("top_p", f32s(top_p));
    match batch_id {
        Some(batch_id) => case.with("batch_id_per_token_output", i32s(batch_id)),
        None => case,
    }
}

/// Logits rows (`docs/semantics.md` §4b) at every temperature, in every dtype and shape, hostile
/// logits, and the contract's known-answer row with its exact scores.
fn logits_cases(size: Size) -> Vec<Case> {
    let mut out = vec![logits_known_answers(), logits_rank_order_probes()];
    for dtype in FLOAT_DTYPES {
        for mut g in row_gens(size, "candidates/logits", dtype) {
            let (i, rng, rows, vocab) = (g.index, &mut g.rng, g.rows, g.vocab);
            let c = CANDIDATE_COUNTS[i % CANDIDATE_COUNTS.len()];
            let logits = rows_with_ties(rng, rows, |rng, _| logit_row(rng, vocab));
            let temperature: Vec<f32> = (0..rows).map(|_| pick_temperature(rng)).collect();
            let top_p: Vec<f32> = (0..rows).map(|_| pick_top_p(rng)).collect();
            let name = format!("logits::{}_c{c}", g.name());
            out.push(logits_case(
                name,
                dtype,
                vocab,
                c,
                &logits,
                &temperature,
                &top_p,
                None,
            ));
        }
        let mut rng = Rng::new(&format!("candidates/logits/hostile/{dtype}"), 1);
        let (rows, vocab) = (16, 1031);
        let logits = hostile_logit_rows(&mut rng, rows, vocab);
        let temperature: Vec<f32> = (0..rows)
            .map(|r| [f32::NAN, -2.0, 0.0, 1.0, f32::INFINITY, 1e-30, 0.7, 2.5][r % 8])
            .collect();
        let top_p: Vec<f32> = (0..rows).map(|_| pick_top_p(&mut rng)).collect();
        let batch_id: Vec<i32> = (0..rows as i32)
            .map(|r| if r % 5 == 4 { -1 } else { r })
            .collect();
        out.push(logits_case(
            format!("hostile::logits_{dtype}"),
            dtype,
            vocab,
            20,
            &logits,
            &temperature,
            &top_p,
            Some(&batch_id),
        ));
    }
    out
}

/// The exact score of a logits candidate (`docs/semantics.md` §4b): `q = floor(w · 2^40 / W)` cut
/// to its 24 most significant bits, as the f32 `q · 2^-40`.
fn exact_share(w: u64, total: u64) -> f32 {
    let q = ((u128::from(w) << 40) / u128::from(total)) as u64;
    let cut = (64 - q.leading_zeros()).saturating_sub(24);
    ((q >> cut << cut) as f64 / (1u64 << 40) as f64) as f32
}

/// The contract's known-answer row at T = 1 (top_p 1 and 0.5) and 2.5: the candidates in rank
/// order (the two maxima by id), their exact shares of the contract's weights, and lens.
fn logits_known_answers() -> Case {
    const F: u64 = 1 << 40;
    let row = [2.0, 1.0, 0.0, -1.5, f32::NEG_INFINITY, f32::NAN, 2.0, -30.0];
    let at_1 = [
        F,
        404_487_729_152,
        148_802_721_408,
        33_202_374_448,
        0,
        0,
        F,
        0,
    ];
    let at_2_5 = [
        F,
        737_024_699_904,
        494_042_421_504,
        271_136_238_848,
        0,
        0,
        F,
        3_035_501,
    ];
    let order = [0usize, 6, 1, 2, 3, 7, 4, 5];
    let scores_of = |w: &[u64; 8], n: usize| -> Vec<f32> {
        let total: u64 = w.iter().sum();
        (0..8)
            .map(|k| {
                if k < n {
                    exact_share(w[order[k]], total)
                } else {
                    0.0
                }
            })
            .collect()
    };
    let ids = |n: usize| -> Vec<i32> {
        (0..8)
            .map(|k| if k < n { order[k] as i32 } else { -1 })
            .collect()
    };
    let logits: Vec<f32> = (0..3).flat_map(|_| row).collect();
    let expected_ids = [ids(5), ids(5), ids(6)].concat();
    let expected_scores = [
        scores_of(&at_1, 5),
        scores_of(&at_1, 5),
        scores_of(&at_2_5, 6),
    ]
    .concat();
    logits_case(
        "golden::logits_known_answer_row".into(),
        DType::F32,
        8,
        8,
        &logits,
        &[1.0, 1.0, 2.5],
        &[1.0, 0.5, 1.0],
        None,
    )
    .expect("ids", HostTensor::new(&[3, 8], &expected_ids))
    .expect("scores", HostTensor::new(&[3, 8], &expected_scores))
    .expect("lens", i32s(&[5, 2, 6]))
}

/// Candidates follow the logits' own rank order (`docs/semantics.md` §4b step 1): in
/// `[1e30, 3e38, −1]` (both read as `2^64`, each half the weight) and `[1e-30, 2e-30, −50]` (both
/// +0) the larger logit is listed first; at T = 0 the argmax alone.
fn logits_rank_order_probes() -> Case {
    let logits = [1e30, 3e38, -1.0, 1e-30, 2e-30, -50.0, 1e30, 3e38, -1.0];
    let half = exact_share(1 << 40, 1 << 41);
    logits_case(
        "golden::logits_rank_order_probes".into(),
        DType::F32,
        3,
        3,
        &logits,
        &[1.0, 1.0, 0.0],
        &[1.0, 0.5, 1.0],
        None,
    )
    .expect("ids", HostTensor::new(&[3, 3], &[1, 0, -1, 1, 0, -1, 1, -1, -1]))
    .expect(
        "scores",
        HostTensor::new(&[3, 3], &[half, half, 0.0, half, half, 0.0, 1.0, 0.0, 0.0]),
    )
    .expect("lens", i32s(&[2, 1, 1]))
}

/// Rows whose total weight is 0 among ordinary ones and a padding row, with a `fallback` input
/// (`docs/semantics.md` §4c): an empty row lists its fallback alone (`lens` 1), or nothing for -1.
fn fallback_cases() -> Vec<Case> {
    let vocab = 11;
    let fallback = [-1, 5, 7, -1, 10, 3, -1, 0];
    let batch_id = [0, 0, 1, 1, 2, -1, 3, 3];
    let mut out = Vec::new();
    for logits in [false, true] {
        let mut rng = Rng::new("candidates/fallback", u64::from(logits));
        let rows = fallback.len();
        let scores = weightless_even_rows(&mut rng, rows, vocab, logits);
        let temperature: Vec<f32> = (0..rows).map(|r| [1.0, 0.0, 0.7][r % 3]).collect();
        let top_p = vec![0.9; rows];
        let name = format!("fallback_{}", if logits { "logits" } else { "probs" });
        let t = logits.then_some(temperature.as_slice());
        let case = rows_case(
            name,
            DType::F32,
            vocab,
            4,
            (&scores, t),
            &top_p,
            Some(&batch_id),
        );
        out.push(case.with("fallback", i32s(&fallback)));
    }
    out
}

/// Every case of `top_p_candidates`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    out.extend(fallback_cases());
    for dtype in FLOAT_DTYPES {
        for mut g in row_gens(size, "candidates", dtype) {
            let (i, rng, rows, vocab) = (g.index, &mut g.rng, g.rows, g.vocab);
            let c = CANDIDATE_COUNTS[i % CANDIDATE_COUNTS.len()];
            let probs = rows_with_ties(rng, rows, |rng, _| prob_row(rng, vocab));
            let top_p: Vec<f32> = (0..rows).map(|_| pick_top_p(rng)).collect();
            // Every other shape passes the layout's batch ids, with padding rows at the end.
            let batch_id: Option<Vec<i32>> = (i % 2 == 1).then(|| {
                let valid = rows - rows / 4;
                (0..rows)
                    .map(|r| if r < valid { (r / 3) as i32 } else { -1 })
                    .collect()
            });
            out.push(case(
                format!("{}_c{c}", g.name()),
                dtype,
                vocab,
                c,
                &probs,
                &top_p,
                batch_id.as_deref(),
            ));
        }
    }
    out.extend(logits_cases(size));
    out.extend(hostile());
    out
}

fn golden() -> Vec<Case> {
    let nan = f32::NAN;
    // 5 rows of V = 5, C = 4.
    let probs = [
        [0.1, 0.4, 0.2, 0.3, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [0.25, 0.25, 0.25, 0.25, 0.0],
        [0.5, 0.0, 0.5, -1.0, nan],
        [0.2, 0.2, 0.2, 0.2, 0.2],
    ];
    let top_p = [0.5, 0.9, 0.5, 1.0, 0.3];
    let batch_id = [0, 1, 1, 2, -1];
    let ids = [
        [1, 3, 2, 0],
        [0, -1, -1, -1],
        [0, 1, 2, 3],
        [0, 2, -1, -1],
        [-1, -1, -1, -1],
    ];
    let scores = [
        [0.4, 0.3, 0.2, 0.1],
        [0.0; 4],
        [0.25; 4],
        [0.5, 0.5, 0.0, 0.0],
        [0.0; 4],
    ];
    let lens = [2, 1, 2, 2, 0];
    FLOAT_DTYPES
        .into_iter()
        .map(|dtype| {
            // Scores are the sanitized probabilities as the op reads them (after the dtype).
            let scores: Vec<f32> = scores
                .concat()
                .iter()
                .map(|&s| super::generate::round_to(dtype, &[s])[0])
                .collect();
            case(
                format!("golden::ranks_ties_zero_padding_{dtype}"),
                dtype,
                5,
                4,
                &probs.concat(),
                &top_p,
                Some(&batch_id),
            )
            .expect(
                "ids",
                crate::tensor::HostTensor::new(&[5, 4], &ids.concat()),
            )
            .expect("scores", float_tensor(DType::F32, &[5, 4], &scores))
            .expect("lens", i32s(&lens))
        })
        .collect()
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("candidates/hostile", 1);
    let vocab = 1031;
    let rows = 12;
    let probs = hostile_prob_rows(&mut rng, rows, vocab, 6, |rng, kind, _, x| {
        if kind == 4 {
            *x = f32::from_bits(rng.next_u64() as u32);
        }
    });
    let more = [1.0, f32::NAN, 0.9, 2.0, -0.0];
    let top_p: Vec<f32> = HOSTILE_TOP_P.into_iter().chain(more).collect();
    let batch_id = [0, -1, i32::MAX, i32::MIN, 3, -7, 1, 1, 2, -1, 100, 0];
    let mut out = Vec::new();
    for dtype in FLOAT_DTYPES {
        out.push(case(
            format!("hostile::bad_rows_top_p_batch_ids_{dtype}"),
            dtype,
            vocab,
            17,
            &probs,
            &top_p,
            Some(&batch_id),
        ));
    }
    // More candidates than tokens.
    let small: Vec<f32> = probs.iter().take(7 * 3).copied().collect();
    out.push(case(
        "hostile::c_above_vocab".into(),
        DType::F32,
        7,
        128,
        &small,
        &top_p[..3],
        None,
    ));
    out
}

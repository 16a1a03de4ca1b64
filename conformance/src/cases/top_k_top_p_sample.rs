//! Cases of `top_k_top_p_sample` (`docs/semantics.md` §5.6).

use serde::{Deserialize, Serialize};
use specula_backend_api::DType;
use specula_backend_api::ops::*;

use super::generate::{
    EDGE_SEEDS, FLOAT_DTYPES, HOSTILE_TOP_P, Rng, f32s, hostile_logit_rows, hostile_prob_rows, i32s,
    logit_row, pick_temperature, prob_row, rows_with_ties, u64s, weightless_even_rows, with_score_rows,
};
use super::process_logits::{self, ProcessingBuffers, Setup, processing_specs};
use super::{RowGen, Size, row_gens};
use crate::Result;
use crate::case::{Dims, TensorSpec, Want, scores_specs};
use crate::cases::Case;
use specula_backend_api::ops::process_logits::{PENALTY_FIELDS, mask_words, penalty};
use crate::exec::{OpCase, Runner};

/// The parameters of a `top_k_top_p_sample` case (the JSON header of a case file, beside `"op"`).
/// Inputs `probs`, `top_k`, `top_p`, `seed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Rows.
    pub rows: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Logits with per-row temperatures (tensors `logits`, `temperature`) instead of `probs`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logits: bool,
    /// The rows are sampled as `process_logits` makes them, by the fused call
    /// (`docs/semantics.md` §5.12): the inputs of `process_logits` beside the rows are tensors
    /// of the case too (no `fallback` tensor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processing: Option<Processing>,
}

/// The shape of the processing of a case's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Processing {
    /// Batch shape.
    pub dims: Dims,
    /// Row length of `token_ids_all`.
    pub max_model_len: usize,
}

impl OpCase for Params {
    fn tensors(&self) -> Vec<TensorSpec> {
        let rows = self.rows;
        let mut specs = scores_specs(self.logits, ("probs", "logits"), rows, self.vocab);
        specs.extend([
            TensorSpec::i32("top_k", rows),
            TensorSpec::new("top_p", Want::Is(DType::F32), rows),
            TensorSpec::new("seed", Want::Is(DType::U64), rows),
            TensorSpec::i32("fallback", rows).optional(),
        ]);
        if let Some(p) = self.processing {
            specs.extend(processing_specs(p.dims, rows, self.vocab, p.max_model_len));
        }
        specs
    }

    fn run(&self, r: &mut Runner<'_>) -> Result<()> {
        let Params { rows, vocab, .. } = *self;
        let device = r.device();
        let host_top_p = r.host::<f32>("top_p")?;
        let scores = r.scores(self.logits, "probs", "logits")?;
        let [top_k, top_p, seed] = r.inputs(["top_k", "top_p", "seed"])?;
        let fallback = r.optional("fallback")?;
        let processing = self
            .processing
            .map(|p| ProcessingBuffers::load(r).map(|b| (b, p)))
            .transpose()?;
        let [tokens] = r.outputs([("tokens", DType::I32, &[rows])])?;
        let inputs = SampleInputs::new(scores.scores(), &top_k, &top_p, &seed).with_fallback(fallback.as_ref());
        let params = SampleParams {
            shape: RowShape { rows, vocab },
            host_top_p: host_top_p.as_deref(),
        };
        match &processing {
            None => device.top_k_top_p_sample(&inputs, tokens, &params)?,
            Some((buffers, p)) => device.top_k_top_p_sample_processed(
                &inputs,
                &buffers.processing(p.dims, p.max_model_len),
                tokens,
                &params,
            )?,
        }
        Ok(())
    }
}

/// A case of `probs` in `dtype`, one row per entry of `top_k`.
pub(crate) fn case(
    name: String,
    dtype: DType,
    vocab: usize,
    probs: &[f32],
    top_k: &[i32],
    top_p: &[f32],
    seed: &[u64],
) -> Case {
    rows_case(name, dtype, vocab, (probs, None), top_k, top_p, seed)
}

/// A case of `logits` in `dtype` at the per-row `temperature`, one row per entry of `top_k`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn logits_case(
    name: String,
    dtype: DType,
    vocab: usize,
    logits: &[f32],
    temperature: &[f32],
    top_k: &[i32],
    top_p: &[f32],
    seed: &[u64],
) -> Case {
    rows_case(
        name,
        dtype,
        vocab,
        (logits, Some(temperature)),
        top_k,
        top_p,
        seed,
    )
}

/// A case of score rows (probabilities, or logits with their temperatures), one row per entry of
/// `top_k`.
fn rows_case(
    name: String,
    dtype: DType,
    vocab: usize,
    (scores, temperature): (&[f32], Option<&[f32]>),
    top_k: &[i32],
    top_p: &[f32],
    seed: &[u64],
) -> Case {
    let rows = top_k.len();
    let params = Params {
        rows,
        vocab,
        logits: temperature.is_some(),
        processing: None,
    };
    let case = Case::new(name, params);
    with_score_rows(case, dtype, [rows, vocab], scores, temperature)
        .with("top_k", i32s(top_k))
        .with("top_p", f32s(top_p))
        .with("seed", u64s(seed))
}

/// Rows whose total weight is 0 (all −inf or NaN logits, all-zero or tiny probabilities) among
/// ordinary ones, with a `fallback` input (`docs/semantics.md` §4c): the empty rows yield it, the
/// others ignore it.
fn fallback_cases() -> Vec<Case> {
    let vocab = 13;
    let fallback = [-1, 5, 7, -1, 12, 3, -1, 0];
    let mut out = Vec::new();
    for logits in [false, true] {
        let mut rng = Rng::new("sample/fallback", u64::from(logits));
        let rows = fallback.len();
        let scores = weightless_even_rows(&mut rng, rows, vocab, logits);
        let temperature: Vec<f32> = (0..rows).map(|r| [1.0, 0.0, 0.7][r % 3]).collect();
        let top_k: Vec<i32> = (0..rows).map(|r| [0, 1, 5][r % 3]).collect();
        let top_p = vec![0.9; rows];
        let seed: Vec<u64> = (0..rows).map(|_| rng.seed()).collect();
        let name = format!("fallback_{}", if logits { "logits" } else { "probs" });
        let t = logits.then_some(temperature.as_slice());
        let case = rows_case(name, DType::F32, vocab, (&scores, t), &top_k, &top_p, &seed);
        out.push(case.with("fallback", i32s(&fallback)));
    }
    out
}

/// Realistic per-row `top_k` values for a vocabulary.
pub(crate) fn pick_top_k(rng: &mut Rng, vocab: usize) -> i32 {
    let v = vocab as i32;
    rng.pick(&[0, 0, 0, 1, 5, 20, 50, v, v + 7, (v / 2).max(1)])
}

/// Realistic per-row `top_p` values.
pub(crate) fn pick_top_p(rng: &mut Rng) -> f32 {
    rng.pick(&[1.0, 1.0, 0.95, 0.9, 0.8, 0.5, 0.3, 0.999, 1e-6])
}

/// Random `top_k` (each from `pick_k`), `top_p` and seeds for `rows` rows, drawn in that order.
fn pick_row_params(
    rng: &mut Rng,
    rows: usize,
    pick_k: impl Fn(&mut Rng) -> i32,
) -> (Vec<i32>, Vec<f32>, Vec<u64>) {
    let top_k = (0..rows).map(|_| pick_k(rng)).collect();
    let top_p = (0..rows).map(|_| pick_top_p(rng)).collect();
    let seed = (0..rows).map(|_| rng.seed()).collect();
    (top_k, top_p, seed)
}

/// Every case of `top_k_top_p_sample`.
pub fn cases(size: Size) -> Vec<Case> {
    let mut out = golden();
    out.extend(fallback_cases());
    for dtype in FLOAT_DTYPES {
        for mut g in row_gens(size, "sample", dtype) {
            let (rng, rows, vocab) = (&mut g.rng, g.rows, g.vocab);
            let probs = rows_with_ties(rng, rows, |rng, _| prob_row(rng, vocab));
            let (top_k, top_p, seed) = pick_row_params(rng, rows, |rng| pick_top_k(rng, vocab));
            out.push(case(g.name(), dtype, vocab, &probs, &top_k, &top_p, &seed));
        }
        // Many rows of one distribution with distinct seeds: every kept token gets drawn.
        let (rows, vocab) = (512, 7);
        let mut rng = Rng::new(&format!("sample/{dtype}/draws"), 0);
        let row = prob_row(&mut rng, vocab);
        let probs: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
        let seed: Vec<u64> = (0..rows as u64).map(|i| 1000 + 4 * i).collect();
        out.push(case(
            format!("{dtype}::{rows}x{vocab}_same_row"),
            dtype,
            vocab,
            &probs,
            &vec![0; rows],
            &vec![1.0; rows],
            &seed,
        ));
    }
    out.extend(logits_cases(size));
    out.extend(hostile());
    out.extend(processed_cases(size));
    out
}

/// The rows of every setup of the `process_logits` cases (the hostile ones without host
/// copies), sampled by the fused call at realistic `top_k` / `top_p`; and the edges: min_p = 1,
/// one token left per row.
fn processed_cases(size: Size) -> Vec<Case> {
    let [base, masked, min_p] = process_logits::golden_setups();
    let mut setups = vec![
        ("golden::every_rule".to_owned(), base),
        ("golden::all_masked_and_all_minus_inf".to_owned(), masked),
        ("golden::min_p_half".to_owned(), min_p),
    ];
    let random = process_logits::random_setups(size);
    if let Some((name, st)) = random.iter().find(|(n, _)| n.starts_with("all_logits")) {
        let mut full = st.clone();
        for p in full.penalties.chunks_exact_mut(PENALTY_FIELDS) {
            p[penalty::MIN_P] = 1.0;
        }
        setups.push((format!("{name}_min_p_1"), full));
        let mut one = st.clone();
        let words = mask_words(one.vocab);
        one.bitmask = Some(
            (0..one.rows)
                .flat_map(|r| (0..words).map(move |w| u32::from(w == r % words) << (r % 32)))
                .collect(),
        );
        setups.push((format!("{name}_one_token"), one));
    }
    setups.extend(random);
    let mut out: Vec<Case> = setups
        .into_iter()
        .map(|(name, st)| processed_case(name, &st))
        .collect();
    // Logits that read alike keep their order through processing: at T = 0 the argmax.
    let st = process_logits::rank_order_setup(0.0);
    let mut rank_order = processed_case("rank_order_of_logits_that_read_alike".into(), &st);
    rank_order.name = "golden::processed::rank_order_of_logits_that_read_alike".into();
    out.push(rank_order.expect("tokens", i32s(&[1, 1, 0, 2, 0])));
    out.push(
        processed_case(
            "hostile::device_parameters_at_infinity".into(),
            &process_logits::infinite_parameters_setup(),
        )
        .device_only(),
    );
    // Every row at a top-k a backend may stream, so the penalties decide what enters it.
    let (name, st) = process_logits::penalized_leaders();
    out.push(processed_case_at(name, &st, |rng| rng.pick(&[1, 5, 20, 50])));
    out.extend(
        process_logits::hostile_setups()
            .into_iter()
            .map(|(name, st)| processed_case(name, &st).device_only()),
    );
    out
}

/// The fused sampling of the rows of `st` at random `top_k`, `top_p` and seeds.
pub(crate) fn processed_case(name: String, st: &Setup) -> Case {
    processed_case_at(name, st, |rng| pick_top_k(rng, st.vocab))
}

/// [`processed_case`] with each row's `top_k` from `pick`.
fn processed_case_at(name: String, st: &Setup, pick: impl Fn(&mut Rng) -> i32) -> Case {
    let mut rng = Rng::new(&format!("sample/processed/{name}"), 0);
    let (top_k, top_p, seed) = pick_row_params(&mut rng, st.rows, pick);
    let params = Params {
        rows: st.rows,
        vocab: st.vocab,
        logits: st.temperature.is_some(),
        processing: Some(Processing {
            dims: st.batch.dims,
            max_model_len: st.max_model_len,
        }),
    };
    st.with_inputs(Case::new(format!("processed::{name}"), params))
        .with("top_k", i32s(&top_k))
        .with("top_p", f32s(&top_p))
        .with("seed", u64s(&seed))
}

/// Logits rows (`docs/semantics.md` §4b) at every temperature, in every dtype and shape; then
/// hostile logits.
fn logits_cases(size: Size) -> Vec<Case> {
    let mut out = Vec::new();
    for dtype in FLOAT_DTYPES {
        let drawn = row_gens(size, "sample/logits", dtype).into_iter().map(drawn_logits);
        for rows in drawn.chain([hostile_logits(dtype)]) {
            out.push(rows.case(dtype));
        }
    }
    out.push(logits_known_answers());
    out.push(logits_rank_order_probes());
    out
}

/// The logits rows of a case and each row's parameters.
struct LogitsRows {
    name: String,
    vocab: usize,
    logits: Vec<f32>,
    temperature: Vec<f32>,
    top_k: Vec<i32>,
    top_p: Vec<f32>,
    seed: Vec<u64>,
}

impl LogitsRows {
    /// The case of these rows in `dtype`.
    fn case(self, dtype: DType) -> Case {
        logits_case(
            self.name,
            dtype,
            self.vocab,
            &self.logits,
            &self.temperature,
            &self.top_k,
            &self.top_p,
            &self.seed,
        )
    }
}

/// Realistic logits rows with ties, at realistic temperatures and parameters, of a generated
/// shape.
fn drawn_logits(mut g: RowGen) -> LogitsRows {
    let name = format!("logits::{}", g.name());
    let (rng, rows, vocab) = (&mut g.rng, g.rows, g.vocab);
    let logits = rows_with_ties(rng, rows, |rng, _| logit_row(rng, vocab));
    let temperature: Vec<f32> = (0..rows).map(|_| pick_temperature(rng)).collect();
    let (top_k, top_p, seed) = pick_row_params(rng, rows, |rng| pick_top_k(rng, vocab));
    LogitsRows {
        name,
        vocab,
        logits,
        temperature,
        top_k,
        top_p,
        seed,
    }
}

/// Hostile logits rows, every third at a hostile temperature (NaN, negative, 0, tiny, +inf,
/// subnormal), with the edge seeds.
fn hostile_logits(dtype: DType) -> LogitsRows {
    let mut rng = Rng::new(&format!("sample/logits/hostile/{dtype}"), 1);
    let (rows, vocab) = (24, 1031);
    let hostile_t = [f32::NAN, -1.0, 0.0, 1e-30, f32::INFINITY, f32::MIN_POSITIVE];
    LogitsRows {
        name: format!("hostile::logits_{dtype}"),
        vocab,
        logits: hostile_logit_rows(&mut rng, rows, vocab),
        temperature: (0..rows)
            .map(|r| match r % 3 {
                0 => hostile_t[r / 3 % hostile_t.len()],
                _ => pick_temperature(&mut rng),
            })
            .collect(),
        top_k: (0..rows).map(|_| pick_top_k(&mut rng, vocab)).collect(),
        top_p: (0..rows).map(|_| pick_top_p(&mut rng)).collect(),
        seed: (0..rows)
            .map(|r| EDGE_SEEDS[r % EDGE_SEEDS.len()])
            .collect(),
    }
}

/// The rank order of logits rows is the logits' own (`docs/semantics.md` §4b step 1): logits that
/// read as one value (`[1e30, 3e38, −1]`: both `2^64`; `[1e-30, 2e-30, −5]`: both +0) rank the
/// larger first, so a T = 0, a top_k = 1 or a tiny top_p sample is the argmax (token 1 of both),
/// whatever the draw; −0 and +0 are one rank (the lower id first); NaN ranks as −inf.
fn logits_rank_order_probes() -> Case {
    let nan = f32::NAN;
    // (row, temperature, top_k, top_p, token)
    let rows: [([f32; 3], f32, i32, f32, i32); 10] = [
        ([1e30, 3e38, -1.0], 0.0, 0, 1.0, 1),
        ([1e30, 3e38, -1.0], 1.0, 1, 1.0, 1),
        ([1e30, 3e38, -1.0], 1.0, 0, 1e-6, 1),
        ([1e-30, 2e-30, -5.0], 0.0, 0, 1.0, 1),
        ([1e-30, 2e-30, -5.0], 0.7, 1, 1.0, 1),
        ([1e-30, 2e-30, -5.0], 0.7, 0, 1e-6, 1),
        ([-3e38, -1e30, nan], 0.0, 0, 1.0, 1),
        ([nan, -2e-30, -1e-30], 0.0, 3, 0.5, 2),
        ([-0.0, 0.0, -1.0], 0.0, 0, 1.0, 0),
        ([0.0, -0.0, 1e-40], 2.0, 1, 1.0, 2),
    ];
    let logits: Vec<f32> = rows.iter().flat_map(|r| r.0).collect();
    let temperature: Vec<f32> = rows.iter().map(|r| r.1).collect();
    let top_k: Vec<i32> = rows.iter().map(|r| r.2).collect();
    let top_p: Vec<f32> = rows.iter().map(|r| r.3).collect();
    let expected: Vec<i32> = rows.iter().map(|r| r.4).collect();
    let seed: Vec<u64> = (0..rows.len() as u64).map(|r| 29 + 4 * r).collect();
    logits_case(
        "golden::logits_rank_order_probes".into(),
        DType::F32,
        3,
        &logits,
        &temperature,
        &top_k,
        &top_p,
        &seed,
    )
    .expect("tokens", i32s(&expected))
}

/// The contract's known-answer row (`docs/semantics.md` §4b) at T = 1, 0.7, 2.5, 0 and +inf: with
/// top-k 1 or a tiny top-p the token is the first in rank order (id 0, the lower of the two
/// maxima), whatever the draw; with T = 0 only the argmax weighs anything, whatever top-k and top-p
/// keep.
fn logits_known_answers() -> Case {
    let row = [2.0, 1.0, 0.0, -1.5, f32::NEG_INFINITY, f32::NAN, 2.0, -30.0];
    let temperature = [1.0, 0.7, 2.5, 0.0, f32::INFINITY, 0.0];
    let rows = temperature.len();
    let logits: Vec<f32> = (0..rows).flat_map(|_| row).collect();
    let top_k = [1, 0, 1, 0, 1, 5];
    let top_p = [1.0, 1e-6, 1.0, 1.0, 1.0, 1.0];
    let seed: Vec<u64> = (0..rows as u64).map(|r| 17 + 4 * r).collect();
    logits_case(
        "golden::logits_known_answer_row".into(),
        DType::F32,
        row.len(),
        &logits,
        &temperature,
        &top_k,
        &top_p,
        &seed,
    )
    .expect("tokens", i32s(&[0; 6]))
}

fn golden() -> Vec<Case> {
    // Rows whose result does not depend on the draw: top-k 1, one-hot rows, a tiny top-p, zero
    // total weight (the first token in rank order).
    let nan = f32::NAN;
    let rows: [([f32; 5], i32, f32, i32); 9] = [
        ([0.1, 0.3, 0.3, 0.2, 0.1], 1, 1.0, 1),
        ([0.1, 0.2, 0.3, 0.2, 0.2], 0, 1e-6, 2),
        ([0.0, 0.0, 0.0, 1.0, 0.0], 0, 1.0, 3),
        ([0.25, 0.25, 0.25, 0.25, 0.0], 1, 0.5, 0),
        ([0.0, 0.0, 0.0, 0.0, 0.0], 0, 1.0, 0),
        ([nan, nan, nan, nan, nan], 3, 0.9, 0),
        ([-1.0, -0.5, 0.0, -0.0, nan], 0, 1.0, 0),
        ([0.2, 0.2, 5.0, f32::INFINITY, 0.1], 1, 1.0, 2),
        ([0.05, 0.05, 0.6, 0.2, 0.1], -4, 1e-3, 2),
    ];
    let probs: Vec<f32> = rows.iter().flat_map(|r| r.0).collect();
    let top_k: Vec<i32> = rows.iter().map(|r| r.1).collect();
    let top_p: Vec<f32> = rows.iter().map(|r| r.2).collect();
    let expected: Vec<i32> = rows.iter().map(|r| r.3).collect();
    let seed: Vec<u64> = EDGE_SEEDS.iter().copied().chain([42]).collect();
    FLOAT_DTYPES
        .into_iter()
        .map(|dtype| {
            case(
                format!("golden::deterministic_rows_{dtype}"),
                dtype,
                5,
                &probs,
                &top_k,
                &top_p,
                &seed,
            )
            .expect("tokens", i32s(&expected))
        })
        .collect()
}

fn hostile() -> Vec<Case> {
    let mut rng = Rng::new("sample/hostile", 1);
    let vocab = 1031;
    let rows = 16;
    let probs = hostile_prob_rows(&mut rng, rows, vocab, 8, |rng, kind, draw, x| {
        match (kind, draw) {
            (4, _) => *x = 1.0,
            (5, 1) => *x = -0.0,
            (6, _) => *x = f32::from_bits(rng.next_u64() as u32),
            _ => {}
        }
    });
    let v = vocab as i32;
    let top_k = [
        -1,
        i32::MIN,
        v + 1,
        i32::MAX,
        1,
        0,
        v,
        3,
        -7,
        2,
        0,
        0,
        0,
        0,
        1,
        v - 1,
    ];
    let more = [f32::MIN_POSITIVE, 1.0, 0.9, -0.0, 2.0, f32::NAN, 0.1, 1.0, 0.7];
    let top_p: Vec<f32> = HOSTILE_TOP_P.into_iter().chain(more).collect();
    let seed: Vec<u64> = EDGE_SEEDS
        .iter()
        .chain(EDGE_SEEDS.iter())
        .map(|s| s ^ rng.below(2) as u64)
        .collect();
    FLOAT_DTYPES
        .into_iter()
        .map(|dtype| {
            case(
                format!("hostile::bad_rows_params_seeds_{dtype}"),
                dtype,
                vocab,
                &probs,
                &top_k,
                &top_p,
                &seed,
            )
        })
        .collect()
}

//! The conformance cases of the sampling ops, run sharded (`docs/semantics.md` §4d): each rank of
//! a group holds its slice of every row tensor of a case (the rest is replicated), runs the
//! sharded op of `specula-shard` on its device, and must write the outputs the reference device
//! writes for the whole case — exact outputs bit for bit, log-probabilities within the tolerance
//! of `accept_logprobs` (a sharded normaliser is added in another order).
//!
//! The ops: `argmax`, `top_k_top_p_sample` (probabilities, logits, a `fallback` input, and the
//! cases sampled with processing, which each rank runs as `process_logits` over its slice then
//! the sharded sample with the rows' min_p and the slices' fallbacks), `top_p_candidates`,
//! `verify_draft_tokens` (every strategy; REJECTION reads the rows) and `accept_logprobs`.

use specula_backend_api::ops::process_logits::{PENALTY_FIELDS, penalty};
use specula_backend_api::ops::*;
use specula_backend_api::{DType, DeviceExt, Op};
use specula_shard::{Fallback, HostRows, Shard, SliceRows, TargetExtras};

use crate::cases::Case;
use crate::cases::CaseParams;
use crate::cases::run_case;
use crate::cases::verify_draft_tokens::{VerifyBuffers, verify_outputs};
use crate::compare::{Mismatch, compare_outputs};
use crate::exec::{Outputs, Runner};
use crate::tensor::HostTensor;
use crate::{ConformanceError, Result};

/// The ops whose cases run sharded.
pub const SHARDED_OPS: [Op; 5] = [
    Op::Argmax,
    Op::TopKTopPSample,
    Op::TopPCandidates,
    Op::VerifyDraftTokens,
    Op::AcceptLogprobs,
];

/// The input tensors that hold rows of the vocabulary: each rank holds its slice of them.
const ROW_TENSORS: [&str; 7] = [
    "input",
    "probs",
    "logits",
    "target_probs",
    "target_logits",
    "draft_probs",
    "draft_logits",
];

/// The vocabulary of a case of a sharded op (`None` for other ops).
pub fn vocab(case: &Case) -> Option<usize> {
    match &case.params {
        CaseParams::Argmax(p) => Some(p.vocab),
        CaseParams::TopKTopPSample(p) => Some(p.vocab),
        CaseParams::TopPCandidates(p) => Some(p.vocab),
        CaseParams::VerifyDraftTokens(p) => Some(p.vocab),
        CaseParams::AcceptLogprobs(p) => Some(p.vocab),
        _ => None,
    }
}

/// Whether `case` runs sharded over `ranks` ranks: a case of a sharded op that must run (not an
/// `invalid::` case) whose vocabulary has a token for every rank.
pub fn runs_sharded(case: &Case, ranks: usize) -> bool {
    case.expected_error.is_none() && vocab(case).is_some_and(|v| v >= ranks)
}

/// `case` with every row tensor cut to the ids of `slice`.
fn slice_case(case: &Case, slice: VocabSlice) -> Result<Case> {
    let mut sliced = case.clone();
    for name in ROW_TENSORS {
        let Some(t) = sliced.inputs.get_mut(name) else {
            continue;
        };
        let size = t.dtype.size_bytes();
        let row_bytes = slice.vocab * size;
        if row_bytes == 0 || !t.bytes.len().is_multiple_of(row_bytes) {
            return Err(ConformanceError::Format(format!(
                "case {}: `{name}` is not whole rows of V = {}",
                case.name, slice.vocab
            )));
        }
        let rows = t.bytes.len() / row_bytes;
        let bytes: Vec<u8> = t
            .bytes
            .chunks(row_bytes)
            .flat_map(|row| row[slice.first * size..slice.end() * size].to_vec())
            .collect();
        *t = HostTensor::from_bytes(t.dtype, vec![rows, slice.len], bytes)?;
    }
    Ok(sliced)
}

/// Runs `case` sharded: this rank's slice of it on its device, through the sharded op. Returns
/// the rank's outputs, named as the op's.
pub fn run_case_sharded(shard: &Shard<'_>, case: &Case) -> Result<Outputs> {
    let sliced = slice_case(case, shard.partition.mine())?;
    let mut r = Runner::new(shard.device, sliced.inputs_view());
    match &case.params {
        CaseParams::Argmax(p) => argmax(shard, p, &mut r)?,
        CaseParams::TopKTopPSample(p) => sample(shard, p, &mut r)?,
        CaseParams::TopPCandidates(p) => candidates(shard, p, &mut r)?,
        CaseParams::VerifyDraftTokens(p) => verify(shard, p, &mut r)?,
        CaseParams::AcceptLogprobs(p) => logprobs(shard, p, &mut r)?,
        other => {
            return Err(ConformanceError::Format(format!(
                "{} has no sharded form",
                other.op()
            )));
        }
    }
    r.finish()
}

/// Compares a rank's sharded outputs of `case` with `expected` (the reference's whole-case
/// outputs).
pub fn compare_sharded(
    case: &Case,
    expected: &Outputs,
    actual: &Outputs,
) -> std::result::Result<(), Mismatch> {
    let width = case.params.reduction_width();
    compare_outputs(case.op(), width, &expected.tensors, &actual.tensors)
}

/// The reference device's outputs of `case` (what every rank must write).
pub fn expected(case: &Case) -> Result<Outputs> {
    let reference = specula_reference::ReferenceDevice::new();
    match &case.expected {
        Some(tensors) => Ok(Outputs {
            tensors: tensors.clone(),
            guard_violations: Vec::new(),
        }),
        None => run_case(&reference, case),
    }
}

fn argmax(shard: &Shard<'_>, p: &crate::cases::argmax::Params, r: &mut Runner<'_>) -> Result<()> {
    let [input] = r.inputs(["input"])?;
    let tokens = specula_shard::argmax(shard, Scores::probs(&input), p.rows)?;
    let [out] = r.outputs([("out", DType::I32, &[p.rows])])?;
    shard.device.write(out, &tokens)?;
    Ok(())
}

/// The host copy of the scores' temperatures (logits rows).
fn host_temperature(r: &Runner<'_>, logits: bool) -> Result<Option<Vec<f32>>> {
    logits.then(|| r.values::<f32>("temperature")).transpose()
}

fn sample(
    shard: &Shard<'_>,
    p: &crate::cases::top_k_top_p_sample::Params,
    r: &mut Runner<'_>,
) -> Result<()> {
    let rows = p.rows;
    let scores = r.scores(p.logits, "probs", "logits")?;
    let top_k: Vec<i32> = r.values("top_k")?;
    let top_p: Vec<f32> = r.values("top_p")?;
    let seed: Vec<u64> = r.values("seed")?;
    let temperature = host_temperature(r, p.logits)?;
    let row_fallback: Option<Vec<i32>> = match r.optional("fallback")? {
        Some(_) => Some(r.values("fallback")?),
        None => None,
    };
    let tokens = match p.processing {
        None => {
            let host = HostRows {
                top_k: &top_k,
                top_p: &top_p,
                seed: &seed,
                temperature: temperature.as_deref(),
                min_p: None,
            };
            let rows_in = SliceRows {
                scores: scores.scores(),
                min_p: None,
                fallback: row_fallback.as_deref().map(Fallback::Row),
            };
            specula_shard::top_k_top_p_sample(shard, &rows_in, &host)?
        }
        Some(processing) => {
            let buffers = crate::cases::process_logits::ProcessingBuffers::load(r)?;
            let min_p = row_min_p(r, processing.dims.into(), rows)?;
            let row_processing = buffers.processing(processing.dims, processing.max_model_len);
            let slice = shard.partition.mine();
            let device = shard.device;
            let mut processed = device.alloc::<f32>(rows * slice.len)?;
            let mut fallback = device.alloc::<i32>(rows)?;
            device.process_logits(
                &row_processing.inputs(scores.scores()),
                &mut ProcessOutputs {
                    processed: &mut processed,
                    fallback: &mut fallback,
                },
                &ProcessParams {
                    slice: Some(slice),
                    ..row_processing.params(RowShape {
                        rows,
                        vocab: p.vocab,
                    })
                },
            )?;
            let processed_scores = match scores.scores() {
                Scores::Logits(l) => Scores::Logits(Logits {
                    logits: &processed,
                    ..l
                }),
                Scores::Probs(_) => Scores::Probs(&processed),
            };
            let min_p_buffer = device.upload(&min_p)?;
            let host = HostRows {
                top_k: &top_k,
                top_p: &top_p,
                seed: &seed,
                temperature: temperature.as_deref(),
                min_p: Some(&min_p),
            };
            let rows_in = SliceRows {
                scores: processed_scores,
                min_p: Some(&min_p_buffer),
                fallback: Some(Fallback::Slice(&fallback)),
            };
            specula_shard::top_k_top_p_sample(shard, &rows_in, &host)?
        }
    };
    let [out] = r.outputs([("tokens", DType::I32, &[rows])])?;
    shard.device.write(out, &tokens)?;
    Ok(())
}

/// Each output row's min_p (`docs/semantics.md` §4c: its slot's `penalties` entry; 0 for a row
/// of no slot, whose tokens are all masked), as `process_logits` reads it.
fn row_min_p(r: &Runner<'_>, dims: BatchDims, rows: usize) -> Result<Vec<f32>> {
    let penalties: Vec<f32> = r.values("penalties")?;
    let batch_id: Vec<i32> = r.values("batch_id_per_token_output")?;
    let cu_out: Vec<i32> = r.values("cu_seqlens_q_output")?;
    Ok((0..rows)
        .map(|row| {
            let slot = usize::try_from(batch_id[row])
                .ok()
                .filter(|&b| b < dims.real_bsz);
            let source = slot.filter(|&b| {
                let pos = row as i64 - i64::from(cu_out[b]);
                pos >= 0 && (pos as usize) < dims.max_step_tokens
            });
            source.map_or(0.0, |b| penalties[b * PENALTY_FIELDS + penalty::MIN_P])
        })
        .collect())
}

fn candidates(
    shard: &Shard<'_>,
    p: &crate::cases::top_p_candidates::Params,
    r: &mut Runner<'_>,
) -> Result<()> {
    let rows = p.rows;
    let scores = r.scores(p.logits, "probs", "logits")?;
    let top_p: Vec<f32> = r.values("top_p")?;
    let padding: Option<Vec<bool>> = match r.optional("batch_id_per_token_output")? {
        Some(_) => Some(
            r.values::<i32>("batch_id_per_token_output")?
                .iter()
                .take(rows)
                .map(|&b| b < 0)
                .collect(),
        ),
        None => None,
    };
    let fallback: Option<Vec<i32>> = match r.optional("fallback")? {
        Some(_) => Some(r.values("fallback")?),
        None => None,
    };
    let rows_in = SliceRows {
        scores: scores.scores(),
        min_p: None,
        fallback: fallback.as_deref().map(Fallback::Row),
    };
    let got =
        specula_shard::top_p_candidates(shard, &rows_in, &top_p, p.candidates, padding.as_deref())?;
    let [ids, cand_scores, lens] = r.outputs([
        ("ids", DType::I32, &[rows, p.candidates]),
        ("scores", DType::F32, &[rows, p.candidates]),
        ("lens", DType::I32, &[rows]),
    ])?;
    let device = shard.device;
    device.write(ids, &got.ids)?;
    device.write(cand_scores, &got.scores)?;
    device.write(lens, &got.lens)?;
    Ok(())
}

fn verify(
    shard: &Shard<'_>,
    p: &crate::cases::verify_draft_tokens::Params,
    r: &mut Runner<'_>,
) -> Result<()> {
    let buffers = VerifyBuffers::upload(r, p)?;
    let fallback: Option<Vec<i32>> = match r.optional("fallback")? {
        Some(_) => Some(r.values("fallback")?),
        None => None,
    };
    let inputs = buffers.inputs(None)?;
    let extras = TargetExtras {
        min_p: None,
        fallback: fallback.as_deref().map(Fallback::Row),
    };
    let mut out = verify_outputs(r, &p.dims)?;
    specula_shard::verify_draft_tokens(shard, &inputs, extras, &mut out, &buffers.params())?;
    Ok(())
}

fn logprobs(
    shard: &Shard<'_>,
    p: &crate::cases::accept_logprobs::Params,
    r: &mut Runner<'_>,
) -> Result<()> {
    p.run_with(r, |inputs, out, params| {
        Ok(specula_shard::accept_logprobs(shard, inputs, out, params)?)
    })
}

/// A case of a sharded op with the outputs every rank must write.
#[derive(Clone, Debug)]
pub struct ShardedCase {
    /// The case.
    pub case: Case,
    /// The reference's outputs of the whole case.
    pub expected: Outputs,
}

/// The cases of the sharded ops at `size` that run over `ranks` ranks, with the reference's
/// outputs (computed here: once, whatever the number of ranks).
pub fn sharded_cases(size: crate::cases::Size, ranks: usize) -> Result<Vec<ShardedCase>> {
    let mut out = Vec::new();
    for op in SHARDED_OPS {
        for case in crate::cases::cases(op, size) {
            if runs_sharded(&case, ranks) {
                let expected = expected(&case)?;
                out.push(ShardedCase { case, expected });
            }
        }
    }
    Ok(out)
}

/// Runs every case sharded on this rank and compares its outputs with the expected ones: the
/// names of the failing cases, each with its first difference (or error). Every rank must run
/// the same cases in the same order (their collectives meet).
pub fn check_cases(shard: &Shard<'_>, cases: &[ShardedCase]) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    for c in cases {
        let name = format!("{}::{}", c.case.op(), c.case.name);
        match run_case_sharded(shard, &c.case) {
            Ok(actual) => {
                if let Err(m) = compare_sharded(&c.case, &c.expected, &actual) {
                    failures.push((name, m.to_string()));
                }
            }
            Err(e) => failures.push((name, e.to_string())),
        }
    }
    failures
}

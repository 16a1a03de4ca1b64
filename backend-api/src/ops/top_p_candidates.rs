//! `top_p_candidates` (`docs/semantics.md` §5.7): arguments and validation.

use super::{Check, RowShape, Scores, ScoresKind, check_candidates_count};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Op, Result};

/// A validated `top_p_candidates`. Facts: the scores' dtype and kind. Nothing to launch when
/// `rows == 0`.
pub type TopPCandidatesCall<'c, 'o> =
    Call<'c, CandidatesInputs<'c>, CandidatesOutputs<'o>, CandidatesParams<'c>, ScoresKind>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = TopPCandidatesCall<'c, 'o>;

/// Inputs of `top_p_candidates`.
#[derive(Clone, Copy, Debug)]
pub struct CandidatesInputs<'a> {
    /// `[rows, vocab]` probabilities, or logits with their per-row temperature.
    pub scores: Scores<'a>,
    /// `[rows]` f32 per-row `top_p`.
    pub top_p: &'a Buffer,
    /// Optional `[rows]` i32 `batch_id_per_token_output`: rows whose entry is negative are padding
    /// (ids -1, scores 0, lens 0). Without it every row is processed.
    pub batch_id_per_token_output: Option<&'a Buffer>,
    /// Optional `[rows]` i32 (from `process_logits`): a row whose total weight is 0 lists this
    /// token alone (`lens` 1), or nothing when it is -1 (`lens` 0).
    pub fallback: Option<&'a Buffer>,
}

/// Parameters of `top_p_candidates`.
#[derive(Clone, Copy, Debug)]
pub struct CandidatesParams<'a> {
    /// The matrix shape.
    pub shape: RowShape,
    /// Candidates per row, `1 ..= 128`.
    pub candidates: usize,
    /// Host copy of `top_p`, for validation.
    pub host_top_p: Option<&'a [f32]>,
}

/// Outputs of `top_p_candidates`.
#[derive(Debug)]
pub struct CandidatesOutputs<'a> {
    /// `[rows, C]` i32 ids in rank order, -1 padding.
    pub ids: &'a mut Buffer,
    /// `[rows, C]` f32 scores, 0 for padding: the sanitized probabilities, or for logits rows the
    /// exact share `q · 2^-40` of `docs/semantics.md` §4b.
    pub scores: &'a mut Buffer,
    /// `[rows]` i32 number of candidates whose mass reaches `top_p`.
    pub lens: &'a mut Buffer,
}

impl<'a> CandidatesInputs<'a> {
    /// The inputs of `top_p_candidates` (`docs/semantics.md` §5.7) without
    /// `batch_id_per_token_output` (every row is processed) and without a `fallback`.
    pub fn new(scores: Scores<'a>, top_p: &'a Buffer) -> Self {
        CandidatesInputs {
            scores,
            top_p,
            batch_id_per_token_output: None,
            fallback: None,
        }
    }

    /// These inputs with the `batch_id_per_token_output` input (`None`: without one).
    pub fn with_batch_id(self, batch_id_per_token_output: Option<&'a Buffer>) -> Self {
        CandidatesInputs {
            batch_id_per_token_output,
            ..self
        }
    }

    /// These inputs with the `fallback` input (`None`: without one).
    pub fn with_fallback(self, fallback: Option<&'a Buffer>) -> Self {
        CandidatesInputs { fallback, ..self }
    }
}

impl CandidatesParams<'_> {
    /// The parameters of `top_p_candidates` over `shape` with `candidates` per row, without a
    /// host copy of `top_p`.
    pub fn new(shape: RowShape, candidates: usize) -> Self {
        CandidatesParams {
            shape,
            candidates,
            host_top_p: None,
        }
    }
}

/// Validates `top_p_candidates`.
pub(crate) fn validate<'c, 'o>(
    device: &DeviceDesc,
    inputs: &CandidatesInputs<'c>,
    out: &'c mut CandidatesOutputs<'o>,
    params: &CandidatesParams<'c>,
) -> Result<TopPCandidatesCall<'c, 'o>> {
    let check = Check::new(Op::TopPCandidates, device);
    let shape = &params.shape;
    let kind = inputs.scores.validate(&check, ("probs", "logits"), shape)?;
    check_candidates_count(&check, params.candidates)?;
    check.exact("top_p", inputs.top_p, DType::F32, shape.rows)?;
    if let Some(batch_id) = inputs.batch_id_per_token_output {
        check.exact(
            "batch_id_per_token_output",
            batch_id,
            DType::I32,
            shape.rows,
        )?;
    }
    check.host_top_p(params.host_top_p, shape.rows)?;
    check.fallback(inputs.fallback, shape.rows)?;
    let len = check.product("ids", shape.rows, params.candidates)?;
    check.exact("ids", out.ids, DType::I32, len)?;
    check.exact("scores", out.scores, DType::F32, len)?;
    check.exact("lens", out.lens, DType::I32, shape.rows)?;
    let call = Call::new(*inputs, out, *params, kind);
    Ok(call
        .with_extent(shape.rows, shape.vocab)
        .launching_nothing_if(shape.rows == 0))
}

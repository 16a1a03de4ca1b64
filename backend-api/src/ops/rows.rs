//! The per-row ops: `argmax`, `softmax`, `top_k_top_p_sample`, `top_p_candidates`.

use super::Check;
use crate::{Buffer, DType, DeviceId, Error, Op, Result};

/// The shape of a `[rows, vocab]` matrix of probabilities or logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowShape {
    /// Number of rows `R`.
    pub rows: usize,
    /// Vocabulary size `V`, in `1 ..= 2^20`.
    pub vocab: usize,
}

impl RowShape {
    /// Checks the vocabulary and a float `[rows, vocab]` buffer; returns its dtype.
    pub fn validate_matrix(
        &self,
        check: &Check,
        arg: &'static str,
        buffer: &Buffer,
    ) -> Result<DType> {
        check.vocab(self.vocab)?;
        let len = check.product(arg, self.rows, self.vocab)?;
        check.float(arg, buffer, len)
    }
}

/// Validates `argmax`; returns the input dtype.
pub fn validate_argmax(
    device: DeviceId,
    input: &Buffer,
    out: &Buffer,
    shape: &RowShape,
) -> Result<DType> {
    let check = Check::new(Op::Argmax, device);
    let dtype = shape.validate_matrix(&check, "input", input)?;
    check.exact("out", out, DType::I32, shape.rows)?;
    Ok(dtype)
}

/// Parameters of `softmax`.
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxParams<'a> {
    /// The matrix shape.
    pub shape: RowShape,
    /// Host copy of the per-row temperature, for validation (each ≥ 0, not NaN).
    pub host_temperature: Option<&'a [f32]>,
}

/// Validates `softmax`; returns the logits dtype.
pub fn validate_softmax(
    device: DeviceId,
    logits: &Buffer,
    temperature: &Buffer,
    probs: &Buffer,
    params: &SoftmaxParams<'_>,
) -> Result<DType> {
    let check = Check::new(Op::Softmax, device);
    let shape = &params.shape;
    let dtype = shape.validate_matrix(&check, "logits", logits)?;
    check.exact("temperature", temperature, DType::F32, shape.rows)?;
    check.host_temperature(params.host_temperature, shape.rows)?;
    check.exact("probs", probs, DType::F32, shape.rows * shape.vocab)?;
    Ok(dtype)
}

/// Inputs of `top_k_top_p_sample`.
#[derive(Clone, Copy, Debug)]
pub struct SampleInputs<'a> {
    /// `[rows, vocab]` probabilities (f32, f16 or bf16).
    pub probs: &'a Buffer,
    /// `[rows]` i32 `top_k` (0 or ≥ V: no top-k).
    pub top_k: &'a Buffer,
    /// `[rows]` f32 `top_p` (device values outside (0, 1] count as 1.0).
    pub top_p: &'a Buffer,
    /// `[rows]` u64 per-token seeds.
    pub seed: &'a Buffer,
}

/// Parameters of `top_k_top_p_sample`.
#[derive(Clone, Copy, Debug)]
pub struct SampleParams<'a> {
    /// The matrix shape.
    pub shape: RowShape,
    /// Host copy of `top_p`, for validation (each in (0, 1]).
    pub host_top_p: Option<&'a [f32]>,
}

/// Validates `top_k_top_p_sample`; returns the probabilities dtype.
pub fn validate_top_k_top_p_sample(
    device: DeviceId,
    inputs: &SampleInputs<'_>,
    tokens: &Buffer,
    params: &SampleParams<'_>,
) -> Result<DType> {
    let check = Check::new(Op::TopKTopPSample, device);
    let shape = &params.shape;
    let dtype = shape.validate_matrix(&check, "probs", inputs.probs)?;
    check.exact("top_k", inputs.top_k, DType::I32, shape.rows)?;
    check.exact("top_p", inputs.top_p, DType::F32, shape.rows)?;
    check.exact("seed", inputs.seed, DType::U64, shape.rows)?;
    check.host_top_p(params.host_top_p, shape.rows)?;
    check.exact("tokens", tokens, DType::I32, shape.rows)?;
    Ok(dtype)
}

/// Inputs of `top_p_candidates`.
#[derive(Clone, Copy, Debug)]
pub struct CandidatesInputs<'a> {
    /// `[rows, vocab]` probabilities.
    pub probs: &'a Buffer,
    /// `[rows]` f32 per-row `top_p`.
    pub top_p: &'a Buffer,
    /// Optional `[rows]` i32 `batch_id_per_token_output`: rows whose entry is negative are padding
    /// (ids -1, scores 0, lens 0). Without it every row is processed.
    pub batch_id_per_token_output: Option<&'a Buffer>,
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
    /// `[rows, C]` f32 sanitized probabilities, 0 for padding.
    pub scores: &'a mut Buffer,
    /// `[rows]` i32 number of candidates whose mass reaches `top_p`.
    pub lens: &'a mut Buffer,
}

/// Validates `top_p_candidates`; returns the probabilities dtype.
pub fn validate_top_p_candidates(
    device: DeviceId,
    inputs: &CandidatesInputs<'_>,
    out: &CandidatesOutputs<'_>,
    params: &CandidatesParams<'_>,
) -> Result<DType> {
    let check = Check::new(Op::TopPCandidates, device);
    let shape = &params.shape;
    let dtype = shape.validate_matrix(&check, "probs", inputs.probs)?;
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
    let len = check.product("ids", shape.rows, params.candidates)?;
    check.exact("ids", out.ids, DType::I32, len)?;
    check.exact("scores", out.scores, DType::F32, len)?;
    check.exact("lens", out.lens, DType::I32, shape.rows)?;
    Ok(dtype)
}

/// Checks `1 ≤ C ≤ 128`.
pub(crate) fn check_candidates_count(check: &Check, candidates: usize) -> Result<()> {
    if candidates == 0 || candidates > crate::abi::MAX_CANDIDATES {
        return Err(Error::invalid(
            check.op,
            "candidates",
            format!("1 ..= {}", crate::abi::MAX_CANDIDATES),
            candidates,
        ));
    }
    Ok(())
}

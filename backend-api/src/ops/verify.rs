//! `verify_draft_tokens` and its strategies.

use std::fmt;
use std::str::FromStr;

use super::{BatchDims, Check, HostSlotLens, SlotLens};
use crate::{Buffer, DType, DeviceId, Error, Op, Result};

/// How drafts are checked and the phase-2 token chosen (contract §4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Accept iff the draft equals the argmax of its row.
    Greedy,
    /// Accept iff the draft equals the row's sampled token; identical to non-speculative decoding.
    TargetMatch,
    /// FastDeploy's lossy mode: accept iff the draft is among the row's top-p candidates.
    TopP,
    /// Standard speculative (rejection) sampling against draft probabilities.
    Rejection,
}

impl Strategy {
    /// Every strategy.
    pub const ALL: [Strategy; 4] = [
        Strategy::Greedy,
        Strategy::TargetMatch,
        Strategy::TopP,
        Strategy::Rejection,
    ];

    /// The snake_case name (`target_match`).
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::Greedy => "greedy",
            Strategy::TargetMatch => "target_match",
            Strategy::TopP => "topp",
            Strategy::Rejection => "rejection",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Strategy::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| Error::Parse {
                what: "strategy",
                input: s.to_owned(),
            })
    }
}

/// The strategy and its per-row inputs (`rows` = the number of output rows given to the op).
#[derive(Clone, Copy, Debug)]
pub enum StrategyInputs<'a> {
    /// `target_tokens [rows]` i32: the argmax of each row.
    Greedy {
        /// Argmax per output row.
        target_tokens: &'a Buffer,
    },
    /// `target_tokens [rows]` i32: each row sampled by `top_k_top_p_sample` with its seed.
    TargetMatch {
        /// Sampled token per output row.
        target_tokens: &'a Buffer,
    },
    /// The output of `top_p_candidates`: `ids [rows, C]`, `scores [rows, C]`, `lens [rows]`.
    TopP {
        /// Candidate ids.
        candidate_ids: &'a Buffer,
        /// Candidate probabilities.
        candidate_scores: &'a Buffer,
        /// Candidate counts reaching `top_p`.
        candidate_lens: &'a Buffer,
        /// `C`, candidates per row.
        candidates: usize,
    },
    /// Target probabilities `[rows, V]`, draft probabilities `[max_bsz · (S − 1), V]` (same dtype
    /// family, f32/f16/bf16 each), and the target's per-row `top_k` i32 / `top_p` f32 filter.
    Rejection {
        /// Target probabilities.
        target_probs: &'a Buffer,
        /// Draft probabilities; row `b · (S − 1) + i` is draft `i + 1` of slot `b`.
        draft_probs: &'a Buffer,
        /// Per-row `top_k` of the target filter.
        top_k: &'a Buffer,
        /// Per-row `top_p` of the target filter.
        top_p: &'a Buffer,
    },
}

impl StrategyInputs<'_> {
    /// The strategy these inputs are for.
    pub fn strategy(&self) -> Strategy {
        match self {
            StrategyInputs::Greedy { .. } => Strategy::Greedy,
            StrategyInputs::TargetMatch { .. } => Strategy::TargetMatch,
            StrategyInputs::TopP { .. } => Strategy::TopP,
            StrategyInputs::Rejection { .. } => Strategy::Rejection,
        }
    }
}

/// Per-slot state read by `verify_draft_tokens`, `[max_bsz]` each unless noted.
#[derive(Clone, Copy, Debug)]
pub struct VerifySlotState<'a> {
    /// u8 flags: the slot has stopped.
    pub stop_flags: &'a Buffer,
    /// u8 flags: the slot is blocked this step.
    pub is_block_step: &'a Buffer,
    /// i32: 1 means the slot is inside a reasoning section (drafts are not checked).
    pub reasoning_status: &'a Buffer,
    /// i32: tokens generated so far.
    pub step_idx: &'a Buffer,
    /// i32: the most tokens the slot may generate.
    pub max_dec_len: &'a Buffer,
    /// `[E]` i32, `E ≥ 1`: end tokens; `end_tokens[0]` replaces the token that reaches `max_dec_len`.
    pub end_tokens: &'a Buffer,
}

/// Inputs of `verify_draft_tokens`.
#[derive(Clone, Copy, Debug)]
pub struct VerifyInputs<'a> {
    /// `[max_bsz, S]` i32: position 0 the last accepted token, positions 1.. the drafts.
    pub draft_tokens: &'a Buffer,
    /// Slot lengths.
    pub lens: SlotLens<'a>,
    /// `[real_bsz + 1]` i32 from `build_output_layout`.
    pub cu_seqlens_q_output: &'a Buffer,
    /// Per-slot state.
    pub state: VerifySlotState<'a>,
    /// `[rows]` u64 per-output-row seeds (from `build_sampling_params`).
    pub seeds: &'a Buffer,
    /// The strategy and its inputs.
    pub strategy: StrategyInputs<'a>,
}

/// Parameters of `verify_draft_tokens`.
#[derive(Clone, Copy, Debug)]
pub struct VerifyParams<'a> {
    /// The batch shape.
    pub dims: BatchDims,
    /// Number of output rows of the per-row inputs (`T_out`, or a padded capacity).
    pub rows: usize,
    /// Vocabulary size: token ids outside `0 .. vocab` never match.
    pub vocab: usize,
    /// Accept every (in-vocabulary) draft.
    pub accept_all: bool,
    /// Accept no draft; wins over `accept_all`.
    pub reject_all: bool,
    /// Host copies of the slot lengths, for validation; with them `rows` must equal `T_out`.
    pub host: Option<HostSlotLens<'a>>,
}

/// Outputs of `verify_draft_tokens`.
#[derive(Debug)]
pub struct VerifyOutputs<'a> {
    /// `[max_bsz, S]` i32: the emitted tokens, -1 beyond the count.
    pub accept_tokens: &'a mut Buffer,
    /// `[max_bsz]` i32: the number of emitted tokens.
    pub accept_num: &'a mut Buffer,
}

/// Validates `verify_draft_tokens`; returns the float dtypes of the REJECTION inputs (target, draft)
/// when that strategy is used.
pub fn validate_verify_draft_tokens(
    device: DeviceId,
    inputs: &VerifyInputs<'_>,
    out: &VerifyOutputs<'_>,
    params: &VerifyParams<'_>,
) -> Result<Option<(DType, DType)>> {
    let check = Check::new(Op::VerifyDraftTokens, device);
    let dims = &params.dims;
    dims.validate(check.op)?;
    check.vocab(params.vocab)?;
    let slot_tokens = check.product("draft_tokens", dims.max_bsz, dims.max_step_tokens)?;
    check.exact("draft_tokens", inputs.draft_tokens, DType::I32, slot_tokens)?;
    inputs.lens.validate(&check, dims)?;
    check.exact(
        "cu_seqlens_q_output",
        inputs.cu_seqlens_q_output,
        DType::I32,
        dims.real_bsz + 1,
    )?;
    let state = &inputs.state;
    check.exact("stop_flags", state.stop_flags, DType::U8, dims.max_bsz)?;
    check.exact(
        "is_block_step",
        state.is_block_step,
        DType::U8,
        dims.max_bsz,
    )?;
    check.exact(
        "reasoning_status",
        state.reasoning_status,
        DType::I32,
        dims.max_bsz,
    )?;
    check.exact("step_idx", state.step_idx, DType::I32, dims.max_bsz)?;
    check.exact("max_dec_len", state.max_dec_len, DType::I32, dims.max_bsz)?;
    check.at_least("end_tokens", state.end_tokens, DType::I32, 1)?;
    if let Some(host) = &params.host {
        let t_out = host.validate(check.op, dims)?;
        if params.rows != t_out {
            return Err(Error::invalid(
                check.op,
                "rows",
                format!("T_out = {t_out}"),
                params.rows,
            ));
        }
    }
    let rows = params.rows;
    check.exact("seeds", inputs.seeds, DType::U64, rows)?;
    let mut float_dtypes = None;
    match inputs.strategy {
        StrategyInputs::Greedy { target_tokens }
        | StrategyInputs::TargetMatch { target_tokens } => {
            check.exact("target_tokens", target_tokens, DType::I32, rows)?;
        }
        StrategyInputs::TopP {
            candidate_ids,
            candidate_scores,
            candidate_lens,
            candidates,
        } => {
            super::rows::check_candidates_count(&check, candidates)?;
            let len = check.product("candidate_ids", rows, candidates)?;
            check.exact("candidate_ids", candidate_ids, DType::I32, len)?;
            check.exact("candidate_scores", candidate_scores, DType::F32, len)?;
            check.exact("candidate_lens", candidate_lens, DType::I32, rows)?;
        }
        StrategyInputs::Rejection {
            target_probs,
            draft_probs,
            top_k,
            top_p,
        } => {
            let target_len = check.product("target_probs", rows, params.vocab)?;
            let target = check.float("target_probs", target_probs, target_len)?;
            let draft_rows = dims.max_bsz * (dims.max_step_tokens - 1);
            let draft_len = check.product("draft_probs", draft_rows, params.vocab)?;
            let draft = check.float("draft_probs", draft_probs, draft_len)?;
            check.exact("top_k", top_k, DType::I32, rows)?;
            check.exact("top_p", top_p, DType::F32, rows)?;
            float_dtypes = Some((target, draft));
        }
    }
    check.exact("accept_tokens", out.accept_tokens, DType::I32, slot_tokens)?;
    check.exact("accept_num", out.accept_num, DType::I32, dims.max_bsz)?;
    Ok(float_dtypes)
}

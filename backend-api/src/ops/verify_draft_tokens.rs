//! `verify_draft_tokens` (`docs/semantics.md` §5.8) and its strategies: arguments and validation.

use super::{BatchDims, Check, HostSlotLens, RowShape, Scores, SlotLens, check_candidates_count};
use crate::call::{Call, DeviceDesc};
use crate::{Buffer, DType, Error, Op, Result};

/// A validated `verify_draft_tokens`. Nothing to launch when `max_bsz == 0` (with `max_bsz > 0`
/// every slot's `accept_num` is written, live or not).
pub type VerifyDraftTokensCall<'c, 'o> =
    Call<'c, VerifyInputs<'c>, VerifyOutputs<'o>, VerifyParams<'c>, VerifyFacts>;

/// The op's validated call under the uniform name the op table uses ([`AnyCall`](crate::backend::AnyCall)).
pub type OpCall<'c, 'o> = VerifyDraftTokensCall<'c, 'o>;

/// What validation derived for `verify_draft_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifyFacts {
    /// The float dtypes of the REJECTION rows `(target, draft)`; `None` for the other strategies.
    pub rejection_dtypes: Option<(DType, DType)>,
    /// The REJECTION rows are logits (weighed by `docs/semantics.md` §4b) rather than
    /// probabilities.
    pub logits: bool,
    /// The number of REJECTION draft rows: `n_drafts` with a `draft_index`, `max_bsz · (S − 1)`
    /// without one; 0 for the other strategies.
    pub draft_rows: usize,
}

/// How drafts are checked and the phase-2 token chosen (`docs/semantics.md` §5.8).
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

impl_named!(Strategy, "strategy");

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
    /// The output of `top_p_candidates`.
    TopP(CandidateInputs<'a>),
    /// Target and draft rows with the target's filter.
    Rejection(RejectionInputs<'a>),
}

/// TOPP's inputs, the output of `top_p_candidates`: `ids [rows, C]`, `scores [rows, C]`,
/// `lens [rows]`.
#[derive(Clone, Copy, Debug)]
pub struct CandidateInputs<'a> {
    /// Candidate ids.
    pub candidate_ids: &'a Buffer,
    /// Candidate probabilities.
    pub candidate_scores: &'a Buffer,
    /// Candidate counts reaching `top_p`.
    pub candidate_lens: &'a Buffer,
    /// `C`, candidates per row.
    pub candidates: usize,
}

/// REJECTION's inputs (`docs/semantics.md` §5.8): target rows `[rows, V]` and draft rows (f32/f16/bf16
/// each), and the target's per-row `top_k` i32 / `top_p` f32 filter. The draft rows are dense,
/// `[max_bsz · (S − 1), V]`, or compact, `[n_drafts, V]` (`n_drafts ≥ 1`) with a `draft_index`
/// naming the row of each draft.
#[derive(Clone, Copy, Debug)]
pub struct RejectionInputs<'a> {
    /// Target rows: probabilities, or logits with their per-row temperature.
    pub target: Scores<'a>,
    /// Draft rows of the same kind as the target (logits are weighed at the temperature of
    /// the output row they are checked against): without `draft_index`, row `b · (S − 1) + i`
    /// is draft `i + 1` of slot `b`; with it, a whole number `n_drafts ≥ 1` of rows of `V`.
    pub draft: &'a Buffer,
    /// Optional `[max_bsz · (S − 1)]` i32 (`docs/semantics.md` §5.8.1): entry `b · (S − 1) + i`
    /// is the row of `draft` that holds draft `i + 1` of slot `b`. Only the entries of drafts
    /// actually tested are read; one outside `[0, n_drafts)` rejects its draft, and the
    /// correction is sampled from the target row as `top_k_top_p_sample` does (§5.6), as for a
    /// row that is not a distribution. `None`: the dense layout (the identity index).
    pub draft_index: Option<&'a Buffer>,
    /// Per-row `top_k` of the target filter.
    pub top_k: &'a Buffer,
    /// Per-row `top_p` of the target filter.
    pub top_p: &'a Buffer,
    /// Optional `[rows]` i32 (from `process_logits`, `docs/semantics.md` §4c): a target row
    /// whose kept weight is 0 yields this token where it would yield its first token in rank
    /// order (-1: none, so the slot emits `end_tokens[0]` and stops).
    pub fallback: Option<&'a Buffer>,
}

impl StrategyInputs<'_> {
    /// The strategy these inputs are for.
    pub fn strategy(&self) -> Strategy {
        match self {
            StrategyInputs::Greedy { .. } => Strategy::Greedy,
            StrategyInputs::TargetMatch { .. } => Strategy::TargetMatch,
            StrategyInputs::TopP(_) => Strategy::TopP,
            StrategyInputs::Rejection(_) => Strategy::Rejection,
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

/// Validates `verify_draft_tokens`.
pub(crate) fn validate<'c, 'o>(
    device: &DeviceDesc,
    inputs: &VerifyInputs<'c>,
    out: &'c mut VerifyOutputs<'o>,
    params: &VerifyParams<'c>,
) -> Result<VerifyDraftTokensCall<'c, 'o>> {
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
    let facts = match inputs.strategy {
        StrategyInputs::Greedy { target_tokens }
        | StrategyInputs::TargetMatch { target_tokens } => {
            check.exact("target_tokens", target_tokens, DType::I32, rows)?;
            VerifyFacts {
                rejection_dtypes: None,
                logits: false,
                draft_rows: 0,
            }
        }
        StrategyInputs::TopP(c) => {
            validate_candidates(&check, &c, rows)?;
            VerifyFacts {
                rejection_dtypes: None,
                logits: false,
                draft_rows: 0,
            }
        }
        StrategyInputs::Rejection(r) => validate_rejection(&check, &r, params)?,
    };
    check.exact("accept_tokens", out.accept_tokens, DType::I32, slot_tokens)?;
    check.exact("accept_num", out.accept_num, DType::I32, dims.max_bsz)?;
    let call = Call::new(*inputs, out, *params, facts);
    Ok(call
        .with_extent(params.rows, params.vocab)
        .launching_nothing_if(params.dims.max_bsz == 0))
}

/// Validates TOPP's candidates of `rows` output rows.
fn validate_candidates(check: &Check<'_>, c: &CandidateInputs<'_>, rows: usize) -> Result<()> {
    check_candidates_count(check, c.candidates)?;
    let len = check.product("candidate_ids", rows, c.candidates)?;
    check.exact("candidate_ids", c.candidate_ids, DType::I32, len)?;
    check.exact("candidate_scores", c.candidate_scores, DType::F32, len)?;
    check.exact("candidate_lens", c.candidate_lens, DType::I32, rows)
}

/// Validates REJECTION's target and draft rows and filter; the facts name their dtypes.
fn validate_rejection(
    check: &Check<'_>,
    r: &RejectionInputs<'_>,
    params: &VerifyParams<'_>,
) -> Result<VerifyFacts> {
    let (rows, dims) = (params.rows, &params.dims);
    let shape = RowShape {
        rows,
        vocab: params.vocab,
    };
    let kind = r
        .target
        .validate(check, ("target_probs", "target_logits"), &shape)?;
    let draft_arg = if kind.logits {
        "draft_logits"
    } else {
        "draft_probs"
    };
    let dense_rows = check.product("draft_index", dims.max_bsz, dims.max_step_tokens - 1)?;
    let (draft, draft_rows) = match r.draft_index {
        None => {
            let draft_len = check.product(draft_arg, dense_rows, params.vocab)?;
            (check.float(draft_arg, r.draft, draft_len)?, dense_rows)
        }
        Some(index) => {
            check.exact("draft_index", index, DType::I32, dense_rows)?;
            check.float_rows(draft_arg, r.draft, params.vocab)?
        }
    };
    check.exact("top_k", r.top_k, DType::I32, rows)?;
    check.exact("top_p", r.top_p, DType::F32, rows)?;
    check.fallback(r.fallback, rows)?;
    Ok(VerifyFacts {
        rejection_dtypes: Some((kind.dtype, draft)),
        logits: kind.logits,
        draft_rows,
    })
}

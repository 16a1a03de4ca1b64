//! `verify_draft_tokens` (`docs/semantics.md` §5.8, `kernels/verify_draft_tokens.cl`): one cluster per slot;
//! the strategy is a build option (`STRATEGY`), and so is the kind of REJECTION's rows
//! (`LOGITS`: logits weighed by §4b, the draft rows at the temperature of their output row).

use specula_backend_api::WarmUp;
use specula_backend_api::ops::{Strategy, StrategyInputs, VerifyDraftTokensCall};
use specula_backend_api::{Buffer, DType, Op, Result};

use super::{ArgsStruct, count, flag, float_code, logits_code, program};
use crate::runtime::{KernelBuffers, ProgramKey, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `verify_draft_tokens_<dtype>` (`rj_fallback`: when `has_fallback`,
    /// REJECTION's token for a target row whose kept weight is 0; `draft_index`: when
    /// `has_draft_index`, the row of `draft_scores` (of `draft_rows`) of each draft,
    /// `docs/semantics.md` §5.8.1).
    pub(crate) struct VerifyDraftTokensArgs {
        max_bsz: u32,
        real_bsz: u32,
        max_step_tokens: u32,
        rows: u32,
        vocab: u32,
        num_end: u32,
        candidates: u32,
        accept_all: u32,
        reject_all: u32,
        has_fallback: u32,
        has_draft_index: u32,
        draft_rows: u32,
    }
}

/// The argument structs of `kernels/verify_draft_tokens.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<VerifyDraftTokensArgs>()];

/// The strategy's code in the kernel (`STRATEGY`).
fn strategy_code(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::Greedy => "0",
        Strategy::TargetMatch => "1",
        Strategy::TopP => "2",
        Strategy::Rejection => "3",
    }
}

/// The kernel's eleven strategy buffers, in parameter order (`target_tokens`, `cand_ids`,
/// `cand_scores`, `cand_lens`, `target_scores`, `temperature`, `draft_scores`, `rj_top_k`,
/// `rj_top_p`, `rj_fallback`, `draft_index`): those the strategy uses, `None` for the others
/// (`temperature` for logits rows only, `rj_fallback` and `draft_index` when given).
fn strategy_buffers<'b>(strategy: &StrategyInputs<'b>) -> [Option<&'b Buffer>; 11] {
    let mut buffers = [None; 11];
    match *strategy {
        StrategyInputs::Greedy { target_tokens }
        | StrategyInputs::TargetMatch { target_tokens } => buffers[0] = Some(target_tokens),
        StrategyInputs::TopP(c) => buffers[1..4].copy_from_slice(&[
            Some(c.candidate_ids),
            Some(c.candidate_scores),
            Some(c.candidate_lens),
        ]),
        StrategyInputs::Rejection(r) => buffers[4..].copy_from_slice(&[
            Some(r.target.matrix()),
            r.target.temperature(),
            Some(r.draft),
            Some(r.top_k),
            Some(r.top_p),
            r.fallback,
            r.draft_index,
        ]),
    }
    buffers
}

/// The program and entry point (`verify_draft_tokens_<dtype>`) of `strategy`, REJECTION's target
/// and draft storage formats (f32 for the other strategies) and rows' kind.
fn verify_program(
    strategy: Strategy,
    (target_dtype, draft_dtype): (DType, DType),
    logits: bool,
) -> (ProgramKey, String) {
    let entry = Op::VerifyDraftTokens.entry_point(target_dtype);
    let key = program(
        Op::VerifyDraftTokens,
        &[
            ("ENTRY", &entry),
            ("STRATEGY", strategy_code(strategy)),
            ("T_DTYPE", float_code(target_dtype)),
            ("D_DTYPE", float_code(draft_dtype)),
            ("LOGITS", logits_code(logits)),
        ],
    );
    (key, entry)
}

/// Launches `verify_draft_tokens_<dtype>` built for the call's strategy (and, for REJECTION, the
/// target and draft storage formats and the rows' kind).
pub(crate) fn run(runtime: &Runtime, mut call: VerifyDraftTokensCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, facts) = call.parts();
    let dtypes = facts.rejection_dtypes.unwrap_or((DType::F32, DType::F32));
    let (key, entry) = verify_program(inputs.strategy.strategy(), dtypes, facts.logits);
    let candidates = match inputs.strategy {
        StrategyInputs::TopP(c) => c.candidates,
        _ => 0,
    };
    let strategy = strategy_buffers(&inputs.strategy);
    let [.., rj_fallback, draft_index] = strategy;
    let (lens, state, dims) = (&inputs.lens, &inputs.state, &params.dims);
    let mut buffers = KernelBuffers::default();
    buffers
        .bind(&[
            inputs.draft_tokens,
            lens.seq_lens_this_time,
            lens.seq_lens_encoder,
            inputs.cu_seqlens_q_output,
            state.stop_flags,
            state.is_block_step,
            state.reasoning_status,
            state.step_idx,
            state.max_dec_len,
            state.end_tokens,
            inputs.seeds,
        ])?
        .bind_optional(runtime, &strategy)?
        .bind(&[out.accept_tokens, out.accept_num])?;
    let args = VerifyDraftTokensArgs {
        max_bsz: count(dims.max_bsz),
        real_bsz: count(dims.real_bsz),
        max_step_tokens: count(dims.max_step_tokens),
        rows: count(params.rows),
        vocab: count(params.vocab),
        num_end: count(state.end_tokens.len()),
        candidates: count(candidates),
        accept_all: flag(params.accept_all),
        reject_all: flag(params.reject_all),
        has_fallback: flag(rj_fallback.is_some()),
        has_draft_index: flag(draft_index.is_some()),
        draft_rows: count(facts.draft_rows),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch (what the warm-up builds): GREEDY, TARGET_MATCH and TOPP once
/// each; REJECTION for every target dtype of the plan and every draft float dtype, over
/// probabilities and logits rows.
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    let mut keys = Vec::new();
    for strategy in Strategy::ALL {
        if strategy != Strategy::Rejection {
            keys.push(verify_program(strategy, (DType::F32, DType::F32), false));
            continue;
        }
        for &target in plan.dtypes() {
            for draft in DType::FLOATS {
                for logits in [false, true] {
                    keys.push(verify_program(strategy, (target, draft), logits));
                }
            }
        }
    }
    keys.into_iter().map(super::single).collect()
}

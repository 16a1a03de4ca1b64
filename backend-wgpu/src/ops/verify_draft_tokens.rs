//! `verify_draft_tokens` (`shaders/verify_draft_tokens.wgsl`): one slot-walk dispatch; REJECTION
//! first samples the target rows (`top_k_top_p_sample`'s kernel, with the call's `fallback`) and
//! tests every (target row, draft row) pair, all recorded in the same submission.

use std::sync::Arc;

use specula_backend_api::ops::{
    RejectionInputs, RowShape, SampleInputs, StrategyInputs, VerifyDraftTokensCall, VerifyInputs,
    VerifyParams,
};
use specula_backend_api::{DType, Op, Result, Strategy};

use super::top_k_top_p_sample::sample_dispatches;
use super::{Binder, groups_for, u};
use crate::WgpuDevice;
use crate::gpu::{Dispatch, WgpuStorage};
use crate::kernels::{
    BatchHead, Entry, FloatKernel, Kernel, KernelFacts, Library, SLOT_WG, float_code,
};

specula_backend_api::kernel_args! {
    /// `verify_draft_tokens_i32`, after its [`BatchHead`]: the slot walk.
    pub(crate) struct VerifyDraftTokensArgs {
        rows: u32,
        vocab: u32,
        accept_all: u32,
        reject_all: u32,
        strategy: u32,
        candidates: u32,
        end_count: u32,
        draft_tokens_off: u32,
        this_time_off: u32,
        encoder_off: u32,
        cu_out_off: u32,
        stop_flags_off: u32,
        is_block_off: u32,
        reasoning_off: u32,
        step_idx_off: u32,
        max_dec_len_off: u32,
        end_tokens_off: u32,
        seeds_off: u32,
        targets_off: u32,
        cand_ids_off: u32,
        cand_scores_off: u32,
        cand_lens_off: u32,
        accept_tokens_off: u32,
        accept_num_off: u32,
    }

    /// `verify_draft_tokens_pair_<dtype>`, after its [`BatchHead`]: the REJECTION test of the
    /// drafts (pairs `pair_lo .. pair_lo + pairs_in_dispatch`, dense index `b · (S − 1) + i`) whose
    /// rows lie in one target chunk and one draft chunk (logits rows at the output row's
    /// `temperature` when `logits` is 1; the draft row of pair j is j, or with `has_draft_index`
    /// its entry of `draft_index`, one of `draft_rows`, `docs/semantics.md` §5.8.1).
    pub(crate) struct VerifyDraftTokensPairArgs {
        rows: u32,
        vocab: u32,
        accept_all: u32,
        target_row_lo: u32,
        target_row_hi: u32,
        target_off: u32,
        draft_row_lo: u32,
        draft_row_hi: u32,
        draft_off: u32,
        draft_dtype: u32,
        pairs_in_dispatch: u32,
        draft_tokens_off: u32,
        this_time_off: u32,
        cu_out_off: u32,
        seeds_off: u32,
        temperature_off: u32,
        logits: u32,
        pair_lo: u32,
        has_draft_index: u32,
        draft_index_off: u32,
        draft_rows: u32,
    }
}

/// `verify_draft_tokens_i32`.
const WALK: Entry<VerifyDraftTokensArgs, BatchHead> =
    Entry::new(Kernel::VerifyDraftTokens, None, 0);
/// `verify_draft_tokens_pair_<dtype>`.
const PAIR: Entry<VerifyDraftTokensPairArgs, BatchHead> =
    Entry::new(Kernel::VerifyDraftTokens, Some("pair"), 20);

/// The facts of `shaders/verify_draft_tokens.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts {
    libraries: &[Library::Select, Library::Draw],
    float_kernels: &[FloatKernel {
        suffix: Some("pair"),
        groups: "pp.pairs_in_dispatch",
    }],
    args: &[WALK.args(), PAIR.args()],
    constants: &[
        ("STRATEGY_GREEDY", strategy_code(Strategy::Greedy)),
        (
            "STRATEGY_TARGET_MATCH",
            strategy_code(Strategy::TargetMatch),
        ),
        ("STRATEGY_TOPP", strategy_code(Strategy::TopP)),
        ("STRATEGY_REJECTION", strategy_code(Strategy::Rejection)),
    ],
};

/// The strategy's code in the shader (`STRATEGY_*`, generated into the module from [`KERNEL`]).
const fn strategy_code(strategy: Strategy) -> u32 {
    match strategy {
        Strategy::Greedy => 0,
        Strategy::TargetMatch => 1,
        Strategy::TopP => 2,
        Strategy::Rejection => 3,
    }
}

/// REJECTION's intermediate results, read by the slot walk.
struct Rejection {
    /// `[rows]` i32: each target row sampled as 4.3.
    targets: Arc<WgpuStorage>,
    /// `[max_bsz · (S − 1)]` (status, token) pairs: the test of every draft (dense).
    pairs: Arc<WgpuStorage>,
}

/// The REJECTION inputs of a call and their float dtypes.
struct RejectionRows<'a> {
    inputs: RejectionInputs<'a>,
    target_dtype: DType,
    draft_dtype: DType,
    /// The rows of `inputs.draft` (`n_drafts` when compact, else `max_bsz · (S − 1)`).
    draft_rows: usize,
}

/// Records the sampling of the target rows and, unless `reject_all`, the test of the drafts (an
/// id outside [0, V) weighs 0 in both rows and is tested like any other, under accept_all too);
/// returns the scratch buffers the slot walk reads.
fn rejection_dispatches(
    device: &WgpuDevice,
    inputs: &VerifyInputs<'_>,
    params: &VerifyParams<'_>,
    rejection: &RejectionRows<'_>,
    dispatches: &mut Vec<Dispatch>,
) -> Result<Rejection> {
    let op = Op::VerifyDraftTokens;
    let gpu = &device.gpu;
    let dims = &params.dims;
    let rows = params.rows;
    let pair_count = dims.max_bsz * (dims.max_step_tokens - 1);
    let targets = device.scratch("verify targets", (rows * 4) as u64)?;
    let aux = device.scratch("verify kept sets", (rows * 32) as u64)?;
    let pairs = device.scratch("verify pairs", (pair_count * 8) as u64)?;
    let sample = SampleInputs {
        scores: rejection.inputs.target,
        top_k: rejection.inputs.top_k,
        top_p: rejection.inputs.top_p,
        seed: inputs.seeds,
        // A target row of kept weight 0 (a row of total weight 0) samples its fallback, which the
        // slot walk then reads wherever REJECTION samples the target row.
        fallback: rejection.inputs.fallback,
    };
    let shape = RowShape {
        rows,
        vocab: params.vocab,
    };
    dispatches.extend(sample_dispatches(
        device,
        op,
        rejection.target_dtype,
        &sample,
        gpu.bind_scratch(&targets),
        Some(gpu.bind_scratch(&aux)),
        &shape,
    )?);
    // Under accept_all only the drafts outside [0, V) are tested; reject_all tests none.
    if !params.reject_all && pair_count > 0 {
        let draft_rows = rejection.draft_rows;
        for tc in gpu.row_chunks(rejection.inputs.target.matrix(), rows, params.vocab) {
            for dc in gpu.row_chunks(rejection.inputs.draft, draft_rows, params.vocab) {
                dispatches.push(pair_dispatch(
                    device,
                    inputs,
                    params,
                    rejection,
                    (&aux, &pairs),
                    tc,
                    dc,
                )?);
            }
        }
    }
    Ok(Rejection { targets, pairs })
}

/// The pair test of the draft rows in chunk `dc` against the target rows in chunk `tc`: densely
/// the pairs of those rows, with a `draft_index` every pair (each reads its row if in `dc`).
fn pair_dispatch(
    device: &WgpuDevice,
    inputs: &VerifyInputs<'_>,
    params: &VerifyParams<'_>,
    rejection: &RejectionRows<'_>,
    (aux, pairs): (&WgpuStorage, &WgpuStorage),
    tc: (usize, usize),
    dc: (usize, usize),
) -> Result<Dispatch> {
    let op = Op::VerifyDraftTokens;
    let dims = &params.dims;
    let vocab = params.vocab;
    let index = rejection.inputs.draft_index;
    let (pair_lo, pair_count) = match index {
        Some(_) => (0, dims.max_bsz * (dims.max_step_tokens - 1)),
        None => (dc.0, dc.1 - dc.0),
    };
    let mut b = Binder::new(device, op);
    b.scratch(27, aux);
    b.scratch(28, pairs);
    let args = VerifyDraftTokensPairArgs {
        rows: u(params.rows),
        vocab: u(vocab),
        accept_all: u32::from(params.accept_all),
        target_row_lo: u(tc.0),
        target_row_hi: u(tc.1),
        target_off: b.rows(21, rejection.inputs.target.matrix(), vocab, tc)?,
        draft_row_lo: u(dc.0),
        draft_row_hi: u(dc.1),
        draft_off: b.rows(22, rejection.inputs.draft, vocab, dc)?,
        draft_dtype: float_code(rejection.draft_dtype),
        pairs_in_dispatch: u(pair_count),
        draft_tokens_off: b.buffer(23, inputs.draft_tokens)?,
        this_time_off: b.buffer(24, inputs.lens.seq_lens_this_time)?,
        cu_out_off: b.buffer(25, inputs.cu_seqlens_q_output)?,
        seeds_off: b.buffer(26, inputs.seeds)?,
        temperature_off: b.optional(29, rejection.inputs.target.temperature())?,
        logits: u32::from(rejection.inputs.target.is_logits()),
        pair_lo: u(pair_lo),
        has_draft_index: u32::from(index.is_some()),
        draft_index_off: b.optional(30, index)?,
        draft_rows: u(rejection.draft_rows),
    };
    Ok(b.dispatch_with_head(
        &PAIR,
        rejection.target_dtype,
        (&BatchHead::of(dims), &args),
        args.pairs_in_dispatch,
    ))
}

/// Binds the strategy's inputs (12 targets, 13–15 candidates, 16 pairs); returns the offsets of
/// targets, candidate ids, scores and lens, and `C`.
fn bind_strategy(
    b: &mut Binder<'_>,
    strategy: &StrategyInputs<'_>,
    rejection: Option<&Rejection>,
) -> Result<([u32; 4], usize)> {
    match *strategy {
        StrategyInputs::Greedy { target_tokens }
        | StrategyInputs::TargetMatch { target_tokens } => {
            let targets = b.buffer(12, target_tokens)?;
            let unused = [b.dummy(13), b.dummy(14), b.dummy(15)];
            b.dummy(16);
            Ok(([targets, unused[0], unused[1], unused[2]], 1))
        }
        StrategyInputs::TopP(c) => {
            let targets = b.dummy(12);
            let ids = b.buffer(13, c.candidate_ids)?;
            let scores = b.buffer(14, c.candidate_scores)?;
            let lens = b.buffer(15, c.candidate_lens)?;
            b.dummy(16);
            Ok(([targets, ids, scores, lens], c.candidates))
        }
        StrategyInputs::Rejection(_) => {
            let Some(rejection) = rejection else {
                return Err(crate::error::unsupported(
                    Op::VerifyDraftTokens,
                    "REJECTION without float inputs",
                ));
            };
            b.scratch(12, &rejection.targets);
            let unused = [b.dummy(13), b.dummy(14), b.dummy(15)];
            b.scratch(16, &rejection.pairs);
            Ok(([0, unused[0], unused[1], unused[2]], 1))
        }
    }
}

/// Records and submits the REJECTION dispatches (if any) and the slot walk.
pub(crate) fn run(device: &WgpuDevice, mut call: VerifyDraftTokensCall<'_, '_>) -> Result<()> {
    let op = Op::VerifyDraftTokens;
    let (inputs, out, params, facts) = call.parts();
    let dims = &params.dims;
    let mut dispatches = Vec::new();
    let rejection = match (inputs.strategy, facts.rejection_dtypes) {
        (StrategyInputs::Rejection(r), Some((target_dtype, draft_dtype))) => {
            let rows = RejectionRows {
                inputs: r,
                target_dtype,
                draft_dtype,
                draft_rows: facts.draft_rows,
            };
            Some(rejection_dispatches(
                device,
                inputs,
                params,
                &rows,
                &mut dispatches,
            )?)
        }
        _ => None,
    };

    let mut b = Binder::new(device, op);
    let ([targets_off, cand_ids_off, cand_scores_off, cand_lens_off], candidates) =
        bind_strategy(&mut b, &inputs.strategy, rejection.as_ref())?;
    let args = VerifyDraftTokensArgs {
        rows: u(params.rows),
        vocab: u(params.vocab),
        accept_all: u32::from(params.accept_all && !params.reject_all),
        reject_all: u32::from(params.reject_all),
        strategy: strategy_code(inputs.strategy.strategy()),
        candidates: u(candidates),
        end_count: u(inputs.state.end_tokens.len()),
        draft_tokens_off: b.buffer(1, inputs.draft_tokens)?,
        this_time_off: b.buffer(2, inputs.lens.seq_lens_this_time)?,
        encoder_off: b.buffer(3, inputs.lens.seq_lens_encoder)?,
        cu_out_off: b.buffer(4, inputs.cu_seqlens_q_output)?,
        stop_flags_off: b.buffer(5, inputs.state.stop_flags)?,
        is_block_off: b.buffer(6, inputs.state.is_block_step)?,
        reasoning_off: b.buffer(7, inputs.state.reasoning_status)?,
        step_idx_off: b.buffer(8, inputs.state.step_idx)?,
        max_dec_len_off: b.buffer(9, inputs.state.max_dec_len)?,
        end_tokens_off: b.buffer(10, inputs.state.end_tokens)?,
        seeds_off: b.buffer(11, inputs.seeds)?,
        targets_off,
        cand_ids_off,
        cand_scores_off,
        cand_lens_off,
        accept_tokens_off: b.buffer(17, out.accept_tokens)?,
        accept_num_off: b.buffer(18, out.accept_num)?,
    };
    let groups = groups_for(dims.max_bsz, SLOT_WG);
    dispatches.push(b.batch_dispatch(&WALK, dims, &args, groups));
    device.gpu.run(op, dispatches)
}

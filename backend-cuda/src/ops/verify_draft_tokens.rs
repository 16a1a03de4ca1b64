//! `verify_draft_tokens` (`docs/semantics.md` §5.8): draft checks and the correction or bonus token
//! (`kernels/verify_draft_tokens.cu`). GREEDY, TARGET_MATCH and TOPP run one thread per slot;
//! REJECTION runs a per-row pre-pass (target kept sets, draft totals or maxima) and then one block
//! per slot, on probability rows or on logits rows weighed at the output rows' temperatures
//! (`docs/semantics.md` §4b).

use specula_backend_api::ops::{Strategy, StrategyInputs, VerifyDraftTokensCall};
use specula_backend_api::{DType, Op, Result};

use super::{flag, grid_x, to_u32};
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile, Library};
use crate::launch::{self, BATCH_BLOCK, SELECT_BLOCK};

cuda_args! {
    /// The argument block of every entry point of `kernels/verify_draft_tokens.cu`.
    pub(crate) struct VerifyArgs {
        draft_tokens: u64 as "const i32*",            // [max_bsz, S]
        this_time: u64 as "const i32*",               // [max_bsz]
        encoder: u64 as "const i32*",                 // [max_bsz]
        cu_out: u64 as "const i32*",                  // [real_bsz + 1]
        stop_flags: u64 as "const u8*",               // [max_bsz]
        is_block_step: u64 as "const u8*",            // [max_bsz]
        reasoning: u64 as "const i32*",               // [max_bsz]
        step_idx: u64 as "const i32*",                // [max_bsz]
        max_dec_len: u64 as "const i32*",             // [max_bsz]
        end_tokens: u64 as "const i32*",              // [n_end]
        seeds: u64 as "const u64*",                   // [rows]
        target_tokens: u64 as "const i32*",           // GREEDY / TARGET_MATCH: [rows]
        cand_ids: u64 as "const i32*",                // TOPP: [rows, C]
        cand_scores: u64 as "const float*",           // TOPP: [rows, C]
        cand_lens: u64 as "const i32*",               // TOPP: [rows]
        target_probs: u64 as "const SPECULA_T::raw*", // REJECTION: [rows, vocab]
        draft_probs: u64 as "const SPECULA_D::raw*",  // REJECTION: [draft_rows, vocab]
        top_k: u64 as "const i32*",                   // REJECTION: [rows]
        top_p: u64 as "const float*",                 // REJECTION: [rows]
        temperature: u64 as "const float*",           // REJECTION of logits rows: [rows]
        // REJECTION: [rows] or null: the sample of a row of kept weight 0
        fallback: u64 as "const i32*",
        // REJECTION: [max_bsz · (S − 1)] or null (dense): each draft's row
        draft_index: u64 as "const i32*",
        // REJECTION scratch: [rows] TargetStats, then [draft rows] DraftStat
        stats: u64 as "unsigned char*",
        accept_tokens: u64 as "i32*",                 // [max_bsz, S]
        accept_num: u64 as "i32*",                    // [max_bsz]
        rows: u64, max_step_tokens: u64, n_end: u64, candidates: u64, draft_rows: u64, max_bsz: u32,
        real_bsz: u32, vocab: u32, strategy: u32,
        accept_all: u32,                              // already false when reject_all
        reject_all: u32, vec_target: u32, vec_draft: u32,
        // REJECTION: target and draft rows are logits at `temperature`
        logits: u32, pad: u32,
    }
}

/// What `kernels/verify_draft_tokens.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &[
        "verify_draft_tokens",
        "verify_draft_tokens_rejection_prepare",
        "verify_draft_tokens_rejection",
    ],
    Instances::FloatPairs,
    &[ArgsStruct::of::<VerifyArgs>()],
)
.on(&[Library::Select])
.always_building(Instance::float(DType::F32, DType::F32));

/// The kernel file of this op.
const FILE: KernelFile = KernelFile::VerifyDraftTokens;

/// Bytes of one `TargetStats` entry of the REJECTION scratch (`verify_draft_tokens.cu`).
const TARGET_STATS_BYTES: u64 = 56;
/// Bytes of one draft row's entry in the REJECTION scratch (its total weight, or for logits rows
/// its maximum).
const DRAFT_TOTAL_BYTES: u64 = 8;

/// Launches the strategy's kernels over slots `0 .. max_bsz`.
pub(crate) fn run(device: &CudaDevice, mut call: VerifyDraftTokensCall<'_, '_>) -> Result<()> {
    let op = Op::VerifyDraftTokens;
    let (inputs, out, params, facts) = call.parts();
    let dims = &params.dims;
    let state = &inputs.state;
    let mut args = VerifyArgs {
        draft_tokens: device.ptr(op, inputs.draft_tokens)?,
        this_time: device.ptr(op, inputs.lens.seq_lens_this_time)?,
        encoder: device.ptr(op, inputs.lens.seq_lens_encoder)?,
        cu_out: device.ptr(op, inputs.cu_seqlens_q_output)?,
        stop_flags: device.ptr(op, state.stop_flags)?,
        is_block_step: device.ptr(op, state.is_block_step)?,
        reasoning: device.ptr(op, state.reasoning_status)?,
        step_idx: device.ptr(op, state.step_idx)?,
        max_dec_len: device.ptr(op, state.max_dec_len)?,
        end_tokens: device.ptr(op, state.end_tokens)?,
        seeds: device.ptr(op, inputs.seeds)?,
        accept_tokens: device.ptr(op, out.accept_tokens)?,
        accept_num: device.ptr(op, out.accept_num)?,
        rows: params.rows as u64,
        max_step_tokens: dims.max_step_tokens as u64,
        n_end: state.end_tokens.len() as u64,
        max_bsz: to_u32(op, "max_bsz", dims.max_bsz)?,
        real_bsz: to_u32(op, "real_bsz", dims.real_bsz)?,
        vocab: to_u32(op, "vocab", params.vocab)?,
        accept_all: flag(params.accept_all && !params.reject_all),
        reject_all: flag(params.reject_all),
        ..VerifyArgs::default()
    };
    match inputs.strategy {
        StrategyInputs::Greedy { target_tokens }
        | StrategyInputs::TargetMatch { target_tokens } => {
            args.target_tokens = device.ptr(op, target_tokens)?;
            args.strategy = if inputs.strategy.strategy() == Strategy::Greedy {
                launch::STRATEGY_GREEDY
            } else {
                launch::STRATEGY_TARGET_MATCH
            };
        }
        StrategyInputs::TopP(c) => {
            args.cand_ids = device.ptr(op, c.candidate_ids)?;
            args.cand_scores = device.ptr(op, c.candidate_scores)?;
            args.cand_lens = device.ptr(op, c.candidate_lens)?;
            args.candidates = c.candidates as u64;
            args.strategy = launch::STRATEGY_TOPP;
        }
        StrategyInputs::Rejection(r) => {
            let (target_probs, draft_probs) = (r.target.matrix(), r.draft);
            args.target_probs = device.ptr(op, target_probs)?;
            args.draft_probs = device.ptr(op, draft_probs)?;
            args.top_k = device.ptr(op, r.top_k)?;
            args.top_p = device.ptr(op, r.top_p)?;
            args.temperature = device.opt_ptr(op, r.target.temperature())?;
            args.fallback = device.opt_ptr(op, r.fallback)?;
            // Null: the dense rows; else the compact rows' index (`docs/semantics.md` §5.8.1).
            args.draft_index = device.opt_ptr(op, r.draft_index)?;
            args.draft_rows = facts.draft_rows as u64;
            args.logits = flag(facts.logits);
            args.strategy = launch::STRATEGY_REJECTION;
            args.vec_target = device.vec_ok(op, target_probs, params.vocab)?;
            args.vec_draft = device.vec_ok(op, draft_probs, params.vocab)?;
            let (target, draft) = facts.rejection_dtypes.unwrap_or((DType::F32, DType::F32));
            return rejection(device, &mut args, Instance::float(target, draft));
        }
    }
    let kernels = device.kernels(FILE, Instance::float(DType::F32, DType::F32));
    let blocks = launch::blocks_for(dims.max_bsz, BATCH_BLOCK);
    kernels.launch_batch("verify_draft_tokens", blocks, &args)
}

/// REJECTION: the pre-pass over every target and draft row (`args.draft_rows`, dense or
/// compact) into scratch, then one block per slot.
fn rejection(device: &CudaDevice, args: &mut VerifyArgs, instance: Instance) -> Result<()> {
    let op = Op::VerifyDraftTokens;
    let draft_rows = args.draft_rows;
    let scratch_bytes = TARGET_STATS_BYTES * args.rows + DRAFT_TOTAL_BYTES * draft_rows;
    let scratch = device.scratch(op, scratch_bytes)?;
    args.stats = scratch.ptr();
    let kernels = device.kernels(FILE, instance);
    let prepare_blocks = args.rows + draft_rows;
    if prepare_blocks > 0 {
        let blocks = usize::try_from(prepare_blocks).unwrap_or(usize::MAX);
        let grid = (grid_x(op, blocks)?, 1, 1);
        let prepare = "verify_draft_tokens_rejection_prepare";
        kernels.launch(prepare, grid, SELECT_BLOCK, args)?;
    }
    let grid = (args.max_bsz, 1, 1);
    kernels.launch("verify_draft_tokens_rejection", grid, SELECT_BLOCK, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_stats_bytes_match_the_kernel_struct() {
        let body = FILE.body();
        let fields = specula_backend_api::abi::c_struct_fields(body, "TargetStats")
            .expect("TargetStats in verify_draft_tokens.cu");
        let bytes: usize = fields.iter().map(|(_, b)| b).sum();
        assert_eq!(bytes as u64, TARGET_STATS_BYTES);
    }
}

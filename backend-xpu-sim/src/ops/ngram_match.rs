//! `ngram_match` (`docs/semantics.md` §5.10, `kernels/ngram_match.cl`), two kernels: `ngram_match_i32` (one
//! cluster per decode slot searches and writes a proposal to scratch), then
//! `ngram_match_i32_budget` (one cluster grants the global draft budget in slot order).

use specula_backend_api::WarmUp;
use specula_backend_api::ops::NgramMatchCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, batch_program, count, scratch_i32};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `ngram_match_i32`, the search (`pad`: explicit padding to a multiple of
    /// 8 bytes, always 0).
    pub(crate) struct NgramMatchArgs {
        token_ids_all_offset: u64,
        prompt_lens_offset: u64,
        step_idx_offset: u64,
        draft_token_num_offset: u64,
        encoder_offset: u64,
        max_dec_len_offset: u64,
        this_time_offset: u64,
        proposal_offset: u64,
        max_model_len: u64,
        max_ngram_size: u64,
        real_bsz: u32,
        max_step_tokens: u32,
        min_ngram_size: u32,
        pad: u32,
    }

    /// The parameters of `ngram_match_i32_budget`, the global budget.
    pub(crate) struct NgramMatchBudgetArgs {
        token_ids_all_offset: u64,
        encoder_offset: u64,
        proposal_offset: u64,
        draft_tokens_offset: u64,
        this_time_offset: u64,
        max_model_len: u64,
        threshold: u64,
        real_bsz: u32,
        max_step_tokens: u32,
    }
}

/// The argument structs of `kernels/ngram_match.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[
    ArgsStruct::of::<NgramMatchArgs>(),
    ArgsStruct::of::<NgramMatchBudgetArgs>(),
];

/// The budget kernel of the program whose search kernel is `entry`.
fn budget_kernel(entry: &str) -> String {
    format!("{entry}_budget")
}

/// Launches the search, then the budget; the proposals (decode flag, start, length per slot) pass
/// between them in a scratch buffer.
pub(crate) fn run(runtime: &Runtime, mut call: NgramMatchCall<'_, '_>) -> Result<()> {
    let (inputs, out, params, _) = call.parts();
    let dims = &params.dims;
    let (key, entry) = batch_program(Op::NgramMatch);
    let proposal = scratch_i32(runtime, dims.real_bsz.saturating_mul(3))?;
    let mut buffers = KernelBuffers::default();
    let search = NgramMatchArgs {
        token_ids_all_offset: buffers.bind(inputs.token_ids_all)?,
        prompt_lens_offset: buffers.bind(inputs.prompt_lens)?,
        step_idx_offset: buffers.bind(inputs.step_idx)?,
        draft_token_num_offset: buffers.bind(inputs.draft_token_num)?,
        encoder_offset: buffers.bind(inputs.seq_lens_encoder)?,
        max_dec_len_offset: buffers.bind(inputs.max_dec_len)?,
        this_time_offset: buffers.bind(out.seq_lens_this_time)?,
        proposal_offset: buffers.bind_scratch(&proposal),
        max_model_len: params.max_model_len as u64,
        max_ngram_size: params.max_ngram_size as u64,
        real_bsz: count(dims.real_bsz),
        max_step_tokens: count(dims.max_step_tokens),
        min_ngram_size: count(params.min_ngram_size),
        pad: 0,
    };
    runtime.launch(&key, &entry, &buffers, &search)?;
    let mut buffers = KernelBuffers::default();
    let budget = NgramMatchBudgetArgs {
        token_ids_all_offset: buffers.bind(inputs.token_ids_all)?,
        encoder_offset: buffers.bind(inputs.seq_lens_encoder)?,
        proposal_offset: buffers.bind_scratch(&proposal),
        draft_tokens_offset: buffers.bind(out.draft_tokens)?,
        this_time_offset: buffers.bind(out.seq_lens_this_time)?,
        max_model_len: params.max_model_len as u64,
        threshold: params.threshold as u64,
        real_bsz: count(dims.real_bsz),
        max_step_tokens: count(dims.max_step_tokens),
    };
    runtime.launch(&key, &budget_kernel(&entry), &buffers, &budget)
}

/// The one program `run` launches, with the search and the budget kernel (what the warm-up
/// builds).
pub(crate) fn programs(_plan: &WarmUp) -> Vec<super::Program> {
    let (key, entry) = batch_program(Op::NgramMatch);
    let budget = budget_kernel(&entry);
    vec![(key, vec![entry, budget])]
}

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
        max_model_len: u64,
        max_ngram_size: u64,
        real_bsz: u32,
        max_step_tokens: u32,
        min_ngram_size: u32,
        pad: u32,
    }

    /// The parameters of `ngram_match_i32_budget`, the global budget.
    pub(crate) struct NgramMatchBudgetArgs {
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
    buffers
        .bind(&[
            inputs.token_ids_all,
            inputs.prompt_lens,
            inputs.step_idx,
            inputs.draft_token_num,
            inputs.seq_lens_encoder,
            inputs.max_dec_len,
            out.seq_lens_this_time,
        ])?
        .bind_scratch(&proposal);
    let search = NgramMatchArgs {
        max_model_len: params.max_model_len as u64,
        max_ngram_size: params.max_ngram_size as u64,
        real_bsz: count(dims.real_bsz),
        max_step_tokens: count(dims.max_step_tokens),
        min_ngram_size: count(params.min_ngram_size),
        pad: 0,
    };
    runtime.launch(&key, &entry, &buffers, &search)?;
    let mut buffers = KernelBuffers::default();
    buffers
        .bind(&[inputs.token_ids_all, inputs.seq_lens_encoder])?
        .bind_scratch(&proposal)
        .bind(&[out.draft_tokens, out.seq_lens_this_time])?;
    let budget = NgramMatchBudgetArgs {
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

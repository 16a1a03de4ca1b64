//! `ngram_match` (`shaders/ngram_match.wgsl`): two dispatches, the per-slot searches (one
//! workgroup per slot), then the budget walk (one invocation).

use specula_backend_api::ops::NgramMatchCall;
use specula_backend_api::{Op, Result};

use super::{Binder, split_u64, u};
use crate::WgpuDevice;
use crate::kernels::{BatchHead, Entry, Kernel, KernelFacts};

specula_backend_api::kernel_args! {
    /// `ngram_match_i32`, after its [`BatchHead`]: the per-slot search.
    pub(crate) struct NgramMatchArgs {
        max_model_len: u32,
        min_ngram: u32,
        max_ngram: u32,
        token_ids_all_off: u32,
        prompt_lens_off: u32,
        step_idx_off: u32,
        draft_token_num_off: u32,
        encoder_off: u32,
        max_dec_len_off: u32,
        this_time_off: u32,
    }

    /// `ngram_match_budget_i32`, after its [`BatchHead`]: the global budget walk; the threshold is
    /// the host's 64-bit value (compared exactly, as the CPU compares usize).
    pub(crate) struct NgramMatchBudgetArgs {
        max_model_len: u32,
        threshold_lo: u32,
        threshold_hi: u32,
        token_ids_all_off: u32,
        encoder_off: u32,
        this_time_off: u32,
        draft_tokens_off: u32,
    }
}

/// `ngram_match_i32`.
const SEARCH: Entry<NgramMatchArgs, BatchHead> = Entry::new(Kernel::NgramMatch, None, 0);
/// `ngram_match_budget_i32`.
const BUDGET: Entry<NgramMatchBudgetArgs, BatchHead> =
    Entry::new(Kernel::NgramMatch, Some("budget"), 10);

/// The facts of `shaders/ngram_match.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts::batch(&[SEARCH.args(), BUDGET.args()]);

/// Records and submits both dispatches.
pub(crate) fn run(device: &WgpuDevice, mut call: NgramMatchCall<'_, '_>) -> Result<()> {
    let op = Op::NgramMatch;
    let (inputs, out, params, ()) = call.parts();
    let dims = &params.dims;
    // Per slot: decode flag, first draft, number of drafts.
    let proposals = device.scratch("ngram proposals", (dims.real_bsz * 12) as u64)?;
    let mut b = Binder::new(device, op);
    b.scratch(8, &proposals);
    let args = NgramMatchArgs {
        max_model_len: u(params.max_model_len),
        min_ngram: u(params.min_ngram_size),
        max_ngram: u(params.max_ngram_size),
        token_ids_all_off: b.buffer(1, inputs.token_ids_all)?,
        prompt_lens_off: b.buffer(2, inputs.prompt_lens)?,
        step_idx_off: b.buffer(3, inputs.step_idx)?,
        draft_token_num_off: b.buffer(4, inputs.draft_token_num)?,
        encoder_off: b.buffer(5, inputs.seq_lens_encoder)?,
        max_dec_len_off: b.buffer(6, inputs.max_dec_len)?,
        this_time_off: b.buffer(7, out.seq_lens_this_time)?,
    };
    let search = b.batch_dispatch(&SEARCH, dims, &args, u(dims.real_bsz));

    let (threshold_lo, threshold_hi) = split_u64(params.threshold as u64);
    let mut b = Binder::new(device, op);
    b.scratch(13, &proposals);
    let args = NgramMatchBudgetArgs {
        max_model_len: u(params.max_model_len),
        threshold_lo,
        threshold_hi,
        token_ids_all_off: b.buffer(11, inputs.token_ids_all)?,
        encoder_off: b.buffer(12, inputs.seq_lens_encoder)?,
        this_time_off: b.buffer(14, out.seq_lens_this_time)?,
        draft_tokens_off: b.buffer(15, out.draft_tokens)?,
    };
    let budget = b.batch_dispatch(&BUDGET, dims, &args, 1);
    device.gpu.run(op, vec![search, budget])
}

//! `ngram_match` (`docs/semantics.md` §5.10): drafts by n-gram lookup in the prompt and the history
//! (`kernels/ngram_match.cu`): one block per slot proposes, then one block grants the global
//! draft budget in slot order.

use specula_backend_api::ops::NgramMatchCall;
use specula_backend_api::{DType, Op, Result};

use super::to_u32;
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile};

cuda_args! {
    /// The argument block of every entry point of `kernels/ngram_match.cu`.
    pub(crate) struct NgramArgs {
        token_ids_all: u64 as "const i32*",   // [max_bsz, max_model_len]
        prompt_lens: u64 as "const i32*",     // [max_bsz]
        step_idx: u64 as "const i32*",        // [max_bsz]
        draft_token_num: u64 as "const i32*", // [max_bsz]
        encoder: u64 as "const i32*",         // [max_bsz]
        max_dec_len: u64 as "const i32*",     // [max_bsz]
        draft_tokens: u64 as "i32*",          // [max_bsz, S]
        this_time: u64 as "i32*",             // [max_bsz]
        // scratch [real_bsz][2]: start in the row, (len | decode << 32)
        proposals: u64 as "u64*",
        max_model_len: u64, max_step_tokens: u64, threshold: u64, real_bsz: u32, min_ngram: u32,
        max_ngram: u32, pad: u32,
    }
}

/// What `kernels/ngram_match.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["ngram_match_propose", "ngram_match"],
    Instances::Integer(DType::I32),
    &[ArgsStruct::of::<NgramArgs>()],
);

/// Bytes of one slot's proposal in the scratch (start, and length | decode << 32).
const PROPOSAL_BYTES: u64 = 16;

/// Launches the proposal kernel over slots `0 .. real_bsz`, then the budget kernel.
pub(crate) fn run(device: &CudaDevice, mut call: NgramMatchCall<'_, '_>) -> Result<()> {
    let op = Op::NgramMatch;
    let (inputs, out, params, ()) = call.parts();
    let dims = &params.dims;
    let scratch = device.scratch(op, PROPOSAL_BYTES * dims.real_bsz as u64)?;
    // The front bounds the n-gram sizes by i32::MAX; saturating keeps any larger value meaning
    // "longer than every history".
    let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let args = NgramArgs {
        token_ids_all: device.ptr(op, inputs.token_ids_all)?,
        prompt_lens: device.ptr(op, inputs.prompt_lens)?,
        step_idx: device.ptr(op, inputs.step_idx)?,
        draft_token_num: device.ptr(op, inputs.draft_token_num)?,
        encoder: device.ptr(op, inputs.seq_lens_encoder)?,
        max_dec_len: device.ptr(op, inputs.max_dec_len)?,
        draft_tokens: device.ptr(op, out.draft_tokens)?,
        this_time: device.ptr(op, out.seq_lens_this_time)?,
        proposals: scratch.ptr(),
        max_model_len: params.max_model_len as u64,
        max_step_tokens: dims.max_step_tokens as u64,
        threshold: params.threshold as u64,
        real_bsz: to_u32(op, "real_bsz", dims.real_bsz)?,
        min_ngram: clamp(params.min_ngram_size),
        max_ngram: clamp(params.max_ngram_size),
        pad: 0,
    };
    let kernels = device.kernels(KernelFile::NgramMatch, Instance::integer(DType::I32));
    kernels.launch_batch("ngram_match_propose", args.real_bsz, &args)?;
    kernels.launch_batch("ngram_match", 1, &args)
}

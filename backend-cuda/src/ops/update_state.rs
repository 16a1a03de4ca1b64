//! `update_state` (`docs/semantics.md` §5.9): appends the emitted tokens and advances the per-slot state, one
//! thread per slot (`kernels/update_state.cu`), counting the appended tokens in `token_counts`
//! when it is given.

use specula_backend_api::ops::UpdateStateCall;
use specula_backend_api::{DType, Op, Result};

use super::to_u32;
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile};
use crate::launch::{self, BATCH_BLOCK};

cuda_args! {
    /// The argument block of every entry point of `kernels/update_state.cu`.
    pub(crate) struct UpdateStateArgs {
        accept_tokens: u64 as "const i32*", // [max_bsz, S]
        is_block_step: u64 as "const u8*",  // [max_bsz]
        prompt_lens: u64 as "const i32*",   // [max_bsz]
        max_dec_len: u64 as "const i32*",   // [max_bsz]
        end_tokens: u64 as "const i32*",    // [n_end]
        accept_num: u64 as "i32*",          // [max_bsz]
        stop_flags: u64 as "u8*",           // [max_bsz]
        token_ids_all: u64 as "i32*",       // [max_bsz, max_model_len]
        step_idx: u64 as "i32*",            // [max_bsz]
        infer_seed: u64 as "u64*",          // [max_bsz]
        draft_tokens: u64 as "i32*",        // [max_bsz, S]
        encoder: u64 as "i32*",             // [max_bsz]
        decoder: u64 as "i32*",             // [max_bsz]
        token_counts: u64 as "i32*",        // [max_bsz, vocab], or null
        max_model_len: u64, max_step_tokens: u64, n_end: u64,
        vocab: u64,                         // row length of token_counts (unused without it)
        real_bsz: u32, pad: u32,
    }
}

/// What `kernels/update_state.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["update_state"],
    Instances::Integer(DType::I32),
    &[ArgsStruct::of::<UpdateStateArgs>()],
);

/// Launches `update_state` over slots `0 .. real_bsz`.
pub(crate) fn run(device: &CudaDevice, mut call: UpdateStateCall<'_, '_>) -> Result<()> {
    let op = Op::UpdateState;
    let (inputs, state, params, ()) = call.parts();
    let dims = &params.dims;
    let args = UpdateStateArgs {
        accept_tokens: device.ptr(op, inputs.accept_tokens)?,
        is_block_step: device.ptr(op, inputs.is_block_step)?,
        prompt_lens: device.ptr(op, inputs.prompt_lens)?,
        max_dec_len: device.ptr(op, inputs.max_dec_len)?,
        end_tokens: device.ptr(op, inputs.end_tokens)?,
        accept_num: device.ptr(op, state.accept_num)?,
        stop_flags: device.ptr(op, state.stop_flags)?,
        token_ids_all: device.ptr(op, state.token_ids_all)?,
        step_idx: device.ptr(op, state.step_idx)?,
        infer_seed: device.ptr(op, state.infer_seed)?,
        draft_tokens: device.ptr(op, state.draft_tokens)?,
        encoder: device.ptr(op, state.seq_lens_encoder)?,
        decoder: device.ptr(op, state.seq_lens_decoder)?,
        token_counts: device.opt_ptr(op, state.token_counts.as_deref())?,
        max_model_len: params.max_model_len as u64,
        max_step_tokens: dims.max_step_tokens as u64,
        n_end: inputs.end_tokens.len() as u64,
        vocab: if state.token_counts.is_some() {
            params.vocab as u64
        } else {
            0
        },
        real_bsz: to_u32(op, "real_bsz", dims.real_bsz)?,
        pad: 0,
    };
    let kernels = device.kernels(KernelFile::UpdateState, Instance::integer(DType::I32));
    let blocks = launch::blocks_for(dims.real_bsz, BATCH_BLOCK);
    kernels.launch_batch("update_state", blocks, &args)
}

//! `accept_logprobs` (`docs/semantics.md` §5.11): log-probabilities, ranks and top-K of the accepted tokens
//! (`kernels/accept_logprobs.cu`): one block packs the accepted counts (the prefix sum has
//! `max_bsz + 1` entries even for an empty batch), then one block per packed entry scores it.

use specula_backend_api::ops::AcceptLogprobsCall;
use specula_backend_api::{Op, Result};

use super::{grid_x, to_u32};
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile, Library};
use crate::launch::SELECT_BLOCK;

cuda_args! {
    /// The argument block of every entry point of `kernels/accept_logprobs.cu`.
    pub(crate) struct LogprobsArgs {
        logits: u64 as "const SPECULA_T::raw*", // [rows, vocab]
        temperature: u64 as "const float*",     // [rows]
        accept_tokens: u64 as "const i32*",     // [max_bsz, S]
        accept_num: u64 as "const i32*",        // [max_bsz]
        encoder: u64 as "const i32*",           // [max_bsz]
        cu_out: u64 as "const i32*",            // [real_bsz + 1]
        cu_accept: u64 as "i32*",               // [max_bsz + 1]
        token_ids: u64 as "i32*",               // [max_bsz · S]
        logprobs: u64 as "float*",              // [max_bsz · S]
        ranks: u64 as "i32*",                   // [max_bsz · S]
        top_ids: u64 as "i32*",                 // [max_bsz · S, K]
        top_logprobs: u64 as "float*",          // [max_bsz · S, K]
        // scratch [max_bsz · S + 1]: slot << 16 ... see pack
        entries: u64 as "u32*",
        rows: u64, max_step_tokens: u64, max_bsz: u32, real_bsz: u32, vocab: u32, top_k: u32,
        vec: u32, pad: u32,
    }
}

/// What `kernels/accept_logprobs.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["accept_logprobs_pack", "accept_logprobs"],
    Instances::Float,
    &[ArgsStruct::of::<LogprobsArgs>()],
)
.on(&[Library::Select]);

/// Launches the pack kernel, then the scoring kernel over the `max_bsz · S` entries.
pub(crate) fn run(device: &CudaDevice, mut call: AcceptLogprobsCall<'_, '_>) -> Result<()> {
    let op = Op::AcceptLogprobs;
    let (inputs, out, params, &dtype) = call.parts();
    let dims = &params.dims;
    let entries = dims.max_bsz * dims.max_step_tokens;
    // Two u32 per entry (slot, position), then the total.
    let scratch = device.scratch(op, 4 * (2 * entries as u64 + 1))?;
    let args = LogprobsArgs {
        logits: device.ptr(op, inputs.logits)?,
        temperature: device.ptr(op, inputs.temperature)?,
        accept_tokens: device.ptr(op, inputs.accept_tokens)?,
        accept_num: device.ptr(op, inputs.accept_num)?,
        encoder: device.ptr(op, inputs.seq_lens_encoder)?,
        cu_out: device.ptr(op, inputs.cu_seqlens_q_output)?,
        cu_accept: device.ptr(op, out.cu_accept)?,
        token_ids: device.ptr(op, out.token_ids)?,
        logprobs: device.ptr(op, out.logprobs)?,
        ranks: device.ptr(op, out.ranks)?,
        top_ids: device.ptr(op, out.top_ids)?,
        top_logprobs: device.ptr(op, out.top_logprobs)?,
        entries: scratch.ptr(),
        rows: params.shape.rows as u64,
        max_step_tokens: dims.max_step_tokens as u64,
        max_bsz: to_u32(op, "max_bsz", dims.max_bsz)?,
        real_bsz: to_u32(op, "real_bsz", dims.real_bsz)?,
        vocab: to_u32(op, "vocab", params.shape.vocab)?,
        top_k: to_u32(op, "top_k", params.top_k)?,
        vec: device.vec_ok(op, inputs.logits, params.shape.vocab)?,
        pad: 0,
    };
    let kernels = device.kernels(KernelFile::AcceptLogprobs, Instance::float(dtype, dtype));
    kernels.launch_batch("accept_logprobs_pack", 1, &args)?;
    if entries == 0 {
        return Ok(());
    }
    let grid = (grid_x(op, entries)?, 1, 1);
    kernels.launch("accept_logprobs", grid, SELECT_BLOCK, &args)
}

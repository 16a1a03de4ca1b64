//! `gather_next_token` (`docs/semantics.md` §5.2): a bit-exact copy of the hidden-state row each output row
//! predicts from, one block per output row (`kernels/gather_next_token.cu`).

use specula_backend_api::ops::GatherNextTokenCall;
use specula_backend_api::{DType, Op, Result};

use super::{flag, grid_x, to_u32};
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile};
use crate::launch;

cuda_args! {
    /// The argument block of every entry point of `kernels/gather_next_token.cu`.
    pub(crate) struct GatherArgs {
        src: u64 as "const u8*",           // [token_num, row_bytes]
        dst: u64 as "u8*",                 // [out_rows, row_bytes]
        cu_seqlens_q: u64 as "const i32*", // [real_bsz + 1]
        this_time: u64 as "const i32*",    // [max_bsz]
        encoder: u64 as "const i32*",      // [max_bsz]
        cu_out: u64 as "const i32*",       // [real_bsz + 1]
        batch_id: u64 as "const i32*",     // [capacity]
        row_bytes: u64, token_num: u64, max_step_tokens: u64, out_rows: u32, real_bsz: u32,
        speculative: u32,
        unit: u32,                         // 16, 8, 4, 2 or 1 bytes
    }
}

/// What `kernels/gather_next_token.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["gather_next_token"],
    Instances::Integer(DType::U8),
    &[ArgsStruct::of::<GatherArgs>()],
);

/// Launches `gather_next_token` over the `rows` output rows validation derived.
pub(crate) fn run(device: &CudaDevice, mut call: GatherNextTokenCall<'_>) -> Result<()> {
    let op = Op::GatherNextToken;
    let (inputs, out, params, &rows) = call.parts();
    let row_bytes = (params.hidden * inputs.hidden_states.dtype().size_bytes()) as u64;
    let src = device.ptr(op, inputs.hidden_states)?;
    let dst = device.ptr(op, out)?;
    let args = GatherArgs {
        src,
        dst,
        cu_seqlens_q: device.ptr(op, inputs.cu_seqlens_q)?,
        this_time: device.ptr(op, inputs.lens.seq_lens_this_time)?,
        encoder: device.ptr(op, inputs.lens.seq_lens_encoder)?,
        cu_out: device.ptr(op, inputs.layout.cu_seqlens_q_output)?,
        batch_id: device.ptr(op, inputs.layout.batch_id_per_token_output)?,
        row_bytes,
        token_num: params.token_num as u64,
        max_step_tokens: params.dims.max_step_tokens as u64,
        out_rows: grid_x(op, rows)?,
        real_bsz: to_u32(op, "real_bsz", params.dims.real_bsz)?,
        speculative: flag(params.is_speculative),
        unit: launch::copy_unit(src, dst, row_bytes),
    };
    let kernels = device.kernels(KernelFile::GatherNextToken, Instance::integer(DType::U8));
    kernels.launch_batch("gather_next_token", args.out_rows, &args)
}

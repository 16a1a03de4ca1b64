//! `build_output_layout` (`docs/semantics.md` §5.1): rows per slot, the input and output prefix sums and the
//! slot of each output row, in one block (`kernels/build_output_layout.cu`).

use specula_backend_api::ops::BuildOutputLayoutCall;
use specula_backend_api::{DType, Op, Result};

use super::to_u32;
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile};

cuda_args! {
    /// The argument block of every entry point of `kernels/build_output_layout.cu`.
    pub(crate) struct LayoutArgs {
        this_time: u64 as "const i32*", // [max_bsz]
        encoder: u64 as "const i32*",   // [max_bsz]
        seq_lens_output: u64 as "i32*", // [max_bsz]
        cu_in: u64 as "i32*",           // [real_bsz + 1]
        cu_out: u64 as "i32*",          // [real_bsz + 1]
        batch_id: u64 as "i32*",        // [capacity]
        capacity: u64, max_step_tokens: u64, max_bsz: u32, real_bsz: u32,
    }
}

/// What `kernels/build_output_layout.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["build_output_layout"],
    Instances::Integer(DType::I32),
    &[ArgsStruct::of::<LayoutArgs>()],
);

/// Launches `build_output_layout`; the prefix sums have entries even for an empty batch, so the
/// front always calls it.
pub(crate) fn run(device: &CudaDevice, mut call: BuildOutputLayoutCall<'_, '_>) -> Result<()> {
    let op = Op::BuildOutputLayout;
    let (lens, out, params, &capacity) = call.parts();
    let dims = &params.dims;
    let args = LayoutArgs {
        this_time: device.ptr(op, lens.seq_lens_this_time)?,
        encoder: device.ptr(op, lens.seq_lens_encoder)?,
        seq_lens_output: device.ptr(op, out.seq_lens_output)?,
        cu_in: device.ptr(op, out.cu_seqlens_q)?,
        cu_out: device.ptr(op, out.cu_seqlens_q_output)?,
        batch_id: device.ptr(op, out.batch_id_per_token_output)?,
        capacity: capacity as u64,
        max_step_tokens: dims.max_step_tokens as u64,
        max_bsz: to_u32(op, "max_bsz", dims.max_bsz)?,
        real_bsz: to_u32(op, "real_bsz", dims.real_bsz)?,
    };
    let kernels = device.kernels(KernelFile::BuildOutputLayout, Instance::integer(DType::I32));
    kernels.launch_batch("build_output_layout", 1, &args)
}

//! `build_output_layout` (`docs/semantics.md` §5.1): rows per slot, the input and output prefix sums and the
//! slot of each output row, in one block (`kernels/build_output_layout.cu`).

use specula_backend_api::ops::BuildOutputLayoutCall;
use specula_backend_api::{DType, Op, Result};

use super::to_u32;
use crate::args::LayoutArgs;
use crate::device::CudaDevice;
use crate::kernels::{Instance, KernelFile};
use crate::launch::BATCH_BLOCK;

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
    kernels.launch("build_output_layout", (1, 1, 1), BATCH_BLOCK, &args)
}

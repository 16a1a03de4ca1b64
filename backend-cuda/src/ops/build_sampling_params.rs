//! `build_sampling_params` (`docs/semantics.md` §5.3): per-slot `top_p`, `top_k`, temperature and seeds
//! expanded per output row, one thread per row (`kernels/build_sampling_params.cu`).

use specula_backend_api::ops::BuildSamplingParamsCall;
use specula_backend_api::{DType, Op, Result};

use super::{grid_x, to_u32};
use crate::args::SamplingParamsArgs;
use crate::device::CudaDevice;
use crate::kernels::{Instance, KernelFile};
use crate::launch::{self, BATCH_BLOCK};

/// Launches `build_sampling_params` over the `rows` output rows validation derived.
pub(crate) fn run(device: &CudaDevice, mut call: BuildSamplingParamsCall<'_, '_>) -> Result<()> {
    let op = Op::BuildSamplingParams;
    let (inputs, out, params, &rows) = call.parts();
    let args = SamplingParamsArgs {
        slot_top_p: device.ptr(op, inputs.slots.top_p)?,
        slot_top_k: device.ptr(op, inputs.slots.top_k)?,
        slot_temperature: device.ptr(op, inputs.slots.temperature)?,
        slot_seed: device.ptr(op, inputs.slots.infer_seed)?,
        this_time: device.ptr(op, inputs.lens.seq_lens_this_time)?,
        encoder: device.ptr(op, inputs.lens.seq_lens_encoder)?,
        cu_out: device.ptr(op, inputs.layout.cu_seqlens_q_output)?,
        batch_id: device.ptr(op, inputs.layout.batch_id_per_token_output)?,
        top_p: device.ptr(op, out.top_p)?,
        top_k: device.ptr(op, out.top_k)?,
        temperature: device.ptr(op, out.temperature)?,
        seed: device.ptr(op, out.seed)?,
        rows: rows as u64,
        max_step_tokens: params.dims.max_step_tokens as u64,
        real_bsz: to_u32(op, "real_bsz", params.dims.real_bsz)?,
        pad: 0,
    };
    let kernels = device.kernels(
        KernelFile::BuildSamplingParams,
        Instance::integer(DType::I32),
    );
    let blocks = grid_x(op, launch::blocks_for(rows, BATCH_BLOCK) as usize)?;
    kernels.launch("build_sampling_params", (blocks, 1, 1), BATCH_BLOCK, &args)
}

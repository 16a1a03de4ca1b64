//! `build_sampling_params` (`docs/semantics.md` §5.3): per-slot `top_p`, `top_k`, temperature and seeds
//! expanded per output row, one thread per row (`kernels/build_sampling_params.cu`).

use specula_backend_api::ops::BuildSamplingParamsCall;
use specula_backend_api::{DType, Op, Result};

use super::{grid_x, to_u32};
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile};
use crate::launch::{self, BATCH_BLOCK};

cuda_args! {
    /// The argument block of every entry point of `kernels/build_sampling_params.cu`.
    pub(crate) struct SamplingParamsArgs {
        slot_top_p: u64 as "const float*",       // [max_bsz]
        slot_top_k: u64 as "const i32*",         // [max_bsz]
        slot_temperature: u64 as "const float*", // [max_bsz]
        slot_seed: u64 as "const u64*",          // [max_bsz]
        this_time: u64 as "const i32*",          // [max_bsz]
        encoder: u64 as "const i32*",            // [max_bsz]
        cu_out: u64 as "const i32*",             // [real_bsz + 1]
        batch_id: u64 as "const i32*",           // [rows]
        top_p: u64 as "float*",                  // [rows]
        top_k: u64 as "i32*",                    // [rows]
        temperature: u64 as "float*",            // [rows]
        seed: u64 as "u64*",                     // [rows]
        rows: u64, max_step_tokens: u64, real_bsz: u32, pad: u32,
    }
}

/// What `kernels/build_sampling_params.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["build_sampling_params"],
    Instances::Integer(DType::I32),
    &[ArgsStruct::of::<SamplingParamsArgs>()],
);

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
    kernels.launch_batch("build_sampling_params", blocks, &args)
}

//! `build_sampling_params` (`shaders/build_sampling_params.wgsl`): one dispatch, one invocation
//! per output row.

use specula_backend_api::ops::BuildSamplingParamsCall;
use specula_backend_api::{Op, Result};

use super::{Binder, element_groups, u};
use crate::WgpuDevice;
use crate::kernels::{BatchHead, Entry, Kernel, KernelFacts};

specula_backend_api::kernel_args! {
    /// `build_sampling_params_i32`, after its [`BatchHead`]: the shape and the offset of every
    /// buffer.
    pub(crate) struct BuildSamplingParamsArgs {
        rows: u32,
        top_p_off: u32,
        top_k_off: u32,
        temperature_off: u32,
        infer_seed_off: u32,
        this_time_off: u32,
        encoder_off: u32,
        cu_out_off: u32,
        batch_id_off: u32,
        out_top_p_off: u32,
        out_top_k_off: u32,
        out_temperature_off: u32,
        out_seed_off: u32,
    }
}

/// `build_sampling_params_i32`.
const BUILD: Entry<BuildSamplingParamsArgs, BatchHead> =
    Entry::new(Kernel::BuildSamplingParams, None, 0);

/// The facts of `shaders/build_sampling_params.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts::batch(&[BUILD.args()]);

/// Records and submits the dispatch.
pub(crate) fn run(device: &WgpuDevice, mut call: BuildSamplingParamsCall<'_, '_>) -> Result<()> {
    let op = Op::BuildSamplingParams;
    let (inputs, out, params, &rows) = call.parts();
    let dims = &params.dims;
    let mut b = Binder::new(device, op);
    let args = BuildSamplingParamsArgs {
        rows: u(rows),
        top_p_off: b.buffer(1, inputs.slots.top_p)?,
        top_k_off: b.buffer(2, inputs.slots.top_k)?,
        temperature_off: b.buffer(3, inputs.slots.temperature)?,
        infer_seed_off: b.buffer(4, inputs.slots.infer_seed)?,
        this_time_off: b.buffer(5, inputs.lens.seq_lens_this_time)?,
        encoder_off: b.buffer(6, inputs.lens.seq_lens_encoder)?,
        cu_out_off: b.buffer(7, inputs.layout.cu_seqlens_q_output)?,
        batch_id_off: b.buffer(8, inputs.layout.batch_id_per_token_output)?,
        out_top_p_off: b.buffer(9, out.top_p)?,
        out_top_k_off: b.buffer(10, out.top_k)?,
        out_temperature_off: b.buffer(11, out.temperature)?,
        out_seed_off: b.buffer(12, out.seed)?,
    };
    let d = b.batch_dispatch(&BUILD, dims, &args, element_groups(rows));
    device.gpu.run(op, vec![d])
}

//! `build_output_layout` (`docs/semantics.md` §5.1, `kernels/build_output_layout.cl`): a batch kernel on
//! cluster 0.

use specula_backend_api::WarmUp;
use specula_backend_api::ops::BuildOutputLayoutCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, batch_program, count};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `build_output_layout_i32`.
    pub(crate) struct BuildOutputLayoutArgs {
        max_bsz: u32,
        real_bsz: u32,
        max_step_tokens: u32,
        capacity: u32,
    }
}

/// The argument structs of `kernels/build_output_layout.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<BuildOutputLayoutArgs>()];

/// Launches `build_output_layout_i32`.
pub(crate) fn run(runtime: &Runtime, mut call: BuildOutputLayoutCall<'_, '_>) -> Result<()> {
    let (lens, out, params, capacity) = call.parts();
    let dims = &params.dims;
    let buffers = KernelBuffers::of(&[
        lens.seq_lens_this_time,
        lens.seq_lens_encoder,
        out.seq_lens_output,
        out.cu_seqlens_q,
        out.cu_seqlens_q_output,
        out.batch_id_per_token_output,
    ])?;
    let args = BuildOutputLayoutArgs {
        max_bsz: count(dims.max_bsz),
        real_bsz: count(dims.real_bsz),
        max_step_tokens: count(dims.max_step_tokens),
        capacity: count(*capacity),
    };
    let (key, entry) = batch_program(Op::BuildOutputLayout);
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The one program `run` launches (what the warm-up builds).
pub(crate) fn programs(_plan: &WarmUp) -> Vec<super::Program> {
    vec![super::single(batch_program(Op::BuildOutputLayout))]
}

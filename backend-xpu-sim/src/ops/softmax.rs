//! `softmax` (`docs/semantics.md` §5.5, `kernels/softmax.cl`): one cluster per row, f32 throughout.

use specula_backend_api::WarmUp;
use specula_backend_api::ops::SoftmaxCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, count, float_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `softmax_<dtype>`.
    pub(crate) struct SoftmaxArgs {
        rows: u32,
        vocab: u32,
    }
}

/// The argument structs of `kernels/softmax.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<SoftmaxArgs>()];

/// Launches `softmax_<dtype>`.
pub(crate) fn run(runtime: &Runtime, mut call: SoftmaxCall<'_>) -> Result<()> {
    let (inputs, probs, params, dtype) = call.parts();
    let (key, entry) = float_program(Op::Softmax, *dtype);
    let buffers = KernelBuffers::of(&[inputs.logits, inputs.temperature, probs])?;
    let args = SoftmaxArgs {
        rows: count(params.shape.rows),
        vocab: count(params.shape.vocab),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::float_programs(Op::Softmax, plan)
}

//! `argmax` (`docs/semantics.md` §5.4, `kernels/argmax.cl`): one cluster per row.

use specula_backend_api::WarmUp;
use specula_backend_api::ops::ArgmaxCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, count, float_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `argmax_<dtype>`.
    pub(crate) struct ArgmaxArgs {
        rows: u32,
        vocab: u32,
    }
}

/// The argument structs of `kernels/argmax.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<ArgmaxArgs>()];

/// Launches `argmax_<dtype>`.
pub(crate) fn run(runtime: &Runtime, mut call: ArgmaxCall<'_>) -> Result<()> {
    let (input, out, shape, dtype) = call.parts();
    let (key, entry) = float_program(Op::Argmax, *dtype);
    let buffers = KernelBuffers::of(&[input, out])?;
    let args = ArgmaxArgs {
        rows: count(shape.rows),
        vocab: count(shape.vocab),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::float_programs(Op::Argmax, plan)
}

//! `shard_exp_sum` (`docs/semantics.md` §5.17, `kernels/shard_exp_sum.cl`): one cluster per row
//! of logits.

use specula_backend_api::WarmUp;
use specula_backend_api::ops::shard_exp_sum::OpCall;
use specula_backend_api::{Op, Result};

use super::{ArgsStruct, count, float_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `shard_exp_sum_<dtype>`: `rows` rows of `len` logits.
    pub(crate) struct ShardExpSumArgs {
        rows: u32,
        len: u32,
    }
}

/// The argument structs of `kernels/shard_exp_sum.cl`, declared in its program from the Rust
/// above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<ShardExpSumArgs>()];

/// Launches `shard_exp_sum_<dtype>`.
pub(crate) fn run(runtime: &Runtime, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, sums, params, dtype) = call.parts();
    let (key, entry) = float_program(Op::ShardExpSum, *dtype);
    let buffers = KernelBuffers::of(&[inputs.logits, inputs.temperature, inputs.row_key, sums])?;
    let args = ShardExpSumArgs {
        rows: count(params.shape.rows),
        len: count(params.shape.slice.len),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::float_programs(Op::ShardExpSum, plan)
}

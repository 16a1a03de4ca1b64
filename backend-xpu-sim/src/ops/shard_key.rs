//! `shard_key` (`docs/semantics.md` §5.13, `kernels/shard_key.cl`): one cluster per row; rows of
//! probabilities or of logits (their temperature plays no part).

use specula_backend_api::WarmUp;
use specula_backend_api::ops::shard_key::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::order_code;
use super::{ArgsStruct, count, flag, scores_program};
use crate::runtime::{KernelBuffers, Runtime};

specula_backend_api::kernel_args! {
    /// The parameters of `shard_key_<dtype>`: `rows` rows of the slice `[first, first + len)`,
    /// keyed in `order`; with `has_ids` the key of token `ids[r]`.
    pub(crate) struct ShardKeyArgs {
        rows: u32,
        len: u32,
        first: u32,
        order: u32,
        has_ids: u32,
    }
}

/// The argument structs of `kernels/shard_key.cl`, declared in its program from the Rust above.
pub(crate) const ARGS: &[ArgsStruct] = &[ArgsStruct::of::<ShardKeyArgs>()];

/// Launches `shard_key_<dtype>` built for the rows' kind; without `ids` the kernel gets the
/// placeholder buffer and `has_ids = 0`.
pub(crate) fn run(runtime: &Runtime, mut call: OpCall<'_, '_>) -> Result<()> {
    let (inputs, keys, params, kind) = call.parts();
    let (key, entry) = scores_program(Op::ShardKey, *kind);
    let mut buffers = KernelBuffers::default();
    buffers
        .bind(&[inputs.scores.matrix()])?
        .bind_optional(runtime, &[inputs.ids])?
        .bind(&[keys])?;
    let slice = params.shape.slice;
    let args = ShardKeyArgs {
        rows: count(params.shape.rows),
        len: count(slice.len),
        first: count(slice.first),
        order: order_code(params.order),
        has_ids: flag(inputs.ids.is_some()),
    };
    runtime.launch(&key, &entry, &buffers, &args)
}

/// The programs `run` may launch: one per float dtype and row kind (what the warm-up builds).
pub(crate) fn programs(plan: &WarmUp) -> Vec<super::Program> {
    super::scores_programs(Op::ShardKey, plan)
}

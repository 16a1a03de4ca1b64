//! `shard_key` (`docs/semantics.md` §5.13): the largest key of each row of a slice, or a given
//! token's, one block per row (`kernels/shard_key.cu`).

use specula_backend_api::ops::shard_key::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::order_code;
use super::{flag, grid_x, to_u32};
use crate::args::ShardKeyArgs;
use crate::device::CudaDevice;
use crate::kernels::{Instance, KernelFile};
use crate::launch::ROW_BLOCK;

/// Launches `shard_key` over the call's rows.
pub(crate) fn run(device: &CudaDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let op = Op::ShardKey;
    let (inputs, keys, params, &kind) = call.parts();
    let shape = &params.shape;
    let matrix = inputs.scores.matrix();
    let args = ShardKeyArgs {
        scores: device.ptr(op, matrix)?,
        ids: device.opt_ptr(op, inputs.ids)?,
        keys: device.ptr(op, keys)?,
        rows: grid_x(op, shape.rows)?,
        len: to_u32(op, "len", shape.slice.len)?,
        first: to_u32(op, "first", shape.slice.first)?,
        order: order_code(params.order),
        logits: flag(kind.logits),
        vec: device.vec_ok(op, matrix, shape.slice.len)?,
    };
    let kernels = device.kernels(
        KernelFile::ShardKey,
        Instance::float(kind.dtype, kind.dtype),
    );
    kernels.launch("shard_key", (args.rows, 1, 1), ROW_BLOCK, &args)
}

//! `shard_exp_sum` (`docs/semantics.md` §5.17): each row's share of the softmax normaliser over a
//! slice of logits, one block per row (`kernels/shard_exp_sum.cu`).

use specula_backend_api::ops::shard_exp_sum::OpCall;
use specula_backend_api::{Op, Result};

use super::{grid_x, to_u32};
use crate::args::ShardExpSumArgs;
use crate::device::CudaDevice;
use crate::kernels::{Instance, KernelFile};
use crate::launch::ROW_BLOCK;

/// Launches `shard_exp_sum` over the call's rows.
pub(crate) fn run(device: &CudaDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let op = Op::ShardExpSum;
    let (inputs, sums, params, &dtype) = call.parts();
    let shape = &params.shape;
    let args = ShardExpSumArgs {
        logits: device.ptr(op, inputs.logits)?,
        temperature: device.ptr(op, inputs.temperature)?,
        row_key: device.ptr(op, inputs.row_key)?,
        sums: device.ptr(op, sums)?,
        rows: grid_x(op, shape.rows)?,
        len: to_u32(op, "len", shape.slice.len)?,
    };
    let kernels = device.kernels(KernelFile::ShardExpSum, Instance::float(dtype, dtype));
    kernels.launch("shard_exp_sum", (args.rows, 1, 1), ROW_BLOCK, &args)
}

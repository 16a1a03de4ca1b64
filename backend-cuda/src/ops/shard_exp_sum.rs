//! `shard_exp_sum` (`docs/semantics.md` §5.17): each row's share of the softmax normaliser over a
//! slice of logits, one block per row (`kernels/shard_exp_sum.cu`).

use specula_backend_api::ops::shard_exp_sum::OpCall;
use specula_backend_api::{Op, Result};

use super::{grid_x, to_u32};
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile, Library};
use crate::launch::ROW_BLOCK;

cuda_args! {
    /// The argument block of every entry point of `kernels/shard_exp_sum.cu`.
    pub(crate) struct ShardExpSumArgs {
        logits: u64 as "const SPECULA_T::raw*", // [rows, len]
        temperature: u64 as "const float*",     // [rows]
        row_key: u64 as "const u64*",           // [rows]
        sums: u64 as "float*",                  // [rows]
        rows: u32, len: u32,
    }
}

/// What `kernels/shard_exp_sum.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["shard_exp_sum"],
    Instances::Float,
    &[ArgsStruct::of::<ShardExpSumArgs>()],
)
.on(&[Library::Shard]);

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

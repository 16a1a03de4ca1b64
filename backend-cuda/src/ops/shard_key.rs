//! `shard_key` (`docs/semantics.md` §5.13): the largest key of each row of a slice, or a given
//! token's, one block per row (`kernels/shard_key.cu`).

use specula_backend_api::ops::shard_key::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::order_code;
use super::{flag, grid_x, to_u32};
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile, Library};
use crate::launch::ROW_BLOCK;

cuda_args! {
    /// The argument block of every entry point of `kernels/shard_key.cu`.
    pub(crate) struct ShardKeyArgs {
        scores: u64 as "const SPECULA_T::raw*", // [rows, len] probabilities or logits
        ids: u64 as "const i32*",               // [rows] global ids, or null
        keys: u64 as "u64*",                    // [rows]
        rows: u32, len: u32,
        first: u32,                             // the slice's first global id
        order: u32,                             // SHARD_ORDER_RANK or SHARD_ORDER_ARGMAX
        logits: u32, vec: u32,
    }
}

/// What `kernels/shard_key.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["shard_key"],
    Instances::Float,
    &[ArgsStruct::of::<ShardKeyArgs>()],
)
.on(&[Library::Shard]);

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

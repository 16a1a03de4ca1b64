//! `shard_records` (`docs/semantics.md` §5.14): the first `K` tokens of each row of a slice in key
//! order, as `(key, weight)` records, one block per row (`kernels/shard_records.cu`).

use specula_backend_api::ops::shard_records::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::{RowPointers, order_code};
use super::to_u32;
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile, Library};
use crate::launch::ROW_BLOCK;

cuda_args! {
    /// The argument block of every entry point of `kernels/shard_records.cu`.
    pub(crate) struct ShardRecordsArgs {
        scores: u64 as "const SPECULA_T::raw*", // [rows, len] probabilities or logits
        temperature: u64 as "const float*",     // [rows] (logits rows only)
        row_key: u64 as "const u64*",           // [rows]
        min_p: u64 as "const float*",           // [rows] or null
        records: u64 as "u64*",                 // [rows, K, 2]: (key, weight)
        rows: u32, len: u32, first: u32,
        records_per_row: u32,                   // K
        order: u32,                             // SHARD_ORDER_RANK or SHARD_ORDER_ARGMAX
        logits: u32, vec: u32, pad: u32,
    }
}

/// What `kernels/shard_records.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["shard_records"],
    Instances::Float,
    &[ArgsStruct::of::<ShardRecordsArgs>()],
)
.on(&[Library::Shard]);

/// Launches `shard_records` over the call's rows.
pub(crate) fn run(device: &CudaDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let op = Op::ShardRecords;
    let (inputs, records, params, &kind) = call.parts();
    let rows = RowPointers::of(device, op, inputs, &params.shape)?;
    let args = ShardRecordsArgs {
        scores: rows.scores,
        temperature: rows.temperature,
        row_key: rows.row_key,
        min_p: rows.min_p,
        records: device.ptr(op, records)?,
        rows: rows.rows,
        len: rows.len,
        first: rows.first,
        records_per_row: to_u32(op, "records", params.records)?,
        order: order_code(params.order),
        logits: rows.logits,
        vec: rows.vec,
        pad: 0,
    };
    let kernels = device.kernels(
        KernelFile::ShardRecords,
        Instance::float(kind.dtype, kind.dtype),
    );
    kernels.launch("shard_records", (args.rows, 1, 1), ROW_BLOCK, &args)
}

//! `shard_records` (`docs/semantics.md` §5.14, `shaders/shard_records.wgsl`): one workgroup per
//! row, one dispatch per row chunk.

use specula_backend_api::ops::shard_records::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::{order_code, shard_row_args, shard_row_dispatches};
use super::u;
use crate::WgpuDevice;
use crate::kernels::{Entry, Kernel, KernelFacts, Library, RowHead};

shard_row_args! {
    /// `shard_records_<dtype>`, after its [`RowHead`] and the
    /// [`BoundRows`](super::sharded::BoundRows) fields: rows `row0 ..` of the chunk bound at
    /// `input` (logits with their `temperature` when `logits` is 1), ids `first ..` of the
    /// vocabulary, weighed from `row_key` (and `min_p` when `has_min_p`); `records` (`K`) records
    /// each in `order`.
    pub(crate) struct ShardRecordsArgs {
        records_off: u32,
        first: u32,
        records: u32,
        order: u32,
    }
}

/// `shard_records_<dtype>`.
const SHARD_RECORDS: Entry<ShardRecordsArgs, RowHead> = Entry::new(Kernel::ShardRecords, None, 0);

/// The facts of `shaders/shard_records.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts::rows(
    &[Library::Shard, Library::ShardRows],
    &[SHARD_RECORDS.args()],
);

/// Records and submits one dispatch per row chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let op = Op::ShardRecords;
    let (inputs, records, params, &kind) = call.parts();
    let shape = params.shape.matrix();
    let kernel = (&SHARD_RECORDS, kind.dtype);
    let dispatches = shard_row_dispatches(device, op, kernel, inputs, &shape, |b, rows| {
        Ok(ShardRecordsArgs {
            records_off: b.buffer(5, records)?,
            first: u(params.shape.slice.first),
            records: u(params.records),
            order: order_code(params.order),
            ..ShardRecordsArgs::bound(rows)
        })
    })?;
    device.gpu.run(op, dispatches)
}

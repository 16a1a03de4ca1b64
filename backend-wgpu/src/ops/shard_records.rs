//! `shard_records` (`docs/semantics.md` §5.14, `shaders/shard_records.wgsl`): one workgroup per
//! row, one dispatch per row chunk.

use specula_backend_api::ops::shard_records::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::{bind_rows, order_code};
use super::{row_chunk_dispatches, u};
use crate::WgpuDevice;
use crate::kernels::{Entry, Kernel, KernelFacts, Library, RowHead};

specula_backend_api::kernel_args! {
    /// `shard_records_<dtype>`, after its [`RowHead`]: rows `row0 ..` of the chunk bound at
    /// `input` (logits with their `temperature` when `logits` is 1), ids `first ..` of the
    /// vocabulary, weighed from `row_key` (and `min_p` when `has_min_p`); `records` (`K`)
    /// records each in `order`.
    pub(crate) struct ShardRecordsArgs {
        input_off: u32,
        temperature_off: u32,
        row_key_off: u32,
        min_p_off: u32,
        has_min_p: u32,
        logits: u32,
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
pub(crate) const KERNEL: KernelFacts = KernelFacts {
    libraries: &[Library::Shard, Library::ShardRows],
    float_kernels: &[None],
    args: &[SHARD_RECORDS.args()],
};

/// Records and submits one dispatch per row chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let op = Op::ShardRecords;
    let (inputs, records, params, &kind) = call.parts();
    let shape = params.shape.matrix();
    let kernel = (&SHARD_RECORDS, kind.dtype);
    let matrix = inputs.scores.matrix();
    let dispatches = row_chunk_dispatches(device, op, kernel, matrix, &shape, |b, chunk| {
        let rows = bind_rows(b, inputs, shape.vocab, chunk)?;
        Ok(ShardRecordsArgs {
            input_off: rows.input_off,
            temperature_off: rows.temperature_off,
            row_key_off: rows.row_key_off,
            min_p_off: rows.min_p_off,
            has_min_p: rows.has_min_p,
            logits: rows.logits,
            records_off: b.buffer(5, records)?,
            first: u(params.shape.slice.first),
            records: u(params.records),
            order: order_code(params.order),
        })
    })?;
    device.gpu.run(op, dispatches)
}

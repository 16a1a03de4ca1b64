//! `shard_records` (`docs/semantics.md` §5.14): the first `K` tokens of each row of a slice in key
//! order, as `(key, weight)` records, one block per row (`kernels/shard_records.cu`).

use specula_backend_api::ops::shard_records::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::{RowPointers, order_code};
use super::to_u32;
use crate::args::ShardRecordsArgs;
use crate::device::CudaDevice;
use crate::kernels::{Instance, KernelFile};
use crate::launch::ROW_BLOCK;

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

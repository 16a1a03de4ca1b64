//! `shard_histogram` (`docs/semantics.md` §5.15): the counts and masses of the next 8 key bits
//! within a prefix, for each row of a slice, one block per row (`kernels/shard_histogram.cu`).

use specula_backend_api::ops::shard_histogram::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::RowPointers;
use crate::args::ShardHistogramArgs;
use crate::device::CudaDevice;
use crate::kernels::{Instance, KernelFile};
use crate::launch::ROW_BLOCK;

/// Launches `shard_histogram` over the call's rows.
pub(crate) fn run(device: &CudaDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let op = Op::ShardHistogram;
    let (inputs, out, params, &kind) = call.parts();
    let rows = RowPointers::of(device, op, &inputs.rows, &params.shape)?;
    let args = ShardHistogramArgs {
        scores: rows.scores,
        temperature: rows.temperature,
        row_key: rows.row_key,
        min_p: rows.min_p,
        prefix: device.ptr(op, inputs.prefix)?,
        floors: device.ptr(op, inputs.floor)?,
        counts: device.ptr(op, out.counts)?,
        masses: device.ptr(op, out.masses)?,
        rows: rows.rows,
        len: rows.len,
        first: rows.first,
        shift: params.shift,
        logits: rows.logits,
        vec: rows.vec,
    };
    let instance = Instance::float(kind.dtype, kind.dtype);
    let kernels = device.kernels(KernelFile::ShardHistogram, instance);
    kernels.launch("shard_histogram", (args.rows, 1, 1), ROW_BLOCK, &args)
}

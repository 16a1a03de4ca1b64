//! `shard_histogram` (`docs/semantics.md` §5.15, `shaders/shard_histogram.wgsl`): one workgroup
//! per row, one dispatch per row chunk.

use specula_backend_api::ops::shard_histogram::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::{shard_row_args, shard_row_dispatches};
use super::u;
use crate::WgpuDevice;
use crate::kernels::{Entry, Kernel, KernelFacts, Library, RowHead};

shard_row_args! {
    /// `shard_histogram_<dtype>`, after its [`RowHead`] and the
    /// [`BoundRows`](super::sharded::BoundRows) fields: rows `row0 ..` of the chunk bound at
    /// `input` (logits with their `temperature` when `logits` is 1), ids `first ..` of the
    /// vocabulary, weighed from `row_key` (and `min_p` when `has_min_p`); the buckets of key bits
    /// `[shift, shift + 8)` within `prefix`, from `floor` up.
    pub(crate) struct ShardHistogramArgs {
        prefix_off: u32,
        floor_off: u32,
        counts_off: u32,
        masses_off: u32,
        first: u32,
        shift: u32,
    }
}

/// `shard_histogram_<dtype>`.
const SHARD_HISTOGRAM: Entry<ShardHistogramArgs, RowHead> =
    Entry::new(Kernel::ShardHistogram, None, 0);

/// The facts of `shaders/shard_histogram.wgsl`: the shared files its module is built on, its float
/// kernels and its kernels' argument structs (generated into the module).
pub(crate) const KERNEL: KernelFacts = KernelFacts::rows(
    &[Library::Shard, Library::ShardRows, Library::MassBins],
    &[SHARD_HISTOGRAM.args()],
);

/// Records and submits one dispatch per row chunk.
pub(crate) fn run(device: &WgpuDevice, mut call: OpCall<'_, '_>) -> Result<()> {
    let op = Op::ShardHistogram;
    let (inputs, out, params, &kind) = call.parts();
    let shape = params.shape.matrix();
    let kernel = (&SHARD_HISTOGRAM, kind.dtype);
    let dispatches = shard_row_dispatches(device, op, kernel, &inputs.rows, &shape, |b, rows| {
        Ok(ShardHistogramArgs {
            prefix_off: b.buffer(5, inputs.prefix)?,
            floor_off: b.buffer(6, inputs.floor)?,
            counts_off: b.buffer(7, out.counts)?,
            masses_off: b.buffer(8, out.masses)?,
            first: u(params.shape.slice.first),
            shift: params.shift,
            ..ShardHistogramArgs::bound(rows)
        })
    })?;
    device.gpu.run(op, dispatches)
}

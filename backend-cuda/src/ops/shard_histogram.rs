//! `shard_histogram` (`docs/semantics.md` §5.15): the counts and masses of the next 8 key bits
//! within a prefix, for each row of a slice, one block per row (`kernels/shard_histogram.cu`).

use specula_backend_api::ops::shard_histogram::OpCall;
use specula_backend_api::{Op, Result};

use super::sharded::RowPointers;
use crate::args::{ArgsStruct, cuda_args};
use crate::device::CudaDevice;
use crate::kernels::{Instance, Instances, KernelFacts, KernelFile, Library};
use crate::launch::ROW_BLOCK;

cuda_args! {
    /// The argument block of every entry point of `kernels/shard_histogram.cu`.
    pub(crate) struct ShardHistogramArgs {
        scores: u64 as "const SPECULA_T::raw*", // [rows, len] probabilities or logits
        temperature: u64 as "const float*",     // [rows] (logits rows only)
        row_key: u64 as "const u64*",           // [rows]
        min_p: u64 as "const float*",           // [rows] or null
        prefix: u64 as "const u64*",            // [rows]: key >> (shift + 8) of the counted tokens
        floors: u64 as "const u64*",            // [rows]: the least counted key
        counts: u64 as "u64*",                  // [rows, 256]
        masses: u64 as "u64*",                  // [rows, 256]
        rows: u32, len: u32, first: u32, shift: u32, logits: u32, vec: u32,
    }
}

/// What `kernels/shard_histogram.cu` is built on and for ([`KernelFacts`]).
pub(crate) const KERNEL: KernelFacts = KernelFacts::new(
    &["shard_histogram"],
    Instances::Float,
    &[ArgsStruct::of::<ShardHistogramArgs>()],
)
.on(&[Library::Shard]);

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
